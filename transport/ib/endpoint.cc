#include "transport/ib/endpoint.h"

#include "transport/endpoint.h"

namespace loom::transport::ib {

void writeEndpoint(const IbEndpoint& e, std::vector<uint8_t>* out) {
  EndpointWriter w(out, kEndpointVersion);
  w.put(uint32_t(e.qpns.size()));
  for (uint32_t q : e.qpns) w.put(q);
  w.put(e.psn);
  w.put(e.lid);
  w.putBytes(e.gid, sizeof e.gid);
  w.put(e.mtu);
  w.put(e.ethernet);
  w.put(e.fifoAddr);
  w.put(e.fifoRkey);
  w.put(e.slots);
  w.put(e.slotStride);
  w.putString(e.device);
}

Result<IbEndpoint> readEndpoint(std::span<const uint8_t> blob, uint32_t slots, uint32_t slotStride) {
  EndpointReader r(blob, "verbs endpoint");
  LOOM_TRY(r.expectVersion(kEndpointVersion));
  IbEndpoint e;
  uint32_t count = 0;
  if (r.get(&count) && count >= 1 && count <= kMaxQps) {
    e.qpns.resize(count);
    for (uint32_t& q : e.qpns) r.get(&q);
  } else if (count != 0) {
    return remoteError("the peer's verbs endpoint has " + std::to_string(count) + " queue pairs (1 .. " +
                       std::to_string(kMaxQps) + " allowed)");
  }
  r.get(&e.psn);
  r.get(&e.lid);
  r.getBytes(e.gid, sizeof e.gid);
  r.get(&e.mtu);
  r.get(&e.ethernet);
  r.get(&e.fifoAddr);
  r.get(&e.fifoRkey);
  r.get(&e.slots);
  r.get(&e.slotStride);
  r.getString(&e.device, 64);
  LOOM_TRY(r.finish());
  if (e.qpns.empty()) return remoteError("the peer's verbs endpoint has no queue pair");
  if (e.psn >= (1u << 24)) return remoteError("the peer's verbs endpoint has a PSN over 24 bits");
  if (e.mtu < 1 || e.mtu > 5) return remoteError("the peer's verbs endpoint has an unknown MTU code " + std::to_string(e.mtu));
  if (e.ethernet > 1) return remoteError("the peer's verbs endpoint has a bad link-layer flag");
  if (e.slots != slots || e.slotStride != slotStride) {
    return remoteError("the peer's verbs FIFO has " + std::to_string(e.slots) + " slots of " +
                       std::to_string(e.slotStride) + " bytes, this rank expects " + std::to_string(slots) + " of " +
                       std::to_string(slotStride) + " (set LOOM_IB_FIFO_BYTES alike on every rank)");
  }
  if (e.fifoAddr == 0) return remoteError("the peer's verbs endpoint has no FIFO address");
  return e;
}

}  // namespace loom::transport::ib
