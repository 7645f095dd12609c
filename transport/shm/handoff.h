// How a rank copies a FIFO piece into its peer's inbox: through its own
// caches (a plain copy) or past them (streaming stores, kernels/reduce.h's
// copyForPeer), chosen by how fast a plain copy runs right now.
//
// Where the two ranks' cores share a cache, the reader takes each line
// straight out of the writer's cache and a plain copy is the faster
// handoff. Where they do not (another core complex or socket, or a VM whose
// vCPUs the host moves there for minutes at a time), every line the writer
// stores was last read by the peer and needs a slow ownership transfer:
// plain copies then crawl and streaming them to memory, from which the
// reader fetches them, is several times faster. On our 2-vCPU EPYC VM a
// plain copy into the peer's inbox ran at 11-45 GB/s in one placement and
// 2.0-3.5 GB/s in the other, and 2-rank AllReduce took, plain against
// streamed: 16 MiB 2.4-2.9 against 2.9-3.5 ms, then 7.0-8.6 against
// 2.1-3.1 ms.
//
// HandoffPolicy is the decision: time the first kProbeBytes of a piece
// copied plainly (every piece while copying plainly, every kProbeEvery-th
// while streaming), stream after two slow probes in a row, copy plainly
// again after one fast one. Not thread-safe: one per connection, used by
// the thread that sends on it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::transport::shm {

class HandoffPolicy {
 public:
  // Pieces shorter than this are copied plainly and never timed.
  static constexpr size_t kProbeBytes = size_t(64) << 10;
  static constexpr int kProbeEvery = 8;
  // A plain copy slower than this (bytes per ns = GB/s) is slow: between
  // the two placements above, with margin on both sides.
  static constexpr double kSlowBytesPerNs = 6.0;

  // Whether the next piece of `bytes` starts with a timed plain copy of
  // kProbeBytes (then observe() its time).
  bool probeNext(size_t bytes);
  void observe(size_t bytes, double ns);
  // Whether what is not probed is streamed.
  bool streaming() const { return streaming_; }

 private:
  bool streaming_ = false;
  int slowRun_ = 0;        // slow probes in a row, up to 2
  uint64_t sinceProbe_ = 0;  // pieces streamed since the last probe
};

}  // namespace loom::transport::shm
