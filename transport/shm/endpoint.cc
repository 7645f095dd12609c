#include "transport/shm/endpoint.h"

#include "transport/endpoint.h"

namespace loom::transport::shm {
namespace {
constexpr uint32_t kEndpointVersion = 1;
}  // namespace

void writeEndpoint(const ShmDescriptor& d, std::vector<uint8_t>* out) {
  EndpointWriter w(out, kEndpointVersion);
  w.put(d.magic);
  w.put(d.nonce);
  w.put(d.inboxBytes);
  w.put(d.pid);
  w.put(d.memfd);
  w.put(d.wakeFd);
  w.put(d.version);
}

Result<ShmDescriptor> readEndpoint(std::span<const uint8_t> blob) {
  EndpointReader r(blob, "shared-memory endpoint");
  LOOM_TRY(r.expectVersion(kEndpointVersion));
  ShmDescriptor d;
  r.get(&d.magic);
  r.get(&d.nonce);
  r.get(&d.inboxBytes);
  r.get(&d.pid);
  r.get(&d.memfd);
  r.get(&d.wakeFd);
  r.get(&d.version);
  LOOM_TRY(r.finish());
  return d;
}

}  // namespace loom::transport::shm
