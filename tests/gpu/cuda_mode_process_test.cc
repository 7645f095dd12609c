// Cuda mode with ranks as processes (cuda_mode_rank.cc), each on its own
// emulated device: the device queues and gates over real process
// boundaries, and a peer that dies without a word.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

int freeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

struct Rank {
  pid_t pid = -1;
  std::string log;
  int status = -1;
};

// Starts `n` ranks running `scenario`; waits at most `seconds` for all of
// them (killing what is left then) and returns them with their output.
std::vector<Rank> runJob(int n, const std::string& scenario, int seconds) {
  std::random_device rd;
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back("NCCL_COMM_ID=127.0.0.1:" + std::to_string(freeLoopbackPort()));
  env.push_back("LOOM_COMM_SECRET=cuda-mode-" + std::to_string(rd()) + std::to_string(rd()));
  env.push_back("LOOM_TIMEOUT_S=60");
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  std::vector<Rank> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[size_t(r)];
    k.log = ::testing::TempDir() + "cuda_mode_rank_" + std::to_string(::getpid()) + "_" + std::to_string(r) + ".log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, k.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::string rs = std::to_string(r), ns = std::to_string(n), prog = LOOM_CUDA_MODE_RANK_PATH;
    char* argv[] = {prog.data(), rs.data(), ns.data(), const_cast<char*>(scenario.c_str()), nullptr};
    EXPECT_EQ(posix_spawn(&k.pid, prog.c_str(), &fa, nullptr, argv, envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (Rank& k : ranks) {
    while (k.pid > 0) {
      int st = 0;
      pid_t got = ::waitpid(k.pid, &st, WNOHANG);
      if (got == k.pid) {
        k.status = st;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(k.pid, SIGKILL);
        ::waitpid(k.pid, &st, 0);
        k.status = -2;  // timed out
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return ranks;
}

std::string output(const Rank& k) {
  std::ifstream in(k.log);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class CudaModeProcesses : public ::testing::TestWithParam<int> {};

TEST_P(CudaModeProcesses, CollectivesOnDeviceBuffers) {
  const int n = GetParam();
  std::vector<Rank> ranks = runJob(n, "collectives", 120);
  for (int r = 0; r < n; ++r) {
    const Rank& k = ranks[size_t(r)];
    const std::string out = output(k);
    EXPECT_TRUE(WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0) << "rank " << r << " status " << k.status << ":\n"
                                                                   << out;
    EXPECT_NE(out.find("rank " + std::to_string(r) + ": ok"), std::string::npos) << out;
    std::remove(k.log.c_str());
  }
}
INSTANTIATE_TEST_SUITE_P(Ranks, CudaModeProcesses, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "n" + std::to_string(i.param); });

TEST(CudaModeProcessFailure, PeerThatDiesReleasesTheOthersStreams) {
  std::vector<Rank> ranks = runJob(3, "peer-dies", 120);
  for (int r = 0; r < 3; ++r) {
    const Rank& k = ranks[size_t(r)];
    const std::string out = output(k);
    if (r == 1) {
      EXPECT_TRUE(WIFEXITED(k.status) && WEXITSTATUS(k.status) == 3) << out;
    } else {
      EXPECT_TRUE(WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0) << "rank " << r << " status " << k.status
                                                                     << ":\n" << out;
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": ok"), std::string::npos) << out;
    }
    std::remove(k.log.c_str());
  }
}

}  // namespace
