// Messages from other processes are input: the rendezvous join, the
// versioned rank info blobs and the listener's hello are checked field by
// field.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/bootstrap.h"
#include "core/root.h"
#include "core/wire.h"

namespace loom::core {
namespace {

const uint64_t kSecret[2] = {11, 22};

wire::RankInfo sampleInfo() {
  wire::RankInfo info;
  for (size_t i = 0; i < sizeof info.listenAddr; ++i) info.listenAddr[i] = uint8_t(i + 1);
  info.pid = 4242;
  info.hostHash = 0x1122334455667788ull;
  info.mode = 1;
  info.cudaDevice = 3;
  info.numa = 1;
  info.pciPath = {"0000:15:00.0", "0000:18:00.0"};
  info.nics = {topology::NicPlace{"mlx5_0", 400000, 1, {"0000:15:00.0", "0000:1a:00.0"}},
               topology::NicPlace{"eth0", 25000, -1, {}}};
  info.hostname = "node-17.cluster";
  info.transports = 1;  // a usable verbs port
  info.flags = wire::kRankFlagCalibrate;
  info.cpuMask = {0x5, uint64_t(1) << 63};  // CPUs 0, 2 and 127
  info.channels = 3;
  return info;
}

wire::Hello join(uint32_t rank, uint32_t nranks, size_t payload) {
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.kind = uint32_t(wire::HelloKind::kRootJoin);
  h.secret[0] = kSecret[0];
  h.secret[1] = kSecret[1];
  h.fromRank = rank;
  h.toRank = nranks;
  h.payload = uint32_t(payload);
  return h;
}

void expectSame(const wire::RankInfo& a, const wire::RankInfo& b) {
  EXPECT_EQ(std::memcmp(a.listenAddr, b.listenAddr, sizeof a.listenAddr), 0);
  EXPECT_EQ(a.pid, b.pid);
  EXPECT_EQ(a.hostHash, b.hostHash);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.cudaDevice, b.cudaDevice);
  EXPECT_EQ(a.gpuUuid, b.gpuUuid);
  EXPECT_EQ(a.numa, b.numa);
  EXPECT_EQ(a.pciPath, b.pciPath);
  EXPECT_EQ(a.nics, b.nics);
  EXPECT_EQ(a.hostname, b.hostname);
  EXPECT_EQ(a.transports, b.transports);
  EXPECT_EQ(a.flags, b.flags);
  EXPECT_EQ(a.cpuMask, b.cpuMask);
  EXPECT_EQ(a.channels, b.channels);
}

TEST(Wire, RankInfoRoundTripsAndStartsWithItsVersion) {
  const auto blob = wire::encode(sampleInfo());
  ASSERT_GE(blob.size(), 4u);
  EXPECT_EQ(blob[0] | blob[1] << 8 | blob[2] << 16 | blob[3] << 24, int(wire::kRankInfoVersion));
  auto back = wire::decodeRankInfo(blob);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  expectSame(*back, sampleInfo());
  // Variable length: the hostname's size decides the blob's.
  wire::RankInfo longer = sampleInfo();
  longer.hostname += ".example.org";
  EXPECT_EQ(wire::encode(longer).size(), blob.size() + 12);
}

// The fuzz targets start from seeds in this format
// (tests/fuzz/make_corpus.py): a seed of an older version would only reach
// the version check.
TEST(Wire, FuzzSeedRankInfoIsCurrent) {
  std::ifstream in(std::string(LOOM_FUZZ_CORPUS) + "/endpoints/rank_info", std::ios::binary);
  ASSERT_TRUE(in) << "no seed at " << LOOM_FUZZ_CORPUS << "/endpoints/rank_info";
  std::vector<uint8_t> seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(seed.size(), 1u);
  auto info = wire::decodeRankInfo(std::span<const uint8_t>(seed).subspan(1));  // after the selector byte
  ASSERT_TRUE(info.isOk()) << info.status().message() << ": run tests/fuzz/make_corpus.py";
  EXPECT_EQ(info->pid, 4242u);
  EXPECT_EQ(info->hostname, "node-a");
  EXPECT_EQ(info->channels, 1u);
}

// Counts that would allocate without bound are refused before allocating.
TEST(Wire, RankInfoRefusesTooManyNicsOrPciLevels) {
  wire::RankInfo many = sampleInfo();
  many.nics.assign(wire::kMaxNics, many.nics[0]);
  auto blob = wire::encode(many);
  ASSERT_TRUE(wire::decodeRankInfo(blob).isOk());
  // The NIC count sits right after the rank's PCI path; raise it past the limit.
  wire::RankInfo none = sampleInfo();
  none.nics.clear();
  auto small = wire::encode(none);
  // Before the hostname (its length and bytes), the transports, the flags
  // the CPU mask (its word count and words) and the channels.
  const size_t countAt = small.size() - 4 - 4 - 8 * none.cpuMask.size() - 4 - 4 - none.hostname.size() - 4 - 4;
  small[countAt] = uint8_t(wire::kMaxNics + 1);
  auto r = wire::decodeRankInfo(small);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("too many"), std::string::npos) << r.status().message();
}

// A CPU mask travels up to kMaxCpuWords words; a blob that claims more is
// refused before anything is allocated for it.
TEST(Wire, RankInfoCpuMaskIsBounded) {
  wire::RankInfo wide = sampleInfo();
  wide.cpuMask.assign(wire::kMaxCpuWords + 3, 1);
  auto back = wire::decodeRankInfo(wire::encode(wide));
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->cpuMask.size(), wire::kMaxCpuWords);
  wire::RankInfo none = sampleInfo();
  none.cpuMask.clear();
  auto blob = wire::encode(none);
  blob[blob.size() - 8] = uint8_t(wire::kMaxCpuWords + 1);  // the word count, before the channels
  blob.resize(blob.size() + 8 * (wire::kMaxCpuWords + 1));
  auto r = wire::decodeRankInfo(blob);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("CPU mask"), std::string::npos) << r.status().message();
}

TEST(Wire, RankInfoRefusesOtherVersionsShortLongAndOversizedBlobs) {
  const auto blob = wire::encode(sampleInfo());
  auto refused = [](std::vector<uint8_t> b, const char* needle) {
    auto r = wire::decodeRankInfo(b);
    ASSERT_FALSE(r.isOk()) << needle;
    EXPECT_EQ(r.status().code(), Code::kRemoteError);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  auto other = blob;
  other[0] = uint8_t(wire::kRankInfoVersion + 1);
  const std::string versions = "version " + std::to_string(wire::kRankInfoVersion + 1) + ", this build reads version " +
                               std::to_string(wire::kRankInfoVersion);
  refused(other, versions.c_str());
  refused(std::vector<uint8_t>(blob.begin(), blob.end() - 1), "truncated");
  refused(std::vector<uint8_t>(blob.begin(), blob.begin() + 2), "truncated");
  auto trailing = blob;
  trailing.push_back(0);
  refused(trailing, "trailing");
  // A hostname length beyond the limit is refused before anything is read.
  wire::RankInfo big = sampleInfo();
  big.hostname.assign(wire::kMaxHostnameBytes, 'h');
  auto atLimit = wire::encode(big);
  ASSERT_TRUE(wire::decodeRankInfo(atLimit).isOk());
  // Transports, flags, the CPU mask and the channels come last.
  const size_t lengthAt = atLimit.size() - 4 - 4 - 8 * big.cpuMask.size() - 4 - 4 - wire::kMaxHostnameBytes - 4;
  atLimit[lengthAt + 1] = 1;  // 255 + 256 bytes
  refused(atLimit, "oversized string");
  refused(std::vector<uint8_t>(wire::kMaxRankInfoBytes + 1, 1), "oversized rank info");
}

TEST(Wire, TableOfBlobsDecodesInRankOrderAndRefusesDamage) {
  std::vector<uint8_t> table;
  wire::RankInfo a = sampleInfo(), b = sampleInfo();
  b.pid = 7;
  b.hostname = "b";
  wire::appendTableEntry(wire::encode(a), &table);
  wire::appendTableEntry(wire::encode(b), &table);
  auto decoded = wire::decodeTable(table, 2);
  ASSERT_TRUE(decoded.isOk()) << decoded.status().message();
  ASSERT_EQ(decoded->size(), 2u);
  expectSame((*decoded)[0], a);
  expectSame((*decoded)[1], b);
  EXPECT_NE(wire::decodeTable(table, 3).status().message().find("ends before rank 2"), std::string::npos);
  EXPECT_NE(wire::decodeTable(table, 1).status().message().find("trailing"), std::string::npos);
  auto damaged = table;
  damaged[2] = 0xff;  // rank 0's length runs past the table
  EXPECT_NE(wire::decodeTable(damaged, 2).status().message().find("bad entry for rank 0"), std::string::npos);
  damaged = table;
  damaged[4 + 4] ^= 0x55;  // inside rank 0's blob (its listen address) still decodes...
  EXPECT_TRUE(wire::decodeTable(damaged, 2).isOk());
  damaged = table;
  damaged[4] = 9;  // ...but not another version
  EXPECT_NE(wire::decodeTable(damaged, 2).status().message().find("rank 0's entry"), std::string::npos);
}

TEST(Wire, JoinDecodesTheBlobItAnnounced) {
  const auto blob = wire::encode(sampleInfo());
  wire::RankInfo info;
  ASSERT_TRUE(checkJoin(join(1, 4, blob.size()), blob, &info, kSecret, 0).isOk());
  expectSame(info, sampleInfo());
}

TEST(Wire, JoinRefusals) {
  const auto blob = wire::encode(sampleInfo());
  wire::RankInfo info;
  auto refused = [&](wire::Hello h, int sofar, const char* needle, std::vector<uint8_t> payload = {}) {
    if (payload.empty()) payload = blob;
    Status s = checkJoin(h, payload, &info, kSecret, sofar);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  const size_t n = blob.size();
  wire::Hello h = join(1, 4, n);
  h.magic ^= 1;
  refused(h, 0, "not a loom join");
  h = join(1, 4, n);
  h.secret[1] ^= 1;
  refused(h, 0, "wrong secret");
  refused(join(1, 4, n + 1), 0, "payload");  // announced more than came
  refused(join(1, 4, wire::kMaxRankInfoBytes + 1), 0, "payload", std::vector<uint8_t>(wire::kMaxRankInfoBytes + 1));
  refused(join(1, 0, n), 0, "out of range");
  refused(join(0, wire::kMaxRanks + 1, n), 0, "out of range");
  refused(join(1, 4, n), 5, "other ranks said 5");
  refused(join(4, 4, n), 0, "out of range for nranks=4");
  auto otherVersion = blob;
  otherVersion[0] ^= 0x40;
  refused(join(2, 4, n), 0, "same loom build", otherVersion);
  EXPECT_TRUE(checkJoin(join(3, 4, n), blob, &info, kSecret, 4).isOk());
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
