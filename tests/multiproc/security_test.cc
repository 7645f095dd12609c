// Bootstrap security: strangers on the rendezvous port or on a rank's
// listener are refused and do not disturb the real ranks.
//
//  - While 3 ranks (processes) rendezvous through NCCL_COMM_ID, a rogue
//    connects to the root address and (a) presents a wrong secret (a loom
//    rank with another LOOM_COMM_SECRET), (b) sends garbage, or (c) says
//    nothing. The real ranks' init must succeed without waiting for the
//    root's 30 s limit on silent connections (asserted: < 15 s), and the
//    rogue must be refused: closed without a byte of answer, or its init
//    failing.
//  - After init, rogue connections to every rank listener of this process
//    (found in /proc/net/tcp) send garbage, a fake hello or nothing; the
//    following collectives must still give exact results, and the
//    communicators must stay healthy.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "matrix.h"
#include "mp_util.h"
#include "rank_processes.h"

namespace loom::test {
namespace {

std::string freshSecret() {
  std::random_device rd;
  return "mp-" + std::to_string(rd()) + "-" + std::to_string(rd());
}

double fieldAfter(const std::string& text, const std::string& key) {
  size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + key.size());
}

class RootRogue : public RankProcessTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(RootRogue, RealRanksInitPromptlyAndTheRogueIsRefused) {
  const std::string mode = GetParam();
  const int port = freeLoopbackPort();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> env = {"NCCL_COMM_ID=" + addr, "LOOM_COMM_SECRET=" + freshSecret()};
  ChildProcess& rank0 = spawn({"init", "rank=0", "nranks=3"}, env);
  ChildProcess* rogue = nullptr;
  if (mode == "wrong-secret") {
    // A loom rank of another job: same address, another secret.
    rogue = &spawn({"init", "rank=1", "nranks=3"}, {"NCCL_COMM_ID=" + addr, "LOOM_COMM_SECRET=" + freshSecret()});
    ASSERT_TRUE(rogue->wait(30)) << "the wrong-secret rank was neither refused nor timed out:\n" << rogue->output();
    const std::string code = resultField(rogue->output(), "code");
    EXPECT_TRUE(code != "" && code != "0") << "a rank with a wrong secret joined:\n" << rogue->output();
  } else {
    rogue = &spawn({"rogue", "addr=" + addr, "mode=" + mode, "hold=45"}, {});
    auto start = std::chrono::steady_clock::now();
    while (rogue->output().find("CONNECTED") == std::string::npos && secondsSince(start) < 20 && rogue->running())
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_NE(rogue->output().find("CONNECTED"), std::string::npos) << rogue->output();
  }
  ChildProcess& rank1 = spawn({"init", "rank=1", "nranks=3"}, env);
  ChildProcess& rank2 = spawn({"init", "rank=2", "nranks=3"}, env);
  for (ChildProcess* k : {&rank0, &rank1, &rank2}) {
    ASSERT_TRUE(k->wait(25)) << "a real rank did not finish:\n" << k->output();
    const std::string out = k->output();
    EXPECT_EQ(k->status(), 0) << out;
    EXPECT_EQ(resultField(out, "code"), "0") << out;
    const double initS = fieldAfter(out, "INIT ok seconds=");
    EXPECT_GE(initS, 0) << out;
    EXPECT_LT(initS, 15) << "init waited for the rogue:\n" << out;
  }
  if (mode != "wrong-secret") {
    ASSERT_TRUE(rogue->wait(50)) << rogue->output();
    const std::string out = rogue->output();
    EXPECT_NE(out.find("refused=1"), std::string::npos) << "the rendezvous kept the rogue's connection:\n" << out;
    EXPECT_NE(out.find("bytes=0"), std::string::npos) << "the rendezvous answered the rogue:\n" << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, RootRogue, ::testing::Values("wrong-secret", "garbage", "silent"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// IPv4 TCP listening sockets owned by this process.
std::vector<sockaddr_in> ourListeners() {
  std::set<std::string> inodes;
  for (int fd = 0; fd < 4096; ++fd) {
    char link[64], target[128];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = ::readlink(link, target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = 0;
    if (std::strncmp(target, "socket:[", 8) == 0) inodes.insert(std::string(target + 8, size_t(len) - 9));
  }
  std::vector<sockaddr_in> out;
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
    ls >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (st != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = uint32_t(std::stoul(local.substr(0, 8), nullptr, 16));  // printed in host order of s_addr
    a.sin_port = htons(uint16_t(std::stoul(local.substr(9), nullptr, 16)));
    out.push_back(a);
  }
  return out;
}

int connectTo(const sockaddr_in& a) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    fd = -1;
  }
  return fd;
}

bool closedByPeer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char buf[64];
  return ::recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0;
}

TEST(RankListenerRogue, StrangersDoNotDisturbFollowingCollectives) {
  const int n = 3;
  CommSet comms(n);
  ASSERT_TRUE(comms.ok()) << comms.error();
  const std::vector<sockaddr_in> listeners = ourListeners();
  ASSERT_GE(listeners.size(), size_t(n)) << "expected a listener per rank in /proc/net/tcp";
  std::vector<int> refusable, silent;
  for (const sockaddr_in& a : listeners) {
    int garbage = connectTo(a), hello = connectTo(a), quiet = connectTo(a);
    ASSERT_GE(garbage, 0);
    ASSERT_GE(hello, 0);
    ASSERT_GE(quiet, 0);
    char junk[300];
    for (size_t i = 0; i < sizeof junk; ++i) junk[i] = char(mix64(i + 7) & 0xff);
    EXPECT_EQ(::send(garbage, junk, sizeof junk, MSG_NOSIGNAL), ssize_t(sizeof junk));
    // Starts like a loom hello ("Hell", little-endian), then zeros: a wrong secret.
    char fake[128] = {'H', 'e', 'l', 'l', 3, 0, 0, 0};
    EXPECT_EQ(::send(hello, fake, sizeof fake, MSG_NOSIGNAL), ssize_t(sizeof fake));
    refusable.push_back(garbage);
    refusable.push_back(hello);
    silent.push_back(quiet);
  }
  // Collectives that need new data connections (all pairs) and old ones.
  std::vector<Case> cases;
  for (Coll coll : {Coll::kAllReduce, Coll::kSendRecvAllPairs, Coll::kAllGather, Coll::kBroadcast}) {
    Case c;
    c.coll = coll;
    c.type = ncclFloat32;
    c.red = Red::kSum;
    c.count = 100003;
    c.root = n - 1;
    c.nranks = n;
    c.seed = 77 + uint64_t(coll);
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    std::vector<std::string> problems = runCase(comms, c);
    std::string text;
    for (const auto& p : problems) text += "\n  " + p;
    EXPECT_TRUE(problems.empty()) << c.describe() << text;
  }
  // The listeners are serviced during operations and by
  // ncclCommGetAsyncError; the garbage and the fake hello must be closed.
  auto start = std::chrono::steady_clock::now();
  size_t closed = 0;
  std::vector<bool> isClosed(refusable.size(), false);
  while (closed < refusable.size() && secondsSince(start) < 20) {
    for (int r = 0; r < n; ++r) {
      ncclResult_t async = ncclInternalError;
      ASSERT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
      ASSERT_EQ(async, ncclSuccess) << "rank " << r << " was broken by a stranger: " << ncclGetLastError(comms[r]);
    }
    for (size_t i = 0; i < refusable.size(); ++i) {
      if (!isClosed[i] && closedByPeer(refusable[i])) {
        isClosed[i] = true;
        ++closed;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(closed, refusable.size()) << "some rank listeners kept a garbage or wrong-secret connection open";
  for (int fd : refusable) ::close(fd);
  for (int fd : silent) ::close(fd);
  // Still healthy afterwards.
  EXPECT_TRUE(runCase(comms, cases[0]).empty());
}

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
