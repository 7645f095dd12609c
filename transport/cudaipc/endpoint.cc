#include "transport/cudaipc/endpoint.h"

#include <string>

#include "transport/endpoint.h"

namespace loom::transport::cudaipc {
namespace {
constexpr uint32_t kEndpointVersion = 1;
constexpr size_t kMaxControlBytes = 256;
}  // namespace

void writeEndpoint(const Descriptor& d, std::vector<uint8_t>* out) {
  EndpointWriter w(out, kEndpointVersion);
  w.put(d.processNonce);
  w.put(d.address);
  w.putBytes(d.handle.data(), d.handle.size());
  w.put(d.slotBytes);
  w.put(d.slots);
  w.putString(std::string_view(reinterpret_cast<const char*>(d.control.data()), d.control.size()));
}

Result<Descriptor> readEndpoint(std::span<const uint8_t> blob) {
  EndpointReader r(blob, "CUDA IPC endpoint");
  LOOM_TRY(r.expectVersion(kEndpointVersion));
  Descriptor d;
  r.get(&d.processNonce);
  r.get(&d.address);
  r.getBytes(d.handle.data(), d.handle.size());
  r.get(&d.slotBytes);
  r.get(&d.slots);
  std::string control;
  r.getString(&control, kMaxControlBytes);
  LOOM_TRY(r.finish());
  d.control.assign(control.begin(), control.end());
  return d;
}

}  // namespace loom::transport::cudaipc
