// The shm connection's choice between plain and streamed handoff copies.
#include "transport/shm/handoff.h"

#include <gtest/gtest.h>

namespace loom::transport::shm {
namespace {

constexpr size_t kPiece = size_t(512) << 10;
constexpr size_t kProbe = HandoffPolicy::kProbeBytes;
// A probe's time at a given rate (bytes per ns).
double nsAt(double bytesPerNs) { return double(kProbe) / bytesPerNs; }

TEST(HandoffPolicy, SmallPiecesAreNeitherTimedNorStreamed) {
  HandoffPolicy p;
  EXPECT_FALSE(p.probeNext(kProbe - 1));
  EXPECT_FALSE(p.streaming());
}

TEST(HandoffPolicy, TwoSlowProbesInARowStream) {
  HandoffPolicy p;
  ASSERT_TRUE(p.probeNext(kPiece));  // copying plainly: every piece is timed
  p.observe(kProbe, nsAt(2.5));
  EXPECT_FALSE(p.streaming()) << "one slow copy (a preemption, say) is not enough";
  ASSERT_TRUE(p.probeNext(kPiece));
  p.observe(kProbe, nsAt(30));
  ASSERT_TRUE(p.probeNext(kPiece));
  p.observe(kProbe, nsAt(2.5));
  EXPECT_FALSE(p.streaming()) << "a fast copy in between resets the run";
  ASSERT_TRUE(p.probeNext(kPiece));
  p.observe(kProbe, nsAt(2.5));
  EXPECT_TRUE(p.streaming());
}

TEST(HandoffPolicy, StreamingProbesEveryFewPiecesAndOneFastProbeStops) {
  HandoffPolicy p;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(p.probeNext(kPiece));
    p.observe(kProbe, nsAt(1));
  }
  ASSERT_TRUE(p.streaming());
  for (int round = 0; round < 3; ++round) {
    for (int i = 1; i < HandoffPolicy::kProbeEvery; ++i) EXPECT_FALSE(p.probeNext(kPiece)) << round << " " << i;
    ASSERT_TRUE(p.probeNext(kPiece)) << round;
    p.observe(kProbe, nsAt(3));  // still slow: keeps streaming
    EXPECT_TRUE(p.streaming());
  }
  EXPECT_FALSE(p.probeNext(kProbe - 1)) << "small pieces do not count towards the next probe";
  for (int i = 1; i < HandoffPolicy::kProbeEvery; ++i) EXPECT_FALSE(p.probeNext(kPiece));
  ASSERT_TRUE(p.probeNext(kPiece));
  p.observe(kProbe, nsAt(HandoffPolicy::kSlowBytesPerNs * 2));
  EXPECT_FALSE(p.streaming());
  EXPECT_TRUE(p.probeNext(kPiece));
}

}  // namespace
}  // namespace loom::transport::shm
