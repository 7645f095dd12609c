// Every algorithm, every rank count 1..17, several counts: the plans of all
// ranks run in the simulator (no network) and the results are checked
// element by element against a reference computed here.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/executor.h"
#include "core/planner.h"
#include "core/simulator.h"
#include "topology/schedule.h"

namespace loom::core {
namespace {

using kernels::DataType;
using kernels::RedOp;

struct Case {
  OpKind kind;
  int nranks;
  size_t count;
  RedOp op;
  bool inPlace;
  Algorithm algorithm = Algorithm::kRing;
  int hostRanks = 0;  // > 0: the plans' Plan::hostRanks, else the planner's
};

std::string caseName(const Case& c) {
  return std::string(opKindName(c.kind)) + " n=" + std::to_string(c.nranks) + " count=" +
         std::to_string(c.count) + " op=" + kernels::redOpName(c.op) + (c.inPlace ? " in-place" : "") + " " +
         algorithmName(c.algorithm);
}

int64_t apply(RedOp op, int64_t a, int64_t b) {
  switch (op) {
    case RedOp::kSum: return a + b;
    case RedOp::kPreMulSum: return a + b;  // runCase multiplies the sum by its scalar
    case RedOp::kSumPostDiv: return a + b;  // runCase divides the sum
    case RedOp::kProd: return a * b;
    case RedOp::kMax: return std::max(a, b);
    case RedOp::kMin: return std::min(a, b);
    default: return 0;
  }
}

// Elements per rank's send and receive buffers.
void sizes(const Case& c, size_t* sendElems, size_t* recvElems) {
  const size_t n = size_t(c.nranks);
  switch (c.kind) {
    case OpKind::kAllGather: *sendElems = c.count; *recvElems = c.count * n; break;
    case OpKind::kReduceScatter: *sendElems = c.count * n; *recvElems = c.count; break;
    case OpKind::kAllToAll: *sendElems = *recvElems = c.count * n; break;
    case OpKind::kGather: *sendElems = c.count; *recvElems = c.count * n; break;
    case OpKind::kScatter: *sendElems = c.count * n; *recvElems = c.count; break;
    default: *sendElems = *recvElems = c.count; break;
  }
}

// Input element i of rank r: small values so products stay exact in int64.
int64_t input(int r, size_t i) { return int64_t((r * 7 + i * 3) % 5) - 1; }

void runCase(const Case& c, size_t sliceBytes, int channels = 1,
             std::span<const std::vector<int>> rings = {}, std::span<const int> hostOf = {},
             std::span<const std::vector<int>> trees = {}) {
  SCOPED_TRACE(caseName(c));
  const int n = c.nranks;
  const int root = n > 2 ? 2 : 0;
  size_t sendElems, recvElems;
  sizes(c, &sendElems, &recvElems);
  std::vector<std::vector<int64_t>> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    send[size_t(r)].resize(std::max(sendElems, c.inPlace ? recvElems : size_t(0)) + 1);
    for (size_t i = 0; i < send[size_t(r)].size(); ++i) send[size_t(r)][i] = input(r, i);
    recv[size_t(r)].assign(recvElems + 1, -77);
  }
  std::vector<std::vector<int64_t>> original = send;
  std::vector<Plan> plans;
  std::vector<std::vector<std::byte*>> buffers;
  OpDesc op;
  op.kind = c.kind;
  op.count = c.count;
  op.type = DataType::kInt64;
  op.root = root;
  op.reduction = kernels::Reduction{DataType::kInt64, c.op, 0, 1};
  // Pre-multiplied sends go through staging; a scalar other than 1 shows an
  // input multiplied twice or not at all, a divisor a post op applied twice.
  constexpr int64_t kScalar = 3;
  if (c.op == RedOp::kPreMulSum) std::memcpy(&op.reduction.scalar, &kScalar, sizeof kScalar);
  if (c.op == RedOp::kSumPostDiv) op.reduction.divisor = uint64_t(n);
  for (int r = 0; r < n; ++r) {
    auto* s = reinterpret_cast<std::byte*>(send[size_t(r)].data());
    auto* d = reinterpret_cast<std::byte*>(recv[size_t(r)].data());
    if (c.inPlace) {
      // NCCL's in-place conventions: AllGather sends from its block of the
      // output, ReduceScatter receives into its block of the input.
      if (c.kind == OpKind::kAllGather) { d = s; s = d + size_t(r) * c.count * 8; }
      else if (c.kind == OpKind::kReduceScatter) { d = s + size_t(r) * c.count * 8; }
      else d = s;
    }
    PlanParams p{r, n, sliceBytes};
    p.channels = channels;
    p.rings = rings;
    p.hostOf = hostOf;
    p.trees = trees;
    p.channelMinBytes = 512;  // small vectors spread over channels too
    p.algorithm = c.algorithm;
    bool p2p = c.kind == OpKind::kAllToAll || c.kind == OpKind::kGather || c.kind == OpKind::kScatter;
    auto plan = p2p ? planPointToPoint(std::span<const OpDesc>(&op, 1), p) : planCollective(op, p);
    ASSERT_TRUE(plan.isOk()) << plan.status().message();
    // Single-copy hints: sends of the rank's input only, in collectives
    // whose receivers store what they get as it is.
    for (const Stream& stream : plan->streams)
      for (const Step& step : stream.steps) {
        if (!step.singleCopy) continue;
        ASSERT_FALSE(isReducing(c.kind)) << "rank " << r << " hints a message a peer may fold";
        ASSERT_TRUE(step.sendPeer >= 0 && step.recvPeer < 0 && step.fanIn.empty() && step.local.buf == 0)
            << "rank " << r << ": only a send of the input may go single-copy\n" << dumpPlan(*plan);
      }
    if (c.hostRanks > 0) plan->hostRanks = c.hostRanks;
    plans.push_back(std::move(plan.value()));
    buffers.push_back({s, d});
  }
  Status st = simulate(plans, buffers, op.reduction, isReducing(c.kind));
  ASSERT_TRUE(st.isOk()) << st.message();
  // Expected results; the reduction of element i over all ranks once (a
  // thousand ranks would otherwise redo it per rank).
  std::vector<int64_t> reducedAt;
  if (isReducing(c.kind)) {
    reducedAt.resize(sendElems);
    for (size_t i = 0; i < sendElems; ++i) {
      int64_t acc = original[0][i];
      for (int q = 1; q < n; ++q) acc = apply(c.op, acc, original[size_t(q)][i]);
      if (c.op == RedOp::kPreMulSum) acc *= kScalar;
      if (c.op == RedOp::kSumPostDiv) acc /= n;
      reducedAt[i] = acc;
    }
  }
  for (int r = 0; r < n; ++r) {
    const int64_t* out = c.inPlace ? (c.kind == OpKind::kReduceScatter ? send[size_t(r)].data() + size_t(r) * c.count
                                                                         : send[size_t(r)].data())
                                   : recv[size_t(r)].data();
    auto reduced = [&](size_t i) { return reducedAt[i]; };
    for (size_t i = 0; i < recvElems; ++i) {
      int64_t want = 0;
      bool check = true;
      switch (c.kind) {
        case OpKind::kAllReduce: want = reduced(i); break;
        case OpKind::kReduce: check = r == root; want = reduced(i); break;
        case OpKind::kBroadcast: want = original[size_t(root)][i]; break;
        case OpKind::kAllGather: {
          // In place, rank q's input is its own block of the output buffer.
          size_t q = i / c.count;
          want = original[q][(c.inPlace ? q * c.count : 0) + i % c.count];
          break;
        }
        case OpKind::kReduceScatter: want = reduced(size_t(r) * c.count + i); break;
        case OpKind::kAllToAll: want = original[i / c.count][size_t(r) * c.count + i % c.count]; break;
        case OpKind::kGather: check = r == root; want = original[i / c.count][i % c.count]; break;
        case OpKind::kScatter: want = original[size_t(root)][size_t(r) * c.count + i]; break;
        default: break;
      }
      if (check) {
        ASSERT_EQ(out[i], want) << "rank " << r << " element " << i;
      }
    }
    if (!c.inPlace) {
      ASSERT_EQ(recv[size_t(r)][recvElems], -77) << "rank " << r << " wrote past its output";
    }
  }
}

// AllGather hints its own block's sends single-copy (one per slice in the
// ring, one per peer direct) unless the communicator said not to (its ranks
// have a CPU each); nothing else does.
TEST(PlanSimulator, AllGatherSendsItsInputSingleCopy) {
  auto hinted = [](const Plan& plan) {
    int n = 0;
    for (const Stream& stream : plan.streams)
      for (const Step& step : stream.steps) n += step.singleCopy;
    return n;
  };
  OpDesc op{};
  op.kind = OpKind::kAllGather;
  op.count = 1000;
  op.type = DataType::kFloat32;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kDirect}) {
    PlanParams p{1, 4, 1024};
    p.algorithm = a;
    auto plan = planCollective(op, p);
    ASSERT_TRUE(plan.isOk()) << plan.status().message();
    EXPECT_EQ(hinted(*plan), a == Algorithm::kRing ? 4 : 3) << dumpPlan(*plan);
    p.singleCopy = false;
    plan = planCollective(op, p);
    ASSERT_TRUE(plan.isOk()) << plan.status().message();
    EXPECT_EQ(hinted(*plan), 0) << dumpPlan(*plan);
  }
  PlanParams p{0, 1, 1024};
  EXPECT_EQ(hinted(*planCollective(op, p)), 0) << "a lone rank sends nothing";
  op.kind = OpKind::kAllReduce;
  p = PlanParams{1, 4, 1024};
  EXPECT_EQ(hinted(*planCollective(op, p)), 0);
}

TEST(PlanSimulator, EveryCollectiveEveryRankCount) {
  const OpKind kinds[] = {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter,
                          OpKind::kBroadcast, OpKind::kReduce,    OpKind::kAllToAll,
                          OpKind::kGather,    OpKind::kScatter};
  const size_t counts[] = {0, 1, 7, 64, 1000, 4099};
  for (OpKind kind : kinds)
    for (int n = 1; n <= 17; ++n)
      for (size_t count : counts)
        for (bool inPlace : {false, true}) {
          // In-place AllToAll: each block is sent from and received into
          // the same place (receives land in a slot until the send is done).
          if (inPlace && (kind == OpKind::kGather || kind == OpKind::kScatter)) continue;
          // A small slice size forces many pipelined slices.
          runCase(Case{kind, n, count, RedOp::kSum, inPlace}, 256);
          if (HasFatalFailure()) return;
        }
}

// The one-shot algorithms, the same way, for 1..33 ranks.
TEST(PlanSimulator, DirectEveryCollectiveEveryRankCount) {
  const OpKind kinds[] = {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kBroadcast,
                          OpKind::kReduce};
  for (OpKind kind : kinds)
    for (int n = 1; n <= 33; ++n)
      for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000)})
        for (bool inPlace : {false, true}) {
          runCase(Case{kind, n, count, RedOp::kSum, inPlace, Algorithm::kDirect}, 256, n % 3 == 0 ? 2 : 1);
          if (HasFatalFailure()) return;
        }
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kReduce})
    for (RedOp op : {RedOp::kProd, RedOp::kMax, RedOp::kMin})
      for (int n : {2, 3, 8}) {
        runCase(Case{kind, n, 33, op, n == 3, Algorithm::kDirect}, 128);
        if (HasFatalFailure()) return;
      }
}

// Two-shot AllReduce, every rank count 1..33 and slices; direct
// ReduceScatter and Reduce with many slices.
TEST(PlanSimulator, TwoShotAndSlicedDirect) {
  for (int n = 1; n <= 33; ++n)
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099)})
      for (bool inPlace : {false, true}) {
        runCase(Case{OpKind::kAllReduce, n, count, RedOp::kSum, inPlace, Algorithm::kTwoShot}, 256, n % 4 == 0 ? 3 : 1);
        if (HasFatalFailure()) return;
      }
  // PreMulSum stages every send: a slice's sends and its fold's receives
  // must all find slots (a rendezvous transport completes a send only when
  // the receiver posted).
  for (int n : {2, 4, 8, 32})
    for (size_t count : {size_t(100), size_t(5000)}) {
      runCase(Case{OpKind::kAllReduce, n, count, RedOp::kPreMulSum, false, Algorithm::kTwoShot}, 64 * 1024);
      runCase(Case{OpKind::kAllReduce, n, count, RedOp::kPreMulSum, true, Algorithm::kDirect}, 64 * 1024);
      if (HasFatalFailure()) return;
    }
  for (OpKind kind : {OpKind::kReduceScatter, OpKind::kReduce})
    for (int n : {2, 3, 7})
      for (RedOp op : {RedOp::kSum, RedOp::kMax})
        for (bool inPlace : {false, true}) {
          runCase(Case{kind, n, 4099, op, inPlace, Algorithm::kDirect}, 128);
          if (HasFatalFailure()) return;
        }
}

// The tree algorithms (one tree; two mirrored trees on two channels):
// AllReduce, Broadcast and Reduce, every rank count 1..33, many slices,
// every op.
TEST(PlanSimulator, TreeAlgorithms) {
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kReduce})
    for (int n = 1; n <= 33; ++n)
      for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099)})
        for (bool inPlace : {false, true}) {
          runCase(Case{kind, n, count, RedOp::kSum, inPlace, Algorithm::kTree}, 256, n % 2 == 0 ? 2 : 1);
          if (HasFatalFailure()) return;
        }
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kReduce})
    for (RedOp op : {RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv})
      for (int n : {2, 3, 6, 13}) {
        runCase(Case{kind, n, 4099, op, n == 3, Algorithm::kTree}, 1024, n == 6 ? 2 : 1);
        if (HasFatalFailure()) return;
      }
}

// Across hosts the tree algorithms run on the topology's two trees
// (PlanParams::trees): H hosts x R ranks, in blocks or interleaved, every
// kind, one and two channels. Every message goes along an edge of the tree
// its channel follows (hung from a Broadcast's or Reduce's root, the same
// edges), so a host boundary is crossed only where the tree crosses it, and
// every element comes out right.
TEST(PlanSimulator, TreesAcrossHostsAreTheTopologys) {
  for (int H : {2, 3, 4, 5, 7})
    for (int R : {1, 2, 3}) {
      for (bool interleaved : {false, true}) {
        const int n = H * R;
        topology::Layout layout;
        layout.hosts.resize(size_t(H));
        std::vector<int> hostOf;
        for (int r = 0; r < n; ++r) {
          hostOf.push_back(interleaved ? r % H : r / R);
          layout.ranks.push_back(topology::cpuRank(hostOf.back(), 0));
        }
        const topology::Schedule schedule = topology::buildSchedule(layout);
        ASSERT_TRUE(topology::checkSchedule(layout, schedule).isOk());
        const std::vector<std::vector<int>> rings = topology::ringOrders(schedule);
        const std::vector<std::vector<int>> trees = topology::treeParents(schedule);
        SCOPED_TRACE("hosts " + std::to_string(H) + " x " + std::to_string(R) + (interleaved ? " interleaved" : ""));
        for (OpKind kind : {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kReduce})
          for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(4099)})
            for (int channels : {1, 2}) {
              runCase(Case{kind, n, count, RedOp::kSum, count == 7, Algorithm::kTree}, 256, channels, rings, hostOf,
                      trees);
              if (HasFatalFailure()) return;
              OpDesc op;
              op.kind = kind;
              op.count = count;
              op.type = DataType::kInt64;
              op.root = n > 2 ? 2 : 0;
              op.reduction = kernels::Reduction{DataType::kInt64, RedOp::kSum, 0, 1};
              for (int r = 0; r < n; ++r) {
                PlanParams p{r, n, 256};
                p.channels = channels;
                p.channelMinBytes = 512;
                p.rings = rings;
                p.hostOf = hostOf;
                p.trees = trees;
                p.algorithm = Algorithm::kTree;
                auto plan = planCollective(op, p);
                ASSERT_TRUE(plan.isOk()) << plan.status().message();
                for (const Stream& stream : plan.value().streams)
                  for (const Step& step : stream.steps)
                    step.forEachPeer([&](int peer) {
                      const auto& parent = trees[size_t(stream.channel) % trees.size()];
                      EXPECT_TRUE(parent[size_t(r)] == peer || parent[size_t(peer)] == r)
                          << "rank " << r << " talks to rank " << peer << " on channel " << stream.channel
                          << ", not a neighbour in tree " << stream.channel % 2;
                    });
              }
              if (HasFailure()) return;
            }
      }
    }
}

// Links that are not one tree over the ranks (two roots, a cycle, a rank
// out of range) are not followed: the heaps are, and results stay right.
TEST(PlanSimulator, MalformedTreesFallBackToHeaps) {
  const std::vector<std::vector<int>> bad[] = {{{-1, -1, 0, 1, 2, 3}},  // two roots
                                              {{1, 2, 0, 0, 1, 2}},    // no root: a cycle
                                              {{-1, 0, 9, 1, 2, 3}},   // a parent out of range
                                              {{-1, 0, 1}}};           // too few ranks
  for (const auto& trees : bad)
    for (OpKind kind : {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kReduce}) {
      runCase(Case{kind, 6, 1000, RedOp::kSum, false, Algorithm::kTree}, 256, 1, {}, {}, trees);
      if (HasFatalFailure()) return;
    }
}

// Recursive-doubling AllReduce: powers of two and the ranks beyond them,
// every rank count 1..33, one and two channels, every op (pre-multiplied
// sums multiply each input once; the later rounds fold partial results).
TEST(PlanSimulator, RecursiveDoublingAllReduce) {
  for (int n = 1; n <= 33; ++n)
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099)})
      for (bool inPlace : {false, true}) {
        runCase(Case{OpKind::kAllReduce, n, count, RedOp::kSum, inPlace, Algorithm::kDoubling}, 256,
                n % 2 == 0 ? 2 : 1);
        if (HasFatalFailure()) return;
      }
  for (RedOp op : {RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv})
    for (int n : {2, 3, 4, 6, 13}) {
      runCase(Case{OpKind::kAllReduce, n, 4099, op, n == 3, Algorithm::kDoubling}, 1024, n == 6 ? 2 : 1);
      if (HasFatalFailure()) return;
    }
}

// Halving-doubling (Rabenseifner) AllReduce: every rank count 1..33 (the
// ranks beyond a power of two stand aside), vectors shorter than the rank
// count (empty halves), slices (4099 floats over 1 KiB slices), every op.
TEST(PlanSimulator, HalvingDoublingAllReduce) {
  for (int n = 1; n <= 33; ++n)
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099)})
      for (bool inPlace : {false, true}) {
        runCase(Case{OpKind::kAllReduce, n, count, RedOp::kSum, inPlace, Algorithm::kHalving}, 256,
                n % 2 == 0 ? 2 : 1);
        if (HasFatalFailure()) return;
      }
  for (RedOp op : {RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv})
    for (int n : {2, 3, 4, 6, 8, 13}) {
      runCase(Case{OpKind::kAllReduce, n, 4099, op, n == 3, Algorithm::kHalving}, 1024, n == 6 ? 2 : 1);
      if (HasFatalFailure()) return;
    }
}

// Hierarchical AllReduce: H hosts x R ranks (hosts interleaved or in
// blocks, so a host's ranks are not always consecutive), counts shorter
// than a host's ranks, slices, one and two channels, every op; a layout
// with unequal hosts falls back to the ring.
TEST(PlanSimulator, HierarchicalAllReduce) {
  for (int H : {2, 3, 4, 5})
    for (int R : {1, 2, 3, 4}) {
      const int n = H * R;
      for (bool interleaved : {false, true}) {
        std::vector<int> hostOf;
        for (int r = 0; r < n; ++r) hostOf.push_back(interleaved ? r % H : r / R);
        for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099)})
          for (bool inPlace : {false, true}) {
            SCOPED_TRACE("hosts " + std::to_string(H) + " x " + std::to_string(R) + (interleaved ? " interleaved" : ""));
            runCase(Case{OpKind::kAllReduce, n, count, RedOp::kSum, inPlace, Algorithm::kHierarchical}, 256,
                    n % 2 == 0 ? 2 : 1, {}, hostOf);
            if (HasFatalFailure()) return;
          }
        for (RedOp op : {RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv}) {
          runCase(Case{OpKind::kAllReduce, n, 4099, op, R == 3, Algorithm::kHierarchical}, 1024, 1, {}, hostOf);
          if (HasFatalFailure()) return;
        }
      }
    }
  const std::vector<int> uneven = {0, 0, 0, 1, 1};
  runCase(Case{OpKind::kAllReduce, 5, 1000, RedOp::kSum, false, Algorithm::kHierarchical}, 256, 1, {}, uneven);
}

// Pre-multiplied sends with no fan-in after them (tree leaves, Reduce's
// senders) over more slices than a stream has staging slots: each waits for
// the ones before it instead of the plan being refused.
TEST(PlanSimulator, ManyPreMultipliedSendsWithoutAFanIn) {
  for (Algorithm a : {Algorithm::kTree, Algorithm::kDirect, Algorithm::kRing})
    for (OpKind kind : {OpKind::kAllReduce, OpKind::kReduce}) {
      if (a == Algorithm::kDirect && kind == OpKind::kAllReduce) continue;  // sends whole
      runCase(Case{kind, 5, 4099, RedOp::kPreMulSum, false, a}, 256);  // 129 slices
      if (HasFatalFailure()) return;
    }
}

// A one-shot fold is the left fold in rank order on every rank: the same
// bits everywhere, equal to the sequential sum, for floats whose sums
// depend on the order.
TEST(PlanSimulator, DirectFoldsInRankOrder) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1e4f, 1e4f);
  for (int n : {2, 3, 5, 9}) {
    const size_t count = 257;
    std::vector<std::vector<float>> send(static_cast<size_t>(n), std::vector<float>(count));
    std::vector<std::vector<float>> recv = send;
    for (auto& v : send)
      for (float& x : v) x = value(rng) * (rng() % 2 ? 1e-3f : 1.0f);
    OpDesc op;
    op.kind = OpKind::kAllReduce;
    op.count = count;
    op.type = DataType::kFloat32;
    op.reduction = kernels::Reduction{DataType::kFloat32, RedOp::kSum, 0, 1};
    std::vector<Plan> plans;
    std::vector<std::vector<std::byte*>> buffers;
    for (int r = 0; r < n; ++r) {
      PlanParams p{r, n, 1024};
      p.algorithm = Algorithm::kDirect;
      plans.push_back(planCollective(op, p).value());
      buffers.push_back({reinterpret_cast<std::byte*>(send[size_t(r)].data()),
                         reinterpret_cast<std::byte*>(recv[size_t(r)].data())});
    }
    ASSERT_TRUE(simulate(plans, buffers, op.reduction, true).isOk());
    for (size_t i = 0; i < count; ++i) {
      float want = send[0][i];
      for (int q = 1; q < n; ++q) want += send[size_t(q)][i];
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(std::memcmp(&recv[size_t(r)][i], &want, sizeof want), 0) << "n=" << n << " rank " << r << " element " << i;
    }
  }
}

TEST(PlanSimulator, EveryOpOnReducingCollectives) {
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kReduce})
    for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin})
      for (int n : {1, 2, 3, 5, 8})
        for (size_t count : {size_t(1), size_t(33), size_t(513)}) {
          runCase(Case{kind, n, count, op, false}, 128);
          if (HasFatalFailure()) return;
        }
}

TEST(PlanSimulator, LargeSlicesAndOddCounts) {
  for (int n : {2, 3, 4, 7})
    for (size_t count : {size_t(12345), size_t(100003)}) {
      runCase(Case{OpKind::kAllReduce, n, count, RedOp::kSum, true}, 64 * 1024);
      runCase(Case{OpKind::kAllGather, n, count, RedOp::kSum, false}, 64 * 1024);
      if (HasFatalFailure()) return;
    }
}

// An operation that writes more of the user's buffers than
// LOOM_CPU_STREAMING_BYTES, with buffers too big for the cache, writes its
// results with streaming stores (the executor's outConfig_): the results
// are the same, in place or not, with a pre-multiply, at odd counts. The
// plans say a million ranks share the host, so that 8 MiB outgrow any
// cache.
TEST(PlanSimulator, OperationsLargerThanTheCachesStreamTheirOutputs) {
  const size_t count = (size_t(1) << 20) + 3;  // 8 MiB of int64 and a ragged tail
  const kernels::CpuKernelConfig& config = kernels::defaultCpuKernelConfig();
  constexpr int kHostRanks = 1 << 20;
  if (!streamsResults(count * sizeof(int64_t), count * sizeof(int64_t), kHostRanks, config))
    GTEST_SKIP() << "LOOM_CPU_STREAMING_BYTES is 0 or above this test's 8 MiB: nothing would stream";
  for (int n : {2, 3}) {
    for (bool inPlace : {false, true}) {
      for (RedOp op : {RedOp::kSum, RedOp::kPreMulSum})
        runCase(Case{OpKind::kAllReduce, n, count, op, inPlace, Algorithm::kRing, kHostRanks}, 512 * 1024);
      runCase(Case{OpKind::kBroadcast, n, count, RedOp::kSum, inPlace, Algorithm::kRing, kHostRanks}, 512 * 1024);
      runCase(Case{OpKind::kAllGather, n, count / size_t(n), RedOp::kSum, inPlace, Algorithm::kRing, kHostRanks},
              512 * 1024);
      if (HasFatalFailure()) return;
    }
  }
}

// Streaming stores only for operations that write enough of the user's
// buffers and whose buffers, with those of the host's other ranks,
// outgrow a quarter of the shared cache; everything big enough where the
// cache is unknown.
TEST(PlanSimulator, StreamingWaitsForBuffersBeyondTheCache) {
  kernels::CpuKernelConfig config;
  config.streamingMinBytes = size_t(8) << 20;
  config.cacheBytes = size_t(480) << 20;
  const size_t mib = size_t(1) << 20;
  EXPECT_FALSE(streamsResults(4 * mib, 1024 * mib, 8, config)) << "under LOOM_CPU_STREAMING_BYTES";
  EXPECT_FALSE(streamsResults(16 * mib, 16 * mib, 2, config)) << "in place, 2 ranks: 32 of 480 MiB";
  EXPECT_FALSE(streamsResults(16 * mib, 32 * mib, 2, config)) << "out of place, 2 ranks: 64 of 480 MiB";
  EXPECT_TRUE(streamsResults(16 * mib, 32 * mib, 4, config)) << "out of place, 4 ranks: 128 of 480 MiB";
  EXPECT_TRUE(streamsResults(64 * mib, 128 * mib, 2, config)) << "out of place, 2 ranks: 256 of 480 MiB";
  EXPECT_FALSE(streamsResults(16 * mib, 32 * mib, 0, config)) << "no host count: the rank alone";
  config.cacheBytes = 0;
  EXPECT_TRUE(streamsResults(16 * mib, 16 * mib, 1, config)) << "cache unknown";
  EXPECT_FALSE(streamsResults(4 * mib, 4 * mib, 1, config)) << "cache unknown, under the minimum";
}

// Channels: an elementwise collective is split into contiguous parts, each
// run on its own channel's connections; the others keep one channel.
TEST(PlanSimulator, ChannelsSplitElementwiseCollectives) {
  for (OpKind kind : {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kReduce, OpKind::kAllGather,
                      OpKind::kReduceScatter})
    for (int n : {2, 3, 5})
      for (size_t count : {size_t(0), size_t(1), size_t(1000), size_t(100003)})
        for (int channels : {2, 3, 4}) {
          runCase(Case{kind, n, count, RedOp::kSum, count % 2 == 1}, 1024, channels);
          if (HasFatalFailure()) return;
        }
}

// Rings from the topology's schedule: any permutation of the ranks, a
// different one per channel, roots anywhere on them.
TEST(PlanSimulator, RingsInScheduleOrder) {
  std::mt19937 rng(7);
  const OpKind kinds[] = {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kBroadcast,
                          OpKind::kReduce};
  for (int n = 1; n <= 12; ++n) {
    std::vector<std::vector<int>> rings(3);
    for (auto& ring : rings) {
      ring.resize(size_t(n));
      std::iota(ring.begin(), ring.end(), 0);
      std::shuffle(ring.begin(), ring.end(), rng);
    }
    for (OpKind kind : kinds)
      for (size_t count : {size_t(0), size_t(1), size_t(37), size_t(4099)})
        for (int channels : {1, 3}) {
          runCase(Case{kind, n, count, RedOp::kSum, count % 2 == 1}, 256, channels, rings);
          if (HasFatalFailure()) return;
        }
  }
}

// Scale on paper: 1,024 ranks on 128 hosts of 8 ranks with two NICs each,
// so two rings that enter and leave every host once (checkSchedule): every
// collective's plans for all the ranks run in the simulator, on both rings
// as channels, and every element comes out right.
TEST(PlanSimulator, ThousandRanksOn128Hosts) {
  topology::Layout layout;
  for (int h = 0; h < 128; ++h) {
    topology::HostPlace host;
    host.name = "host" + std::to_string(h);
    host.nics = {topology::NicPlace{"eth0", 100000, 0, {}}, topology::NicPlace{"eth1", 100000, 1, {}}};
    layout.hosts.push_back(host);
    for (int i = 0; i < 8; ++i) layout.ranks.push_back(topology::cpuRank(h, i % 2));
  }
  const topology::Schedule schedule = topology::buildSchedule(layout);
  ASSERT_TRUE(topology::checkSchedule(layout, schedule).isOk()) << topology::checkSchedule(layout, schedule).message();
  ASSERT_EQ(schedule.rings.size(), 2u);
  const std::vector<std::vector<int>> rings = topology::ringOrders(schedule);
  const int n = int(layout.ranks.size());
  // Counts keep the buffers of all ranks small (an AllGather's output is
  // n times its input on every rank).
  const std::pair<OpKind, size_t> cases[] = {{OpKind::kAllReduce, 2051}, {OpKind::kReduceScatter, 3},
                                             {OpKind::kAllGather, 3},    {OpKind::kBroadcast, 2051},
                                             {OpKind::kReduce, 2051},    {OpKind::kAllToAll, 1},
                                             {OpKind::kGather, 2},       {OpKind::kScatter, 2}};
  for (const auto& [kind, count] : cases) {
    const auto start = std::chrono::steady_clock::now();
    runCase(Case{kind, n, count, RedOp::kSum, false}, 1024, 2, rings);
    if (HasFatalFailure()) return;
    std::printf("%d ranks on 128 hosts: %s of %zu elements simulated in %.2f s\n", n, opKindName(kind), count,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

TEST(PlanSimulator, RingOrderSetsThePeers) {
  std::vector<std::vector<int>> rings{{0, 2, 1, 3}};
  OpDesc op;
  op.kind = OpKind::kAllReduce;
  op.count = 1024;
  op.type = DataType::kFloat32;
  op.reduction = kernels::Reduction{DataType::kFloat32, RedOp::kSum, 0, 1};
  PlanParams p{2, 4, 512 * 1024};
  p.rings = rings;
  auto plan = planCollective(op, p);
  ASSERT_TRUE(plan.isOk());
  for (const Step& st : plan->streams[0].steps) {
    if (st.sendPeer >= 0) {
      EXPECT_EQ(st.sendPeer, 1);
    }
    if (st.recvPeer >= 0) {
      EXPECT_EQ(st.recvPeer, 0);
    }
  }
}

TEST(PlanSimulator, ChannelCountFollowsSizeAndKind) {
  auto channelsUsed = [](OpKind kind, size_t count, int channels) {
    OpDesc op;
    op.kind = kind;
    op.count = count;
    op.type = DataType::kFloat32;
    op.reduction = kernels::Reduction{DataType::kFloat32, RedOp::kSum, 0, 1};
    PlanParams p{0, 4, 512 * 1024};
    p.channels = channels;
    auto plan = planCollective(op, p);
    EXPECT_TRUE(plan.isOk());
    int used = 0;
    for (const Stream& st : plan->streams) used = std::max(used, st.channel + 1);
    return used;
  };
  EXPECT_EQ(channelsUsed(OpKind::kAllReduce, size_t(1) << 20, 1), 1);
  EXPECT_EQ(channelsUsed(OpKind::kAllReduce, size_t(1) << 20, 4), 4);     // 4 MiB: 1 MiB per channel
  EXPECT_EQ(channelsUsed(OpKind::kAllReduce, 3 * 65536, 4), 3);           // 768 KiB: 256 KiB per channel at least
  EXPECT_EQ(channelsUsed(OpKind::kAllReduce, 1024, 4), 1);                // small: one channel
  EXPECT_EQ(channelsUsed(OpKind::kBroadcast, size_t(1) << 20, 2), 2);
  EXPECT_EQ(channelsUsed(OpKind::kAllGather, size_t(1) << 20, 4), 1);     // not elementwise
}

TEST(PlanSimulator, GroupedSendRecvAnyPattern) {
  // Every rank sends a different amount to every rank (itself included),
  // all calls in one group, in a shuffled order per rank.
  const int n = 5;
  std::mt19937 rng(42);
  auto amount = [](int from, int to) { return size_t(from * 31 + to * 17) % 50 + (from == to ? 1 : 0); };
  std::vector<std::vector<std::vector<int64_t>>> sendb(n), recvb(n);
  std::vector<Plan> plans;
  std::vector<std::vector<std::byte*>> buffers(n);
  for (int r = 0; r < n; ++r) {
    std::vector<OpDesc> ops;
    std::vector<int> order(size_t(2 * n));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    sendb[size_t(r)].resize(size_t(n));
    recvb[size_t(r)].resize(size_t(n));
    for (int k : order) {
      int q = k % n;
      OpDesc op;
      op.type = DataType::kInt64;
      op.root = q;
      if (k < n) {
        auto& b = sendb[size_t(r)][size_t(q)];
        b.resize(amount(r, q));
        for (size_t i = 0; i < b.size(); ++i) b[i] = r * 1000 + q * 100 + int64_t(i);
        op.kind = OpKind::kSend;
        op.count = b.size();
        buffers[size_t(r)].push_back(reinterpret_cast<std::byte*>(b.data()));
        buffers[size_t(r)].push_back(nullptr);
      } else {
        auto& b = recvb[size_t(r)][size_t(q)];
        b.assign(amount(q, r), -1);
        op.kind = OpKind::kRecv;
        op.count = b.size();
        buffers[size_t(r)].push_back(nullptr);
        buffers[size_t(r)].push_back(reinterpret_cast<std::byte*>(b.data()));
      }
      ops.push_back(op);
    }
    auto plan = planPointToPoint(ops, PlanParams{r, n, 64});
    ASSERT_TRUE(plan.isOk());
    plans.push_back(std::move(plan.value()));
  }
  Status st = simulate(plans, buffers, kernels::Reduction{DataType::kUint8, RedOp::kSum, 0, 1}, false);
  ASSERT_TRUE(st.isOk()) << st.message();
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < amount(q, r); ++i)
        ASSERT_EQ(recvb[size_t(r)][size_t(q)][i], q * 1000 + r * 100 + int64_t(i));
}

TEST(PlanSimulator, MismatchedSizesAreReported) {
  OpDesc a;
  a.kind = OpKind::kSend;
  a.type = DataType::kInt64;
  a.count = 10;
  a.root = 1;
  OpDesc b = a;
  b.kind = OpKind::kRecv;
  b.count = 11;
  b.root = 0;
  std::vector<int64_t> x(11);
  auto p0 = planPointToPoint(std::span<const OpDesc>(&a, 1), PlanParams{0, 2, 1024});
  auto p1 = planPointToPoint(std::span<const OpDesc>(&b, 1), PlanParams{1, 2, 1024});
  std::vector<Plan> plans{p0.value(), p1.value()};
  std::vector<std::vector<std::byte*>> bufs{{reinterpret_cast<std::byte*>(x.data()), nullptr},
                                            {nullptr, reinterpret_cast<std::byte*>(x.data())}};
  Status st = simulate(plans, bufs, kernels::Reduction{DataType::kUint8, RedOp::kSum, 0, 1}, false);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("80 bytes"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace loom::core

namespace loom::core {
namespace {

// Staging memory: none for plans that only move data (AllToAll at 1024
// ranks used to reserve 4 slots of every step's size per stream, about
// 4 GiB), some for reducing plans.
TEST(Executor, StagingOnlyWhereStepsNeedIt) {
  const size_t count = 1 << 20;
  OpDesc a2a;
  a2a.kind = OpKind::kAllToAll;
  a2a.count = count;
  a2a.type = DataType::kFloat32;
  a2a.sendbuf = reinterpret_cast<void*>(0x1000);
  a2a.recvbuf = reinterpret_cast<void*>(0x2000);
  auto p2p = planPointToPoint(std::span<const OpDesc>(&a2a, 1), PlanParams{5, 1024, 512 * 1024});
  ASSERT_TRUE(p2p.isOk()) << p2p.status().toString();
  kernels::Reduction copy{};
  copy.type = DataType::kUint8;
  EXPECT_EQ(PlanRunner::stagingBytes(*p2p, copy, false), 0u);

  OpDesc ag = a2a;
  ag.kind = OpKind::kAllGather;
  auto gather = planCollective(ag, PlanParams{1, 8, 512 * 1024});
  ASSERT_TRUE(gather.isOk());
  EXPECT_EQ(PlanRunner::stagingBytes(*gather, copy, false), 0u);

  OpDesc ar = a2a;
  ar.kind = OpKind::kAllReduce;
  ar.reduction.type = DataType::kFloat32;
  ar.reduction.op = RedOp::kSum;
  auto reduce = planCollective(ar, PlanParams{1, 8, 512 * 1024});
  ASSERT_TRUE(reduce.isOk());
  const size_t staging = PlanRunner::stagingBytes(*reduce, ar.reduction, true);
  EXPECT_GT(staging, 0u);
  EXPECT_LE(staging, size_t(4) * 512 * 1024 * reduce->streams.size());
}

// An allocation the machine cannot give is an error naming the size, not
// a null pointer the executor would offset.
TEST(Executor, StagingAllocationFailureIsASystemError) {
  Scratch scratch;
  const size_t huge = size_t(1) << 62;
  auto mem = scratch.get(huge);
  ASSERT_FALSE(mem.isOk());
  EXPECT_EQ(mem.status().code(), Code::kSystemError);
  EXPECT_NE(mem.status().message().find(std::to_string(huge)), std::string::npos) << mem.status().message();
  auto small = scratch.get(4096);
  ASSERT_TRUE(small.isOk());
  EXPECT_NE(*small, nullptr);
}

}  // namespace
}  // namespace loom::core
