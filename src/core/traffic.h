// Messages and bytes a part of the bootstrap sends and receives: what a
// rank's init costs the network. Tests check that it grows linearly with
// the number of ranks; the init's INFO log prints it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace loom::core {

struct TrafficCounts {
  uint64_t sentMessages = 0, sentBytes = 0, receivedMessages = 0, receivedBytes = 0;
};

class Traffic {
 public:
  void sent(size_t bytes) {
    sentMessages_.fetch_add(1, std::memory_order_relaxed);
    sentBytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void received(size_t bytes) {
    receivedMessages_.fetch_add(1, std::memory_order_relaxed);
    receivedBytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  TrafficCounts counts() const {
    return TrafficCounts{sentMessages_.load(std::memory_order_relaxed), sentBytes_.load(std::memory_order_relaxed),
                         receivedMessages_.load(std::memory_order_relaxed),
                         receivedBytes_.load(std::memory_order_relaxed)};
  }

 private:
  std::atomic<uint64_t> sentMessages_{0}, sentBytes_{0}, receivedMessages_{0}, receivedBytes_{0};
};

// Every rendezvous root of this process, together (core/root.h).
Traffic& rootTraffic();

}  // namespace loom::core
