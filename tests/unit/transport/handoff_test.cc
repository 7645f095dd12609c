// The shm handoff's choice between plain and streamed copies into memory a
// peer reads next (FIFO pieces, board slots), and its copies.
#include "transport/shm/handoff.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace loom::transport::shm {
namespace {

constexpr size_t kProbe = HandoffPolicy::kProbeBytes;
// A probe's time at a given rate (bytes per ns).
double nsAt(double bytesPerNs) { return double(kProbe) / bytesPerNs; }

TEST(HandoffPolicy, TwoSlowProbesInARowStream) {
  HandoffPolicy p;
  ASSERT_TRUE(p.probeNext());  // copying plainly: every copy is timed
  p.observe(kProbe, nsAt(2.5));
  EXPECT_FALSE(p.streaming()) << "one slow copy (a preemption, say) is not enough";
  ASSERT_TRUE(p.probeNext());
  p.observe(kProbe, nsAt(30));
  ASSERT_TRUE(p.probeNext());
  p.observe(kProbe, nsAt(2.5));
  EXPECT_FALSE(p.streaming()) << "a fast copy in between resets the run";
  ASSERT_TRUE(p.probeNext());
  p.observe(kProbe, nsAt(2.5));
  EXPECT_TRUE(p.streaming());
}

TEST(HandoffPolicy, StreamingProbesEveryFewCopiesAndOneFastProbeStops) {
  HandoffPolicy p;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(p.probeNext());
    p.observe(kProbe, nsAt(1));
  }
  ASSERT_TRUE(p.streaming());
  for (int round = 0; round < 3; ++round) {
    for (int i = 1; i < HandoffPolicy::kProbeEvery; ++i) EXPECT_FALSE(p.probeNext()) << round << " " << i;
    ASSERT_TRUE(p.probeNext()) << round;
    p.observe(kProbe, nsAt(3));  // still slow: keeps streaming
    EXPECT_TRUE(p.streaming());
  }
  for (int i = 1; i < HandoffPolicy::kProbeEvery; ++i) EXPECT_FALSE(p.probeNext());
  ASSERT_TRUE(p.probeNext());
  p.observe(kProbe, nsAt(HandoffPolicy::kSlowBytesPerNs * 2));
  EXPECT_FALSE(p.streaming());
  EXPECT_TRUE(p.probeNext());
}

TEST(HandoffPolicy, ShortProbesAreJudgedByTheirRate) {
  HandoffPolicy p;
  const size_t bytes = 8 << 10;  // a board contribution shorter than a full probe
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(p.probeNext());
    p.observe(bytes, double(bytes) / 2.0);  // 2 GB/s
  }
  EXPECT_TRUE(p.streaming());
  for (int i = 1; i < HandoffPolicy::kProbeEvery; ++i) ASSERT_FALSE(p.probeNext());
  ASSERT_TRUE(p.probeNext());
  p.observe(bytes, double(bytes) / 20.0);  // 20 GB/s
  EXPECT_FALSE(p.streaming());
}

TEST(HandoffPolicy, PullsWhileCopiesRunFastButNotEveryOne) {
  HandoffPolicy p;
  int pulls = 0;
  constexpr int kEvery = HandoffPolicy::kPullProbeEvery;
  for (int i = 1; i <= 4 * kEvery; ++i) {
    const bool pull = p.mayPull(kProbe);
    EXPECT_EQ(pull, i % kEvery != 0) << i << ": every kPullProbeEvery-th is copied (and probed)";
    pulls += pull;
  }
  EXPECT_EQ(pulls, 4 * (kEvery - 1));
  p.observe(kProbe, nsAt(1));
  p.observe(kProbe, nsAt(1));
  ASSERT_TRUE(p.streaming());
  for (int i = 0; i < 3 * HandoffPolicy::kProbeEvery; ++i) EXPECT_FALSE(p.mayPull(kProbe)) << "lines cross slowly: copy and stream";
  EXPECT_TRUE(p.mayPull(HandoffPolicy::kMinProbeBytes - 1)) << "never timed, so never held back";
  p.observe(kProbe, nsAt(HandoffPolicy::kSlowBytesPerNs * 2));
  EXPECT_TRUE(p.mayPull(kProbe));
}

// copy() writes exactly the source whichever way it goes: short copies
// (never timed), copies shorter than, equal to and longer than a probe, odd
// lengths and offsets; and again after the policy has been made to stream
// (its probes then time real copies and may turn it back to plain copies).
TEST(HandoffPolicy, CopiesAreExactPlainAndStreamed) {
  const size_t sizes[] = {0, 1, 63, 4095, 8192, 8193, 40000, kProbe, kProbe + 1, 3 * kProbe + 17};
  for (int streamed = 0; streamed < 2; ++streamed) {
    HandoffPolicy p;
    if (streamed) {
      p.observe(kProbe, nsAt(1));
      p.observe(kProbe, nsAt(1));
      ASSERT_TRUE(p.streaming());
    }
    for (size_t bytes : sizes) {
      for (size_t off : {size_t(0), size_t(3)}) {
        std::vector<uint8_t> src(bytes + off), dst(bytes + 2 * off + 64, 0xEE);
        for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + bytes);
        p.copy(dst.data() + off, src.data() + off, bytes);
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(dst[off + i], src[off + i]) << bytes << " " << off << " " << i;
        for (size_t i = 0; i < off; ++i) ASSERT_EQ(dst[i], 0xEE);
        for (size_t i = off + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE);
      }
    }
  }
}

}  // namespace
}  // namespace loom::transport::shm
