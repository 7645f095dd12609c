// LOOM_CHECK_COLLECTIVES: the blocks ranks exchange and what a comparison
// of them says.
#include "core/collective_check.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace loom::core {
namespace {

OpDesc op(OpKind kind, size_t count, kernels::DataType type = kernels::DataType::kFloat32,
          kernels::RedOp red = kernels::RedOp::kSum, int root = 0) {
  OpDesc d;
  d.kind = kind;
  d.count = count;
  d.type = type;
  d.reduction.type = type;
  d.reduction.op = red;
  d.root = root;
  return d;
}

std::vector<std::vector<uint8_t>> blocks(const std::vector<OpDesc>& perRank, uint64_t index = 0) {
  std::vector<std::vector<uint8_t>> out;
  for (const OpDesc& op : perRank) out.push_back(encodeCheckBlock(index, op));
  return out;
}

std::string compare(const std::vector<OpDesc>& perRank) {
  Status s = compareCheckBlocks(blocks(perRank), "comm X");
  if (s.isOk()) return "ok";
  EXPECT_EQ(s.code(), Code::kInvalidUsage) << s.message();
  return s.message();
}

TEST(CollectiveCheck, AgreeingCallsPass) {
  const auto ar = op(OpKind::kAllReduce, 1024);
  EXPECT_EQ(compare({ar, ar, ar}), "ok");
  // A root is compared only where a collective has one; an op only where it reduces.
  auto ag0 = op(OpKind::kAllGather, 5, kernels::DataType::kInt8, kernels::RedOp::kSum, 0);
  auto ag1 = op(OpKind::kAllGather, 5, kernels::DataType::kInt8, kernels::RedOp::kMax, 3);
  EXPECT_EQ(compare({ag0, ag1}), "ok");
  // Send/Recv are not compared at all.
  EXPECT_FALSE(isChecked(OpKind::kSend));
  EXPECT_FALSE(isChecked(OpKind::kRecv));
  EXPECT_TRUE(isChecked(OpKind::kAllToAll));
}

TEST(CollectiveCheck, ACountMismatchNamesTheRanksAndTheirCalls) {
  const auto a = op(OpKind::kAllReduce, 1024), b = op(OpKind::kAllReduce, 1000);
  const std::string m = compare({a, b, a, a});
  EXPECT_NE(m.find("collective mismatch on comm X: at its collective #1 "), std::string::npos) << m;
  EXPECT_NE(m.find("ranks 0,2-3 call AllReduce of 1024 x float (sum); rank 1 calls AllReduce of 1000 x float (sum)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("from this one on did not run"), std::string::npos) << m;
}

TEST(CollectiveCheck, EveryFieldCounts) {
  const auto base = op(OpKind::kReduce, 8, kernels::DataType::kFloat32, kernels::RedOp::kSum, 1);
  auto type = base, red = base, root = base, kind = base;
  type.type = kernels::DataType::kBfloat16;
  red.reduction.op = kernels::RedOp::kMax;
  root.root = 2;
  kind.kind = OpKind::kBroadcast;
  EXPECT_NE(compare({base, type}).find("Reduce of 8 x bfloat16 (sum) root 1"), std::string::npos);
  EXPECT_NE(compare({base, red}).find("Reduce of 8 x float (max) root 1"), std::string::npos);
  EXPECT_NE(compare({base, root}).find("Reduce of 8 x float (sum) root 2"), std::string::npos);
  EXPECT_NE(compare({base, kind}).find("Broadcast of 8 x float root 1"), std::string::npos);
}

TEST(CollectiveCheck, ThePositionCountsTheCommunicatorsCollectives) {
  const auto ar = op(OpKind::kAllReduce, 64), bc = op(OpKind::kBroadcast, 64);
  Status s = compareCheckBlocks(blocks({ar, bc}, 41), "comm X");
  EXPECT_NE(s.message().find("collective #42"), std::string::npos) << s.message();
  s = compareCheckBlocks({encodeCheckBlock(41, ar), encodeCheckBlock(40, ar)}, "comm X");
  EXPECT_NE(s.message().find("rank 0 at collective #42; rank 1 at collective #41"), std::string::npos)
      << s.message();
}

TEST(CollectiveCheck, MalformedBlocksAreRemoteErrors) {
  const auto good = encodeCheckBlock(0, op(OpKind::kAllReduce, 64));
  auto shortBlock = good;
  shortBlock.pop_back();
  Status s = compareCheckBlocks({good, shortBlock}, "comm X");
  EXPECT_EQ(s.code(), Code::kRemoteError);
  EXPECT_NE(s.message().find("rank 1 sent a malformed collective check block"), std::string::npos) << s.message();
  auto badKind = good;
  badKind[8] = uint8_t(OpKind::kSend);
  EXPECT_EQ(compareCheckBlocks({good, badKind}, "comm X").code(), Code::kRemoteError);
  auto badType = good;
  badType[9] = 200;
  EXPECT_EQ(compareCheckBlocks({good, badType}, "comm X").code(), Code::kRemoteError);
  auto badOp = good;
  badOp[10] = 99;
  EXPECT_EQ(compareCheckBlocks({badOp, good}, "comm X").code(), Code::kRemoteError);
}

}  // namespace
}  // namespace loom::core
