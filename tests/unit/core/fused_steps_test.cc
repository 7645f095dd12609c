// Fused ring and chain steps (PlanRunner::FusedStep): the plans of all ranks
// run in this thread over real shared-memory connections, where a step that
// receives and sends folds or copies each arriving piece straight into the
// next rank's FIFO (Transfer::source, with its receive held). Results must
// be the simulator's, bit for bit, with and without fusing; the messages sit
// at the largest size the connections allow to fuse, where a ring would
// deadlock if each rank's inbox could not hold two of them; and the fused
// sends must really have happened.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/executor.h"
#include "core/planner.h"
#include "core/simulator.h"
#include "transport/shm/connection.h"

namespace loom::core {
namespace {

using kernels::DataType;
using kernels::RedOp;
using transport::Connection;
using transport::shm::ShmConnection;

struct Case {
  OpKind kind;
  int nranks;
  size_t count;  // elements per rank's part (AllGather, ReduceScatter) or vector
  RedOp op = RedOp::kSum;
  bool inPlace = false;
  size_t sliceBytes = 0;  // 0: the connections' fused-step limit
};

std::string caseName(const Case& c) {
  return std::string(opKindName(c.kind)) + " n=" + std::to_string(c.nranks) + " count=" + std::to_string(c.count) +
         " op=" + kernels::redOpName(c.op) + (c.inPlace ? " in-place" : "");
}

// A ring of connections between neighbours (r, r + 1), rank r's table
// indexed by peer (one channel).
struct Ring {
  std::vector<std::unique_ptr<ShmConnection>> owned;
  std::vector<std::vector<Connection*>> conns;  // [rank][peer]
  std::vector<ShmConnection*> all;
};

Ring makeRing(int n, const ShmConnection::Options& options) {
  Ring ring;
  ring.conns.assign(size_t(n), std::vector<Connection*>(size_t(n), nullptr));
  const int pairs = n == 2 ? 1 : n;
  for (int r = 0; r < pairs; ++r) {
    const int next = (r + 1) % n;
    auto a = ShmConnection::create(next, options);
    auto b = ShmConnection::create(r, options);
    EXPECT_TRUE(a.isOk() && b.isOk());
    if (!a.isOk() || !b.isOk()) return ring;
    EXPECT_TRUE(a.value()->attach(b.value()->local()).isOk());
    EXPECT_TRUE(b.value()->attach(a.value()->local()).isOk());
    ring.conns[size_t(r)][size_t(next)] = a.value().get();
    ring.conns[size_t(next)][size_t(r)] = b.value().get();
    ring.all.push_back(a.value().get());
    ring.all.push_back(b.value().get());
    ring.owned.push_back(std::move(a).value());
    ring.owned.push_back(std::move(b).value());
  }
  return ring;
}

// Element counts of a rank's send and receive buffers.
void sizes(const Case& c, size_t* send, size_t* recv) {
  const size_t n = size_t(c.nranks);
  *send = *recv = c.count;
  if (c.kind == OpKind::kAllGather) *recv = c.count * n;
  if (c.kind == OpKind::kReduceScatter) *send = c.count * n;
}

// Runs `c` over shared memory (fusing where `fused`) and in the simulator on
// the same inputs, and compares every rank's output. Returns the number of
// sends the connections produced (fused).
uint64_t runCase(const Case& c, bool fused) {
  SCOPED_TRACE(caseName(c) + (fused ? " fused" : " unfused"));
  const int n = c.nranks;
  ShmConnection::Options options;
  options.fusedSteps = fused;
  Ring ring = makeRing(n, options);
  if (ring.all.empty()) return 0;
  const size_t limit = ShmConnection::Options{}.fifoBytes / 2 - ring.all[0]->slotBytes();
  EXPECT_EQ(ring.all[0]->fusedStepBytes(), fused ? limit : 0);

  size_t sendElems, recvElems;
  sizes(c, &sendElems, &recvElems);
  const DataType type = c.op == RedOp::kSumPostDiv ? DataType::kFloat32 : DataType::kInt64;
  const size_t es = kernels::dataTypeSize(type);
  OpDesc op;
  op.kind = c.kind;
  op.count = c.count;
  op.type = type;
  op.root = n > 2 ? 2 : 0;
  op.reduction = kernels::Reduction{type, c.op, 0, 1};
  if (c.op == RedOp::kSumPostDiv) op.reduction.divisor = uint64_t(n);
  // A scalar other than 1 shows an input multiplied twice or not at all.
  constexpr int64_t kScalar = 3;
  if (c.op == RedOp::kPreMulSum) std::memcpy(&op.reduction.scalar, &kScalar, sizeof kScalar);

  // Buffers of both runs: [run][rank] send and receive (in place: one).
  std::mt19937_64 rng(uint64_t(n) * 7919 + c.count);
  std::vector<std::vector<std::byte>> send[2], recv[2];
  std::vector<std::vector<std::byte*>> buffers[2];
  std::vector<Plan> plans;
  for (int r = 0; r < n; ++r) {
    std::vector<std::byte> input(std::max(sendElems, c.inPlace ? recvElems : 0) * es);
    for (size_t i = 0; i < input.size() / es; ++i) {
      if (type == DataType::kFloat32) {
        const float v = float(int(rng() % 2001) - 1000) / 64.0f;  // exact in float
        std::memcpy(input.data() + i * es, &v, es);
      } else {
        const int64_t v = int64_t(rng() % 7) - 3;
        std::memcpy(input.data() + i * es, &v, es);
      }
    }
    PlanParams p{r, n, c.sliceBytes ? c.sliceBytes : limit};
    auto plan = planCollective(op, p);
    EXPECT_TRUE(plan.isOk()) << plan.status().message();
    if (!plan.isOk()) return 0;
    plans.push_back(std::move(plan).value());
    for (int run = 0; run < 2; ++run) {
      send[run].push_back(input);
      recv[run].emplace_back(recvElems * es, std::byte{0x5a});
      std::byte* s = send[run].back().data();
      std::byte* d = recv[run].back().data();
      if (c.inPlace) {
        if (c.kind == OpKind::kAllGather) {
          d = s;
          s = d + size_t(r) * c.count * es;
        } else if (c.kind == OpKind::kReduceScatter) {
          d = s + size_t(r) * c.count * es;
        } else {
          d = s;
        }
      }
      buffers[run].push_back({s, d});
    }
  }
  const bool reducing = isReducing(c.kind);
  Status simulated = simulate(plans, buffers[1], op.reduction, reducing);
  EXPECT_TRUE(simulated.isOk()) << simulated.message();

  std::vector<std::unique_ptr<Scratch>> scratch;
  std::vector<std::unique_ptr<PlanRunner>> runners;
  for (int r = 0; r < n; ++r) {
    scratch.push_back(std::make_unique<Scratch>());
    auto runner = PlanRunner::create(&plans[size_t(r)], buffers[0][size_t(r)], op.reduction, reducing,
                                     ring.conns[size_t(r)], scratch.back().get());
    EXPECT_TRUE(runner.isOk()) << runner.status().message();
    if (!runner.isOk()) return 0;
    runners.push_back(std::move(runner).value());
  }
  // All ranks in turn until every one is done; a second without progress
  // anywhere is a deadlock.
  auto idleSince = std::chrono::steady_clock::now();
  for (bool done = false; !done;) {
    done = true;
    bool any = false;
    for (int r = 0; r < n; ++r) {
      bool progressed = false;
      Status s = runners[size_t(r)]->advance(&progressed);
      EXPECT_TRUE(s.isOk()) << "rank " << r << ": " << s.message();
      if (!s.isOk()) return 0;
      any |= progressed;
      done &= runners[size_t(r)]->done();
    }
    if (any) idleSince = std::chrono::steady_clock::now();
    if (std::chrono::steady_clock::now() - idleSince > std::chrono::seconds(1)) {
      ADD_FAILURE() << "no rank moved for a second: deadlock";
      return 0;
    }
  }
  for (int r = 0; r < n; ++r) {
    const std::byte* got = buffers[0][size_t(r)][1];
    const std::byte* want = buffers[1][size_t(r)][1];
    const size_t bytes = (c.kind == OpKind::kReduce && r != op.root) ? 0 : recvElems * es;
    EXPECT_EQ(std::memcmp(got, want, bytes), 0) << "rank " << r << " differs from the simulator";
  }
  uint64_t produced = 0;
  for (ShmConnection* conn : ring.all) produced += conn->producedSends();
  return produced;
}

// Counts that give every rank several slices, the last of them short and
// odd, at the fused-step limit (the default FIFO's: 768 KiB messages).
constexpr size_t kLimitElems = (size_t(768) << 10) / 8;

TEST(FusedSteps, AllReduceRingsMatchTheSimulator) {
  for (int n : {2, 3, 5}) {
    for (bool inPlace : {false, true}) {
      const Case c{OpKind::kAllReduce, n, size_t(n) * kLimitElems * 2 + 13, RedOp::kSum, inPlace};
      EXPECT_GT(runCase(c, true), 0u) << caseName(c) << ": no step was fused";
      EXPECT_EQ(runCase(c, false), 0u);
    }
  }
}

TEST(FusedSteps, ReductionsWithPreAndPostOps) {
  const Case prod{OpKind::kAllReduce, 4, 4 * kLimitElems + 7, RedOp::kProd};
  EXPECT_GT(runCase(prod, true), 0u);
  const Case avg{OpKind::kAllReduce, 3, 3 * kLimitElems * 2 + 5, RedOp::kSumPostDiv, true};
  EXPECT_GT(runCase(avg, true), 0u);
  const Case pre{OpKind::kAllReduce, 3, 3 * kLimitElems + 5, RedOp::kPreMulSum};
  EXPECT_GT(runCase(pre, true), 0u);
}

// Smaller messages: only the steps that keep no result fuse (folds passed
// on), the others go through the user buffer as before.
TEST(FusedSteps, ShortMessagesFuseOnlyWhatTheyPassOn) {
  const Case ring{OpKind::kAllReduce, 4, 4 * 4096 + 3, RedOp::kSum, false, 32 << 10};
  EXPECT_GT(runCase(ring, true), 0u);
  const Case two{OpKind::kAllReduce, 2, 2 * 4096 + 3, RedOp::kSum, false, 32 << 10};
  EXPECT_EQ(runCase(two, true), 0u) << "2 ranks: every step that sends keeps its result";
  const Case tiny{OpKind::kAllReduce, 3, 2, RedOp::kMax, true};
  runCase(tiny, true);
}

TEST(FusedSteps, ReduceScatterAndChains) {
  const Case rs{OpKind::kReduceScatter, 3, kLimitElems * 2 + 9};
  EXPECT_GT(runCase(rs, true), 0u);
  const Case bcast{OpKind::kBroadcast, 4, kLimitElems * 3 + 11};
  EXPECT_GT(runCase(bcast, true), 0u);
  const Case reduce{OpKind::kReduce, 3, kLimitElems * 3 + 11, RedOp::kMin};
  EXPECT_GT(runCase(reduce, true), 0u);
}

// AllGather's own blocks may go single-copy: they arrive whole in the
// receiver's buffer, so its ring is never fused.
TEST(FusedSteps, AllGatherIsNotFused) {
  const Case ag{OpKind::kAllGather, 3, kLimitElems * 2 + 1};
  EXPECT_EQ(runCase(ag, true), 0u);
}

}  // namespace
}  // namespace loom::core
