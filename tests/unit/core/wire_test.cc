// Messages from other processes are input: the rendezvous join and the
// listener's hello are checked field by field, and strings inside them are
// never trusted to be terminated.
#include <gtest/gtest.h>

#include <cstring>

#include "core/bootstrap.h"
#include "core/root.h"
#include "core/wire.h"

namespace loom::core {
namespace {

const uint64_t kSecret[2] = {11, 22};

wire::Hello join(uint32_t rank, uint32_t nranks) {
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.kind = uint32_t(wire::HelloKind::kRootJoin);
  h.secret[0] = kSecret[0];
  h.secret[1] = kSecret[1];
  h.fromRank = rank;
  h.toRank = nranks;
  h.payload = sizeof(wire::RankInfo);
  return h;
}

TEST(Wire, JoinHostnameIsTerminatedWhateverThePeerSent) {
  wire::RankInfo info;
  std::memset(&info, 'A', sizeof info);  // no terminator anywhere
  ASSERT_TRUE(checkJoin(join(1, 4), &info, kSecret, 0).isOk());
  EXPECT_EQ(std::strlen(info.hostname), sizeof info.hostname - 1);
}

TEST(Wire, JoinRefusals) {
  wire::RankInfo info{};
  auto refused = [&](wire::Hello h, int sofar, const char* needle) {
    Status s = checkJoin(h, &info, kSecret, sofar);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  wire::Hello h = join(1, 4);
  h.magic ^= 1;
  refused(h, 0, "not a loom join");
  h = join(1, 4);
  h.secret[1] ^= 1;
  refused(h, 0, "wrong secret");
  h = join(1, 4);
  h.payload = 7;
  refused(h, 0, "payload");
  refused(join(1, 0), 0, "out of range");
  refused(join(0, wire::kMaxRanks + 1), 0, "out of range");
  refused(join(1, 4), 5, "other ranks said 5");
  refused(join(4, 4), 0, "out of range for nranks=4");
  EXPECT_TRUE(checkJoin(join(3, 4), &info, kSecret, 4).isOk());
}

TEST(Wire, HelloRefusals) {
  Bootstrap::Identity self;
  self.secret[0] = kSecret[0];
  self.secret[1] = kSecret[1];
  self.commHash = 77;
  self.rank = 2;
  self.nranks = 4;
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.kind = uint32_t(wire::HelloKind::kData);
  h.secret[0] = kSecret[0];
  h.secret[1] = kSecret[1];
  h.commHash = 77;
  h.fromRank = 1;
  h.toRank = 2;
  h.count = 2;
  h.index = 1;
  EXPECT_TRUE(checkHello(h, self).isOk());
  auto bad = [&](auto mutate) {
    wire::Hello x = h;
    mutate(x);
    EXPECT_EQ(checkHello(x, self).code(), Code::kInvalidArgument);
  };
  bad([](wire::Hello& x) { x.magic = 0; });
  bad([](wire::Hello& x) { x.secret[0] = 0; });
  bad([](wire::Hello& x) { x.commHash = 78; });
  bad([](wire::Hello& x) { x.toRank = 3; });
  bad([](wire::Hello& x) { x.fromRank = 4; });
  bad([](wire::Hello& x) { x.kind = 99; });
  bad([](wire::Hello& x) { x.payload = wire::kMaxNoticeBytes + 1; });
  bad([](wire::Hello& x) { x.index = 2; });
  bad([](wire::Hello& x) { x.count = 17; });
}

}  // namespace
}  // namespace loom::core
