// The algorithm choice (core/tuning.h): NCCL_ALGO's syntax, what each
// algorithm can run, and the cost model's picks at both ends of the sizes.
#include <gtest/gtest.h>

#include "core/tuning.h"

namespace loom::core {
namespace {

AlgoFilter parse(const char* text, std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> local;
  return AlgoFilter::parse(text, warnings ? warnings : &local);
}

TEST(AlgoFilter, EmptyAllowsEverything) {
  const AlgoFilter f = parse("");
  for (OpKind k : {OpKind::kAllReduce, OpKind::kBroadcast, OpKind::kReduceScatter})
    for (Algorithm a : {Algorithm::kRing, Algorithm::kDirect}) EXPECT_TRUE(f.allows(k, a));
}

TEST(AlgoFilter, ListsExclusionsAndSections) {
  AlgoFilter f = parse("Ring");
  EXPECT_TRUE(f.allows(OpKind::kAllReduce, Algorithm::kRing));
  EXPECT_FALSE(f.allows(OpKind::kAllReduce, Algorithm::kDirect));
  f = parse("^direct");
  EXPECT_TRUE(f.allows(OpKind::kAllGather, Algorithm::kRing));
  EXPECT_FALSE(f.allows(OpKind::kAllGather, Algorithm::kDirect));
  f = parse("allreduce:direct; broadcast:ring");
  EXPECT_FALSE(f.allows(OpKind::kAllReduce, Algorithm::kRing));
  EXPECT_TRUE(f.allows(OpKind::kAllReduce, Algorithm::kDirect));
  EXPECT_FALSE(f.allows(OpKind::kBroadcast, Algorithm::kDirect));
  EXPECT_TRUE(f.allows(OpKind::kReduce, Algorithm::kDirect));  // untouched
  f = parse("CHAIN,Direct");
  EXPECT_TRUE(f.allows(OpKind::kReduce, Algorithm::kRing));
  EXPECT_TRUE(f.allows(OpKind::kReduce, Algorithm::kDirect));
  EXPECT_FALSE(f.allows(OpKind::kSend, Algorithm::kRing));  // no algorithms for point-to-point
}

TEST(AlgoFilter, ForeignAndUnknownNamesWarnAndKeepSomething) {
  std::vector<std::string> warnings;
  AlgoFilter f = parse("NVLS", &warnings);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("no nvls"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("allreduce, allgather"), std::string::npos) << warnings[1];
  EXPECT_TRUE(f.allows(OpKind::kAllReduce, Algorithm::kRing));  // nothing usable named: all kept
  warnings.clear();
  f = parse("Ring,bogus;sendrecv:ring", &warnings);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("'bogus'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("'sendrecv'"), std::string::npos) << warnings[1];
  EXPECT_FALSE(f.allows(OpKind::kAllReduce, Algorithm::kDirect));
}

// NCCL's Tree names loom's tree AllReduce; the other collectives have no
// tree, so the model picks among what can run them.
TEST(AlgoFilter, TreeIsTheTreeAllReduce) {
  std::vector<std::string> warnings;
  AlgoFilter f = parse("Tree", &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_TRUE(f.allows(OpKind::kAllReduce, Algorithm::kTree));
  EXPECT_FALSE(f.allows(OpKind::kAllReduce, Algorithm::kRing));
  TuningContext c;
  c.nranks = 8;
  c.filter = f;
  EXPECT_EQ(choose(OpKind::kAllReduce, 1 << 20, c).algorithm, Algorithm::kTree);
  EXPECT_EQ(choose(OpKind::kBroadcast, 1 << 20, c).algorithm, Algorithm::kTree);
  EXPECT_EQ(choose(OpKind::kReduce, 1 << 20, c).algorithm, Algorithm::kTree);
  EXPECT_NE(choose(OpKind::kAllGather, 1 << 20, c).algorithm, Algorithm::kTree);
  EXPECT_NE(cannotRun(Algorithm::kTree, OpKind::kReduceScatter, 8, c), "");
  c.deterministic = true;
  EXPECT_NE(cannotRun(Algorithm::kTree, OpKind::kAllReduce, 8, c).find("LOOM_DETERMINISTIC"), std::string::npos);
  EXPECT_TRUE(cannotRun(Algorithm::kTree, OpKind::kBroadcast, 8, c).empty());  // no folding
  EXPECT_NE(choose(OpKind::kAllReduce, 1 << 20, c).algorithm, Algorithm::kTree);
  c.deterministic = false;
  c.device = true;  // fan-in folds run as kernels too
  EXPECT_EQ(cannotRun(Algorithm::kTree, OpKind::kAllReduce, 8, c), "");
  // More ranks than direct and twoshot take: the tree's hops beat the ring's.
  TuningContext big;
  big.nranks = 64;
  EXPECT_TRUE(cannotRun(Algorithm::kTree, OpKind::kAllReduce, 1024, big).empty());
  EXPECT_LT(estimateUs(Algorithm::kTree, OpKind::kAllReduce, 1024, big),
            estimateUs(Algorithm::kRing, OpKind::kAllReduce, 1024, big));
}

// Recursive doubling: AllReduce only, host buffers, never deterministic;
// on many ranks it takes half the tree's hops for small vectors.
TEST(AlgoFilter, DoublingIsAnAllReduce) {
  std::vector<std::string> warnings;
  TuningContext c;
  c.nranks = 64;
  c.filter = AlgoFilter::parse("allreduce:doubling", &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(choose(OpKind::kAllReduce, 1024, c).algorithm, Algorithm::kDoubling);
  EXPECT_NE(cannotRun(Algorithm::kDoubling, OpKind::kBroadcast, 8, c), "");
  TuningContext any;
  any.nranks = 64;
  EXPECT_LT(estimateUs(Algorithm::kDoubling, OpKind::kAllReduce, 64, any),
            estimateUs(Algorithm::kTree, OpKind::kAllReduce, 64, any));
  c.deterministic = true;
  EXPECT_NE(cannotRun(Algorithm::kDoubling, OpKind::kAllReduce, 8, c).find("LOOM_DETERMINISTIC"), std::string::npos);
  c.deterministic = false;
  c.device = true;
  EXPECT_EQ(cannotRun(Algorithm::kDoubling, OpKind::kAllReduce, 8, c), "");
}

// Halving-doubling (Rabenseifner): AllReduce only, host buffers, never
// deterministic, also by its author's name; the model takes it for mid-size
// vectors over the network (where it measured faster than the ring) and
// leaves large ones on shared memory to the pipelined ring.
TEST(AlgoFilter, HalvingIsAnAllReduce) {
  std::vector<std::string> warnings;
  TuningContext c;
  c.nranks = 6;
  c.filter = AlgoFilter::parse("allreduce:Rabenseifner", &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(choose(OpKind::kAllReduce, 8 << 20, c).algorithm, Algorithm::kHalving);
  EXPECT_STREQ(algorithmName(Algorithm::kHalving), "halving");
  EXPECT_NE(cannotRun(Algorithm::kHalving, OpKind::kReduceScatter, 8, c), "");
  c.deterministic = true;
  EXPECT_NE(cannotRun(Algorithm::kHalving, OpKind::kAllReduce, 8, c).find("LOOM_DETERMINISTIC"), std::string::npos);
  c.deterministic = false;
  c.device = true;
  EXPECT_EQ(cannotRun(Algorithm::kHalving, OpKind::kAllReduce, 8, c), "");
  TuningContext net;
  net.nranks = 8;
  net.links = LinkClass::kNetwork;
  net.sliceBytes = 128 << 10;
  EXPECT_EQ(choose(OpKind::kAllReduce, 256 << 10, net).algorithm, Algorithm::kHalving);
  TuningContext local;
  local.nranks = 8;
  EXPECT_EQ(choose(OpKind::kAllReduce, 16 << 20, local).algorithm, Algorithm::kRing);
}

// Hierarchical: AllReduce across hosts that hold the same number (>= 2) of
// ranks each; the model takes it for mid-size vectors (as measured on 2 x 2
// and 3 x 2 network-namespace hosts) and the ring for large ones on 3 x 2.
TEST(AlgoFilter, HierarchicalNeedsEvenHosts) {
  TuningContext c;
  c.nranks = 6;
  c.links = LinkClass::kNetwork;
  c.sliceBytes = 128 << 10;
  EXPECT_NE(cannotRun(Algorithm::kHierarchical, OpKind::kAllReduce, 8, c).find("several hosts"), std::string::npos);
  c.hosts = 3;
  EXPECT_NE(cannotRun(Algorithm::kHierarchical, OpKind::kAllReduce, 8, c).find("same number"), std::string::npos);
  c.ranksPerHost = 2;
  EXPECT_EQ(cannotRun(Algorithm::kHierarchical, OpKind::kAllReduce, 8, c), "");
  EXPECT_NE(cannotRun(Algorithm::kHierarchical, OpKind::kBroadcast, 8, c), "");
  EXPECT_EQ(choose(OpKind::kAllReduce, 64 << 10, c).algorithm, Algorithm::kHierarchical);
  EXPECT_EQ(choose(OpKind::kAllReduce, 16 << 20, c).algorithm, Algorithm::kRing);
  c.hosts = 2;
  c.ranksPerHost = 3;
  EXPECT_EQ(choose(OpKind::kAllReduce, 16 << 20, c).algorithm, Algorithm::kHierarchical);
  c.deterministic = true;
  EXPECT_NE(cannotRun(Algorithm::kHierarchical, OpKind::kAllReduce, 8, c).find("LOOM_DETERMINISTIC"), std::string::npos);
  std::vector<std::string> warnings;
  EXPECT_TRUE(AlgoFilter::parse("allreduce:hierarchical", &warnings).allows(OpKind::kAllReduce, Algorithm::kHierarchical));
  EXPECT_TRUE(warnings.empty());
}

TEST(Proto, LowLatencyNamesTheLatencyPath) {
  std::vector<std::string> w;
  EXPECT_TRUE(parseProto("", &w).latencyPath);
  EXPECT_TRUE(parseProto("LL,Simple", &w).latencyPath);
  EXPECT_FALSE(parseProto("Simple", &w).latencyPath);
  EXPECT_FALSE(parseProto("^ll,LL128", &w).latencyPath);
  EXPECT_TRUE(parseProto("^LL", &w).latencyPath);  // LL128 is left
  EXPECT_TRUE(w.empty());
  EXPECT_TRUE(parseProto("LL", &w).latencyPath);
  ASSERT_EQ(w.size(), 1u);  // Simple cannot go
  EXPECT_NE(w[0].find("Simple"), std::string::npos);
  w.clear();
  parseProto("Fast", &w);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(w[0].find("'fast'"), std::string::npos);
}

TuningContext shm(int n) {
  TuningContext c;
  c.nranks = n;
  return c;
}

TEST(Tuning, DirectForSmallRingForLarge) {
  for (int n : {2, 4, 8})
    for (OpKind k : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kBroadcast, OpKind::kReduce}) {
      EXPECT_EQ(choose(k, 8 * size_t(n), shm(n)).algorithm, Algorithm::kDirect) << opKindName(k) << " n=" << n;
      EXPECT_EQ(choose(k, size_t(256) << 20, shm(n)).algorithm, Algorithm::kRing) << opKindName(k) << " n=" << n;
    }
}

TEST(Tuning, TwoShotBetweenDirectAndRingOnFourAndMoreRanks) {
  for (int n : {4, 8}) {
    EXPECT_EQ(choose(OpKind::kAllReduce, 64 << 10, shm(n)).algorithm, Algorithm::kTwoShot) << n;
    EXPECT_EQ(choose(OpKind::kAllReduce, 16 << 20, shm(n)).algorithm, Algorithm::kRing) << n;
  }
  EXPECT_NE(choose(OpKind::kAllReduce, 64 << 10, shm(2)).algorithm, Algorithm::kTwoShot);
  // Deterministic: never the ring for reductions.
  TuningContext d = shm(4);
  d.deterministic = true;
  for (size_t bytes : {size_t(8), size_t(64) << 10, size_t(256) << 20}) {
    EXPECT_NE(choose(OpKind::kAllReduce, bytes, d).algorithm, Algorithm::kRing) << bytes;
    EXPECT_NE(choose(OpKind::kReduceScatter, bytes, d).algorithm, Algorithm::kRing) << bytes;
    EXPECT_NE(choose(OpKind::kReduce, bytes, d).algorithm, Algorithm::kRing) << bytes;
  }
  EXPECT_EQ(choose(OpKind::kAllGather, size_t(256) << 20, d).algorithm, Algorithm::kRing);
  d.filter = parse("ring");  // cannot be honoured for reductions
  EXPECT_NE(choose(OpKind::kAllReduce, 8, d).algorithm, Algorithm::kRing);
}

TEST(Tuning, WhatAnAlgorithmCannotRunIsSkipped) {
  TuningContext c = shm(4);
  c.device = true;  // every algorithm runs on device buffers
  EXPECT_TRUE(cannotRun(Algorithm::kDirect, OpKind::kAllReduce, 8, c).empty());
  EXPECT_EQ(choose(OpKind::kAllReduce, 8, c).algorithm, Algorithm::kDirect);
  EXPECT_FALSE(cannotRun(Algorithm::kDirect, OpKind::kAllReduce, 1 << 20, c).empty());  // unpipelined
  c = shm(64);
  EXPECT_NE(cannotRun(Algorithm::kDirect, OpKind::kAllReduce, 8, c).find("ranks"), std::string::npos);
  EXPECT_EQ(choose(OpKind::kAllReduce, 8, c).algorithm, Algorithm::kDoubling);  // log2(64) hops, not 63
  EXPECT_EQ(choose(OpKind::kAllGather, 8, c).algorithm, Algorithm::kRing);
  EXPECT_TRUE(cannotRun(Algorithm::kRing, OpKind::kAllReduce, 8, c).empty());
  EXPECT_FALSE(cannotRun(Algorithm::kRing, OpKind::kSend, 8, c).empty());
}

TEST(Tuning, TheFilterOverridesTheModel) {
  TuningContext c = shm(4);
  c.filter = parse("ring");
  EXPECT_EQ(choose(OpKind::kAllReduce, 8, c).algorithm, Algorithm::kRing);
  c.filter = parse("allreduce:direct");
  // Direct does not run 256 MiB messages: the filter allows nothing that
  // can, so the model picks among all.
  EXPECT_NE(choose(OpKind::kAllReduce, size_t(256) << 20, c).algorithm, Algorithm::kDirect);
  EXPECT_EQ(choose(OpKind::kAllReduce, size_t(128) << 10, c).algorithm, Algorithm::kDirect);
}

TEST(Tuning, EstimatesGrowWithSizeAndTheNetworkCostsMore) {
  TuningContext c = shm(4);
  for (Algorithm a : {Algorithm::kRing, Algorithm::kDirect}) {
    EXPECT_LT(estimateUs(a, OpKind::kAllReduce, 1024, c), estimateUs(a, OpKind::kAllReduce, 1 << 20, c));
    TuningContext net = c;
    net.links = LinkClass::kNetwork;
    EXPECT_LT(estimateUs(a, OpKind::kAllReduce, 1024, c), estimateUs(a, OpKind::kAllReduce, 1024, net));
  }
}

// LOOM_CALIBRATE rewrites the costs of the ranks' link class: slower hops
// favour the algorithms with fewer of them, and estimates follow the
// measured bandwidth.
TEST(Tuning, CalibratedCostsMoveTheChoice) {
  TuningContext table;
  table.nranks = 4;
  table.links = LinkClass::kNetwork;
  EXPECT_EQ(table.costs[size_t(LinkClass::kNetwork)].hopUs, tableCost(LinkClass::kNetwork).hopUs);
  // TCP inside one host: hops ten times cheaper and bytes five times.
  TuningContext fast = table;
  fast.costs[size_t(LinkClass::kNetwork)].hopUs /= 10;
  fast.costs[size_t(LinkClass::kNetwork)].usPerByte /= 5;
  const size_t big = size_t(16) << 20;
  EXPECT_EQ(choose(OpKind::kAllReduce, big, fast).algorithm, Algorithm::kRing);
  EXPECT_LT(estimateUs(Algorithm::kRing, OpKind::kAllReduce, big, fast),
            estimateUs(Algorithm::kRing, OpKind::kAllReduce, big, table) / 2);
  // Where hops cost little, the ring's many hops stop mattering sooner.
  size_t ringFrom[2] = {0, 0};
  for (const auto* c : {&table, &fast}) {
    for (size_t bytes = 1024; bytes <= big; bytes *= 2) {
      if (choose(OpKind::kAllReduce, bytes, *c).algorithm == Algorithm::kRing) {
        ringFrom[c == &fast] = bytes;
        break;
      }
    }
  }
  EXPECT_GT(ringFrom[0], 0u);
  EXPECT_GT(ringFrom[1], 0u);
  EXPECT_LE(ringFrom[1], ringFrom[0]);
  // Only the class in use changes anything.
  TuningContext other = table;
  other.costs[size_t(LinkClass::kSharedMemory)].hopUs *= 100;
  EXPECT_EQ(estimateUs(Algorithm::kRing, OpKind::kAllReduce, 4096, other),
            estimateUs(Algorithm::kRing, OpKind::kAllReduce, 4096, table));
}

}  // namespace
}  // namespace loom::core
