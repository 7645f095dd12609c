// How a rank copies data into shared memory that a peer reads next (a FIFO
// piece in the peer's inbox, its contribution in a board slot): through its
// own caches (a plain copy) or past them (streaming stores, kernels/reduce.h's
// copyForPeer), chosen by how fast a plain copy runs right now.
//
// Where the two ranks' cores share a cache, the reader takes each line
// straight out of the writer's cache and a plain copy is the faster
// handoff. Where they do not (another core complex or socket, or a VM whose
// vCPUs the host moves there for minutes at a time), every line the writer
// stores was last read by the peer and may need a slow ownership transfer.
// How slow depends on the machine. On our 2-vCPU EPYC VM a plain copy into
// the peer's inbox ran at 11-45 GB/s in one placement and 2.0-3.5 GB/s in
// the other, and 2-rank AllReduce took, plain against streamed: 16 MiB
// 2.4-2.9 against 2.9-3.5 ms, then 7.0-8.6 against 2.1-3.1 ms. On a 2-vCPU
// Ice Lake VM whose vCPUs sat on cores 140-180 ns apart, plain copies kept
// up (the reader took the lines from the writer's cache as fast as from its
// own) and streaming them to memory made 2-rank AllReduce of 64 KiB on the
// board take 16-19 us instead of 9-11.
//
// HandoffPolicy is the decision: time the first kProbeBytes (or all) of a
// copy done plainly (every copy while copying plainly, every kProbeEvery-th
// while streaming), stream after two slow probes in a row, copy plainly
// again after one fast one. Not thread-safe: one per writer (a connection's
// sending thread, a latency path under its operation lock).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::transport::shm {

class HandoffPolicy {
 public:
  // The longest probe: a copy's first kProbeBytes are timed.
  static constexpr size_t kProbeBytes = size_t(64) << 10;
  static constexpr int kProbeEvery = 8;
  // A plain copy slower than this (bytes per ns = GB/s) is slow: between
  // the placements above, with margin on both sides.
  static constexpr double kSlowBytesPerNs = 6.0;

  // Copies `bytes` (no overlap) the way the policy says, probing as it
  // goes. Copies too short to stream (kernels::handoffStreams) are plain
  // and neither timed nor counted; copies shorter than kMinProbeBytes are
  // not timed (a clock read would weigh too much in them).
  void copy(void* dst, const void* src, size_t bytes);
  static constexpr size_t kMinProbeBytes = size_t(8) << 10;

  // The decision alone (copy() uses these): whether the next eligible copy
  // starts with a timed plain probe (then observe() its time).
  bool probeNext();
  void observe(size_t bytes, double ns);
  // Whether what is not probed is streamed.
  bool streaming() const { return streaming_; }
  // Whether a message the plan lets go single-copy (the receiver reads it
  // from this rank's memory, Transfer::singleCopy) may go so now: not while
  // copies stream (lines cross between the two cores slowly, and a pull
  // takes every line across), and not every kPullProbeEvery-th time
  // either: that message is copied, so that its probe keeps the decision
  // current. A copied message costs 2-3 pulls (2-rank AllGather of 1 MiB in
  // place: 90 against 32 us), so probes among pulls are rarer.
  // A message too short to stream is never refused (its copy is not timed).
  static constexpr int kPullProbeEvery = 32;
  bool mayPull(size_t bytes);

 private:
  // Whether copy() may time a copy of `bytes` (long enough to time, and to
  // stream); mayPull() holds back only such messages.
  static bool timed(size_t bytes);
  bool streaming_ = false;
  int slowRun_ = 0;        // slow probes in a row, up to 2
  uint64_t sinceProbe_ = 0;  // copies streamed since the last probe
  uint64_t pulls_ = 0;       // mayPull() calls while copying plainly
};

}  // namespace loom::transport::shm
