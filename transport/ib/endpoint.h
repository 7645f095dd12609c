// The verbs backend's endpoint (transport/endpoint.h): what the peer needs
// to connect its queue pairs to ours and write into our receive FIFO.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::transport::ib {

inline constexpr uint32_t kEndpointVersion = 1;
inline constexpr uint32_t kMaxQps = 16;

struct IbEndpoint {
  std::vector<uint32_t> qpns;  // one per queue pair, 1 .. kMaxQps
  uint32_t psn = 0;            // first packet sequence number (24 bits)
  uint16_t lid = 0;            // InfiniBand: the port's LID
  uint8_t gid[16] = {};        // RoCE: the GID its packets carry
  uint8_t mtu = 0;             // the port's active MTU (enum ibv_mtu)
  uint8_t ethernet = 0;        // 1: RoCE
  uint64_t fifoAddr = 0;       // the receive FIFO's address and key
  uint32_t fifoRkey = 0;
  uint32_t slots = 0;          // FIFO slots and the bytes of each (header included)
  uint32_t slotStride = 0;
  std::string device;          // "rxe0:1", for messages
};

void writeEndpoint(const IbEndpoint& e, std::vector<uint8_t>* out);
// Every field checked: a count of queue pairs outside 1..kMaxQps, a PSN
// over 24 bits, an MTU that is no ibv_mtu, a FIFO geometry that does not
// match `slots`/`slotStride` is an error.
Result<IbEndpoint> readEndpoint(std::span<const uint8_t> blob, uint32_t slots, uint32_t slotStride);

}  // namespace loom::transport::ib
