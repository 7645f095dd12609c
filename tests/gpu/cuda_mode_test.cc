// Cuda mode on the emulated device (emulated_device.h): ranks as threads of
// this process, device buffers that crash if the host touches them, and
// streams that run their work late and in random delays. What is checked
// is the orchestration NCCL's users rely on: calls return at once, the
// work runs after the stream's earlier work and before its later work,
// groups span communicators and streams, finalize drains, abort and a
// failed peer release every stream, errors are sticky and asynchronous,
// device-resident scalars are read when the operation runs, and captured
// graphs replay the collective in stream order.
#include <gtest/gtest.h>
#include <loom/loom.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/settings.h"
#include "device/device.h"
#include "emulated_device.h"

namespace {

using loom::test::EmulatedDevice;
using Stream = loom::device::Stream;

// One table for the whole process: gate words handed out from its pinned
// pages live as long as the process (device/device.h).
EmulatedDevice& emu() {
  static EmulatedDevice* d = new EmulatedDevice(EmulatedDevice::Options::with(2, 1000));
  return *d;
}

cudaStream_t asCuda(Stream s) { return static_cast<cudaStream_t>(s); }

// A stream of `device`, as the user of a communicator there creates it
// (a kernel launch on another device's stream fails).
Stream streamOn(int device) {
  const int was = emu().currentDevice().value();
  EXPECT_TRUE(emu().setDevice(device).isOk());
  Stream s = emu().createStream().value();
  EXPECT_TRUE(emu().setDevice(was).isOk());
  return s;
}

// A stream "kernel" that holds its stream until the test opens it: proves a
// call returned without waiting for the stream's earlier work.
class Latch {
 public:
  void open() { promise_.set_value(); }
  // Queued on `s`: waits for open() (at most 60 s, so a bug fails, never hangs).
  void holdStream(Stream s, std::function<void()> then = {}) {
    auto f = future_;
    emu().launch(s, [f, then] {
      f.wait_for(std::chrono::seconds(60));
      if (then) then();
    });
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
};

// Waits for `s` with a bound: a stream left gated forever fails the test.
::testing::AssertionResult drains(Stream s, int seconds = 30) {
  auto done = std::async(std::launch::async, [s] { return emu().synchronize(s).isOk(); });
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    return ::testing::AssertionFailure() << "the stream is still gated after " << seconds << " s";
  }
  return done.get() ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << "synchronize failed";
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes), ptr(emu().allocDevice(bytes).value()) {}
  ~DeviceBuffer() { emu().freeDevice(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
  template <typename T>
  T* host() const {
    return static_cast<T*>(EmulatedDevice::hostView(ptr));
  }
  size_t bytes;
  void* ptr;
};

class CudaMode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    loom::device::setApiForTesting(&emu());
    // The gate words' page, which stays for the process (device/device.h),
    // now: each test then ends with the allocations it started with.
    loom::device::releaseGateWord(&emu(), loom::device::acquireGateWord(&emu()).value());
  }
  static void TearDownTestSuite() { loom::device::setApiForTesting(nullptr); }
  void SetUp() override {
    // Cuda mode whatever LOOM_DEVICE says (a CPU tier may set host).
    ASSERT_EQ(loomSetBufferMode(loomBufferModeCuda), ncclSuccess);
    allocationsAtStart_ = emu().liveAllocations();
  }

  void makeRanks(int n) {
    comms_.assign(size_t(n), nullptr);
    ASSERT_EQ(ncclCommInitAll(comms_.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    // ncclCommInitAll puts rank r on device r % 2.
    for (int r = 0; r < n; ++r) streams_.push_back(streamOn(r % 2));
  }
  void TearDown() override {
    for (ncclComm_t c : comms_) {
      if (c) {
        EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
      }
    }
    for (Stream s : streams_) {
      EXPECT_TRUE(drains(s));
      emu().destroyStream(s);
    }
    EXPECT_EQ(emu().liveAllocations(), allocationsAtStart_)
        << "destroyed communicators must give back their staging memory";
    EXPECT_EQ(emu().liveEvents(), 0u) << "destroyed communicators must destroy their events";
  }
  int n() const { return int(comms_.size()); }

  std::vector<ncclComm_t> comms_;
  std::vector<Stream> streams_;
  size_t allocationsAtStart_ = 0;
};

// ncclCommInitAll without a device list: rank i on device i, wrapping
// around when there are fewer (the emulation has 2): ranks share them.
TEST_F(CudaMode, CommunicatorsAreInCudaModeOnTheirDevices) {
  makeRanks(3);
  for (int r = 0; r < 3; ++r) {
    int device = -1;
    ASSERT_EQ(ncclCommCuDevice(comms_[size_t(r)], &device), ncclSuccess);
    EXPECT_EQ(device, r % 2) << "rank " << r;
    loomBufferMode_t mode = loomBufferModeHost;
    ASSERT_EQ(loomCommGetBufferMode(comms_[size_t(r)], &mode), ncclSuccess);
    EXPECT_EQ(mode, loomBufferModeCuda);
  }
}

// Each communicator binds the device its init was called for, also when
// the init runs on another thread (a group, ncclCommInitAll's list); the
// caller's current device is left as it was.
TEST_F(CudaMode, CommunicatorsBindTheDeviceTheirInitWasCalledFor) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t grouped[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(emu().setDevice(1 - r).isOk());
    ASSERT_EQ(ncclCommInitRank(&grouped[r], 2, id, r), ncclSuccess);
  }
  ASSERT_TRUE(emu().setDevice(0).isOk());
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    int device = -1;
    ASSERT_EQ(ncclCommCuDevice(grouped[r], &device), ncclSuccess);
    EXPECT_EQ(device, 1 - r) << "rank " << r;
  }
  EXPECT_EQ(emu().currentDevice().value(), 0);
  for (ncclComm_t c : grouped) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);

  ncclComm_t all[3] = {nullptr, nullptr, nullptr};
  const int devlist[3] = {1, 0, 1};
  ASSERT_EQ(ncclCommInitAll(all, 3, devlist), ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    int device = -1;
    ASSERT_EQ(ncclCommCuDevice(all[r], &device), ncclSuccess);
    EXPECT_EQ(device, devlist[r]) << "rank " << r;
  }
  for (ncclComm_t c : all) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  EXPECT_EQ(emu().currentDevice().value(), 0);
}

// The call returns while the stream's earlier work still runs; the
// operation sees that work's output; the stream's later work sees the
// operation's output.
TEST_F(CudaMode, AllReduceIsOrderedOnTheStreamAndReturnsAtOnce) {
  makeRanks(3);
  constexpr size_t kCount = 100000;
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  std::vector<std::vector<float>> seen(static_cast<size_t>(n()));
  Latch latch;
  // Every allocation before the first hold: allocating device memory may
  // wait for the streams (the emulated device says so).
  for (int r = 0; r < n(); ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    out.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
  }
  for (int r = 0; r < n(); ++r) {
    float* host = in[size_t(r)]->host<float>();
    latch.holdStream(streams_[size_t(r)], [host, r] {
      for (size_t i = 0; i < kCount; ++i) host[i] = float((r + 1) * int(i % 97));
    });
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n(); ++r) {
    ASSERT_EQ(ncclAllReduce(in[size_t(r)]->ptr, out[size_t(r)]->ptr, kCount, ncclFloat, ncclSum, comms_[size_t(r)],
                            asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);  // returned with every stream still held by the latch
  for (int r = 0; r < n(); ++r) {
    float* host = out[size_t(r)]->host<float>();
    auto* dst = &seen[size_t(r)];
    emu().launch(streams_[size_t(r)], [host, dst] { dst->assign(host, host + kCount); });
  }
  latch.open();
  for (int r = 0; r < n(); ++r) {
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    ASSERT_EQ(seen[size_t(r)].size(), kCount);
    for (size_t i = 0; i < kCount; i += 997) ASSERT_EQ(seen[size_t(r)][i], float(6 * int(i % 97))) << "rank " << r << " element " << i;
  }
  int64_t err = 0;
  for (ncclComm_t c : comms_) {
    ncclResult_t async = ncclInternalError;
    ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    err += async != ncclSuccess;
  }
  EXPECT_EQ(err, 0);
}

// Ranks of one process sharing one stream (a job whose group puts every
// rank's call on the legacy stream 0, which follows the current device):
// every host function goes on the
// stream before any gate, else rank 0's gate would hold back rank 1's host
// function while rank 0's operation waits for rank 1.
TEST_F(CudaMode, RanksSharingOneStreamInAGroup) {
  makeRanks(3);
  constexpr size_t kCount = 4099;
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  for (int r = 0; r < n(); ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    out.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    float* host = in.back()->host<float>();
    for (size_t i = 0; i < kCount; ++i) host[i] = float(r + 1);
  }
  const Stream shared = nullptr;
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n(); ++r) {
      EXPECT_EQ(ncclAllReduce(in[size_t(r)]->ptr, out[size_t(r)]->ptr, kCount, ncclFloat, ncclSum,
                              comms_[size_t(r)], asCuda(shared)),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  }
  ASSERT_TRUE(drains(shared));
  for (int r = 0; r < n(); ++r)
    for (size_t i = 0; i < kCount; i += 101) ASSERT_EQ(out[size_t(r)]->host<float>()[i], 6.0f) << "rank " << r;
}

// Every collective and point-to-point call, in place and out of place, on
// device buffers: the same results as the host engine's.
TEST_F(CudaMode, EveryCollectiveOnDeviceBuffers) {
  makeRanks(3);
  const int N = n();
  constexpr size_t kCount = 4099;
  auto value = [](int rank, size_t i) { return int32_t(rank * 1000 + int(i % 1013)); };
  struct RankBufs {
    std::unique_ptr<DeviceBuffer> send, recv;
  };
  std::vector<RankBufs> b(static_cast<size_t>(N));
  auto reset = [&] {
    for (int r = 0; r < N; ++r) {
      b[size_t(r)].send = std::make_unique<DeviceBuffer>(kCount * size_t(N) * sizeof(int32_t));
      b[size_t(r)].recv = std::make_unique<DeviceBuffer>(kCount * size_t(N) * sizeof(int32_t));
      int32_t* s = b[size_t(r)].send->host<int32_t>();
      for (size_t i = 0; i < kCount * size_t(N); ++i) s[i] = value(r, i);
      std::memset(b[size_t(r)].recv->host<int32_t>(), 0xee, kCount * size_t(N) * sizeof(int32_t));
    }
  };
  auto run = [&](const char* what, const std::function<ncclResult_t(int)>& call) {
    SCOPED_TRACE(what);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < N; ++r) ASSERT_EQ(call(r), ncclSuccess) << ncclGetLastError(comms_[size_t(r)]);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < N; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
  };
  auto S = [&](int r) { return asCuda(streams_[size_t(r)]); };

  reset();
  run("AllGather", [&](int r) {
    return ncclAllGather(b[size_t(r)].send->ptr, b[size_t(r)].recv->ptr, kCount, ncclInt32, comms_[size_t(r)], S(r));
  });
  for (int r = 0; r < N; ++r)
    for (int p = 0; p < N; ++p)
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(b[size_t(r)].recv->host<int32_t>()[size_t(p) * kCount + i], value(p, i));

  reset();
  run("ReduceScatter", [&](int r) {
    return ncclReduceScatter(b[size_t(r)].send->ptr, b[size_t(r)].recv->ptr, kCount, ncclInt32, ncclSum,
                             comms_[size_t(r)], S(r));
  });
  for (int r = 0; r < N; ++r)
    for (size_t i = 0; i < kCount; ++i) {
      int32_t want = 0;
      for (int p = 0; p < N; ++p) want += value(p, size_t(r) * kCount + i);
      ASSERT_EQ(b[size_t(r)].recv->host<int32_t>()[i], want);
    }

  reset();
  run("Broadcast from 1", [&](int r) {
    return ncclBroadcast(b[size_t(r)].send->ptr, b[size_t(r)].recv->ptr, kCount, ncclInt32, 1, comms_[size_t(r)], S(r));
  });
  for (int r = 0; r < N; ++r)
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(b[size_t(r)].recv->host<int32_t>()[i], value(1, i));

  reset();
  run("Reduce to 2, max", [&](int r) {
    return ncclReduce(b[size_t(r)].send->ptr, b[size_t(r)].recv->ptr, kCount, ncclInt32, ncclMax, 2, comms_[size_t(r)],
                      S(r));
  });
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(b[2].recv->host<int32_t>()[i], value(N - 1, i));

  reset();
  run("AllToAll", [&](int r) {
    return ncclAlltoAll(b[size_t(r)].send->ptr, b[size_t(r)].recv->ptr, kCount, ncclInt32, comms_[size_t(r)], S(r));
  });
  for (int r = 0; r < N; ++r)
    for (int p = 0; p < N; ++p)
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(b[size_t(r)].recv->host<int32_t>()[size_t(p) * kCount + i], value(p, size_t(r) * kCount + i));

  reset();
  run("Send/Recv ring", [&](int r) {
    ncclResult_t a = ncclSend(b[size_t(r)].send->ptr, kCount, ncclInt32, (r + 1) % N, comms_[size_t(r)], S(r));
    if (a != ncclSuccess) return a;
    return ncclRecv(b[size_t(r)].recv->ptr, kCount, ncclInt32, (r + N - 1) % N, comms_[size_t(r)], S(r));
  });
  for (int r = 0; r < N; ++r)
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(b[size_t(r)].recv->host<int32_t>()[i], value((r + N - 1) % N, i));

  reset();
  run("AllReduce in place", [&](int r) {
    return ncclAllReduce(b[size_t(r)].send->ptr, b[size_t(r)].send->ptr, kCount, ncclInt32, ncclSum, comms_[size_t(r)],
                         S(r));
  });
  for (int r = 0; r < N; ++r)
    for (size_t i = 0; i < kCount; ++i) {
      int32_t want = 0;
      for (int p = 0; p < N; ++p) want += value(p, i);
      ASSERT_EQ(b[size_t(r)].send->host<int32_t>()[i], want);
    }

  reset();
  run("AllGather in place", [&](int r) {
    char* base = static_cast<char*>(b[size_t(r)].send->ptr);
    return ncclAllGather(base + size_t(r) * kCount * sizeof(int32_t), base, kCount, ncclInt32, comms_[size_t(r)], S(r));
  });
  for (int r = 0; r < N; ++r)
    for (int p = 0; p < N; ++p)
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(b[size_t(r)].send->host<int32_t>()[size_t(p) * kCount + i], value(p, size_t(p) * kCount + i));
}

// The arithmetic runs as kernels on the device (the emulation counts them)
// over many slices of staging slots, with the pre- and post-steps of
// PreMulSum and Avg, in place and out of place; every element is checked.
// Twice: over CUDA IPC (device slots), and with NCCL_P2P_DISABLE=1 over
// shared memory (pinned host slots).
class CudaModeTransports : public CudaMode, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    CudaMode::SetUp();
    if (GetParam()) setenv("NCCL_P2P_DISABLE", "1", 1);
    else unsetenv("NCCL_P2P_DISABLE");
    loom::settings::reload();
  }
  void TearDown() override {
    unsetenv("NCCL_P2P_DISABLE");
    loom::settings::reload();
    CudaMode::TearDown();
  }
};
INSTANTIATE_TEST_SUITE_P(P2p, CudaModeTransports, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "shm" : "cudaipc"; });

TEST_P(CudaModeTransports, KernelsReduceSliceBySlice) {
  makeRanks(3);
  const int N = n();
  constexpr size_t kCount = (3 << 20) / 4 + 13;  // several slices per chunk, odd tail
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  for (int r = 0; r < N; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    out.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
  }
  auto fill = [&] {
    for (int r = 0; r < N; ++r) {
      float* h = in[size_t(r)]->host<float>();
      for (size_t i = 0; i < kCount; ++i) h[i] = float((r + 1) * int(i % 61));
      std::memset(out[size_t(r)]->host<float>(), 0xee, kCount * sizeof(float));
    }
  };
  const float half = 0.5f;
  std::vector<ncclRedOp_t> premul(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r)
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&premul[size_t(r)], const_cast<float*>(&half), ncclFloat,
                                       ncclScalarHostImmediate, comms_[size_t(r)]),
              ncclSuccess);
  struct Case {
    const char* name;
    bool inPlace;
    int op;  // 0 sum, 1 avg, 2 premul
  };
  for (const Case& c : {Case{"sum", false, 0}, Case{"avg in place", true, 1}, Case{"premul", false, 2}}) {
    SCOPED_TRACE(c.name);
    fill();
    const uint64_t kernelsBefore = emu().reduceLaunches();
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < N; ++r) {
      const ncclRedOp_t op = c.op == 0 ? ncclSum : c.op == 1 ? ncclAvg : premul[size_t(r)];
      void* dst = c.inPlace ? in[size_t(r)]->ptr : out[size_t(r)]->ptr;
      ASSERT_EQ(ncclAllReduce(in[size_t(r)]->ptr, dst, kCount, ncclFloat, op, comms_[size_t(r)],
                              asCuda(streams_[size_t(r)])),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < N; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
    // Each rank reduces every chunk but its own once, in kernels.
    EXPECT_GE(emu().reduceLaunches() - kernelsBefore, uint64_t(N * (N - 1)));
    const float scale = c.op == 0 ? 6.0f : c.op == 1 ? 2.0f : 3.0f;  // sum of (r + 1), /3, *0.5
    for (int r = 0; r < N; ++r) {
      const float* h = (c.inPlace ? in : out)[size_t(r)]->host<float>();
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_FLOAT_EQ(h[i], scale * float(int(i % 61))) << "rank " << r << " at " << i;  // avg: x * (1/3)
    }
  }
  for (int r = 0; r < N; ++r) EXPECT_EQ(ncclRedOpDestroy(premul[size_t(r)], comms_[size_t(r)]), ncclSuccess);
}

// ncclCommRegister'ed device buffers: CUDA IPC connections copy sends out
// of them directly (transport/cudaipc); the results are the same, in place
// too, and deregistering works while the communicator lives.
// Every algorithm on device buffers (fan-in folds as kernels), forced with
// NCCL_ALGO, over CUDA IPC and over shared memory (pinned slots): AllReduce
// with sum, PreMulSum (x3) and Avg, in and out of place, Broadcast and
// Reduce on the tree; every element checked. Then LOOM_DETERMINISTIC=1 on
// device buffers: float sums whose bits depend on the order come out the
// same on every rank as a rank-order fold on the host computes them.
struct AlgoCase {
  const char* algo;
  int ranks;
  bool p2pDisabled;
};
class CudaModeAlgorithms : public CudaMode, public ::testing::WithParamInterface<AlgoCase> {
 protected:
  void SetUp() override {
    CudaMode::SetUp();
    setenv("NCCL_ALGO", GetParam().algo, 1);
    if (GetParam().p2pDisabled) setenv("NCCL_P2P_DISABLE", "1", 1);
    loom::settings::reload();
  }
  void TearDown() override {
    unsetenv("NCCL_ALGO");
    unsetenv("NCCL_P2P_DISABLE");
    unsetenv("LOOM_DETERMINISTIC");
    loom::settings::reload();
    CudaMode::TearDown();
  }
};
INSTANTIATE_TEST_SUITE_P(
    Algos, CudaModeAlgorithms,
    ::testing::Values(AlgoCase{"direct", 3, false}, AlgoCase{"twoshot", 4, true}, AlgoCase{"tree", 5, false},
                      AlgoCase{"doubling", 3, true}, AlgoCase{"halving", 6, false}, AlgoCase{"halving", 4, true},
                      // More sources than one kernel launch folds (8): chained launches, in place.
                      AlgoCase{"direct", 10, true}, AlgoCase{"twoshot", 9, false}),
    [](const ::testing::TestParamInfo<AlgoCase>& i) {
      return std::string(i.param.algo) + std::to_string(i.param.ranks) + (i.param.p2pDisabled ? "shm" : "cudaipc");
    });

TEST_P(CudaModeAlgorithms, CollectivesOnDeviceBuffers) {
  makeRanks(GetParam().ranks);
  const int N = n();
  // 4099 floats: over direct's and the fan-ins' staging, odd; small integers keep sums exact.
  for (size_t count : {size_t(7), size_t(4099), size_t(300001)}) {
    SCOPED_TRACE("count " + std::to_string(count));
    auto value = [](int rank, size_t i) { return float(int((rank * 7 + i * 3) % 11) - 5); };
    std::vector<std::unique_ptr<DeviceBuffer>> send, recv;
    for (int r = 0; r < N; ++r) {
      send.push_back(std::make_unique<DeviceBuffer>(count * sizeof(float)));
      recv.push_back(std::make_unique<DeviceBuffer>(count * sizeof(float)));
    }
    auto fill = [&] {
      for (int r = 0; r < N; ++r)
        for (size_t i = 0; i < count; ++i) send[size_t(r)]->host<float>()[i] = value(r, i);
    };
    auto sum = [&](size_t i) {
      float s = 0;
      for (int p = 0; p < N; ++p) s += value(p, i);
      return s;
    };
    std::vector<ncclRedOp_t> premul(static_cast<size_t>(N));
    const float three = 3.0f;
    for (int r = 0; r < N; ++r)
      ASSERT_EQ(ncclRedOpCreatePreMulSum(&premul[size_t(r)], const_cast<float*>(&three), ncclFloat32,
                                         ncclScalarHostImmediate, comms_[size_t(r)]),
                ncclSuccess);
    struct OpCase {
      const char* name;
      bool inPlace;
      std::function<ncclRedOp_t(int)> op;
      std::function<float(size_t)> want;
    };
    const std::vector<OpCase> ops = {
        {"sum", false, [](int) { return ncclSum; }, sum},
        {"sum in place", true, [](int) { return ncclSum; }, sum},
        {"premulsum x3 in place", true, [&](int r) { return premul[size_t(r)]; }, [&](size_t i) { return 3 * sum(i); }},
        {"avg", false, [](int) { return ncclAvg; }, [&](size_t i) { return sum(i) / float(N); }},
    };
    for (const OpCase& o : ops) {
      SCOPED_TRACE(o.name);
      fill();
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < N; ++r) {
        void* out = o.inPlace ? send[size_t(r)]->ptr : recv[size_t(r)]->ptr;
        ASSERT_EQ(ncclAllReduce(send[size_t(r)]->ptr, out, count, ncclFloat32, o.op(r), comms_[size_t(r)],
                                asCuda(streams_[size_t(r)])),
                  ncclSuccess)
            << ncclGetLastError(comms_[size_t(r)]);
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      for (int r = 0; r < N; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
      for (int r = 0; r < N; ++r) {
        const float* got = (o.inPlace ? send[size_t(r)] : recv[size_t(r)])->host<float>();
        // Avg may multiply each input by 1/N before the sum (NCCL's way on
        // devices): within N ulp of the quotient; the others are exact.
        for (size_t i = 0; i < count; ++i)
          ASSERT_NEAR(got[i], o.want(i), std::max(1.0f, std::abs(o.want(i))) * float(N) * 1.2e-7f)
              << "rank " << r << " element " << i;
      }
    }
    for (int r = 0; r < N; ++r) ASSERT_EQ(ncclRedOpDestroy(premul[size_t(r)], comms_[size_t(r)]), ncclSuccess);
    // Broadcast and Reduce (the tree's; the others run them on the chain).
    fill();
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < N; ++r)
      ASSERT_EQ(ncclBroadcast(send[size_t(r)]->ptr, recv[size_t(r)]->ptr, count, ncclFloat32, N - 1,
                              comms_[size_t(r)], asCuda(streams_[size_t(r)])),
                ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < N; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
    for (int r = 0; r < N; ++r)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[size_t(r)]->host<float>()[i], value(N - 1, i)) << r;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < N; ++r)
      ASSERT_EQ(ncclReduce(send[size_t(r)]->ptr, recv[size_t(r)]->ptr, count, ncclFloat32, ncclSum, 1,
                           comms_[size_t(r)], asCuda(streams_[size_t(r)])),
                ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < N; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[1]->host<float>()[i], sum(i)) << i;
  }
}

TEST_F(CudaMode, DeterministicReductionsOnDeviceBuffers) {
  setenv("LOOM_DETERMINISTIC", "1", 1);
  loom::settings::reload();
  makeRanks(4);
  unsetenv("LOOM_DETERMINISTIC");
  loom::settings::reload();
  const int N = n();
  const size_t count = 70001;
  // Mixed magnitudes: the sum's bits depend on the order of the fold.
  auto value = [](int rank, size_t i) {
    const uint64_t h = (uint64_t(rank) * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
    const float scale = h % 3 == 0 ? 1000.0f : h % 3 == 1 ? 1.0f : 0.001f;
    return (float((h >> 11) % 20001) / 10000.0f - 1.0f) * scale;
  };
  std::vector<std::unique_ptr<DeviceBuffer>> send, recv;
  for (int r = 0; r < N; ++r) {
    send.push_back(std::make_unique<DeviceBuffer>(count * sizeof(float)));
    recv.push_back(std::make_unique<DeviceBuffer>(count * sizeof(float)));
    for (size_t i = 0; i < count; ++i) send[size_t(r)]->host<float>()[i] = value(r, i);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < N; ++r)
    ASSERT_EQ(ncclAllReduce(send[size_t(r)]->ptr, recv[size_t(r)]->ptr, count, ncclFloat32, ncclSum,
                            comms_[size_t(r)], asCuda(streams_[size_t(r)])),
              ncclSuccess)
        << ncclGetLastError(comms_[size_t(r)]);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < N; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
  for (int r = 0; r < N; ++r)
    for (size_t i = 0; i < count; ++i) {
      float want = value(0, i);
      for (int p = 1; p < N; ++p) want += value(p, i);  // rank order
      ASSERT_EQ(std::memcmp(&recv[size_t(r)]->host<float>()[i], &want, sizeof want), 0)
          << "rank " << r << " element " << i;
    }
}

TEST_F(CudaMode, RegisteredBuffersGiveTheSameResults) {
  makeRanks(2);
  constexpr size_t kCount = (1 << 20) / 4 + 7;  // full slices and a tail
  std::vector<std::unique_ptr<DeviceBuffer>> send, recv;
  std::vector<void*> handles;
  for (int r = 0; r < 2; ++r) {
    send.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(int32_t)));
    recv.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(int32_t)));
    for (size_t i = 0; i < kCount; ++i) send.back()->host<int32_t>()[i] = int32_t(r * 1000003 + int(i));
    for (auto* b : {send.back().get(), recv.back().get()}) {
      void* h = nullptr;
      ASSERT_EQ(ncclCommRegister(comms_[size_t(r)], b->ptr, b->bytes, &h), ncclSuccess);
      handles.push_back(h);
    }
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclSend(send[size_t(r)]->ptr, kCount, ncclInt32, 1 - r, comms_[size_t(r)], asCuda(streams_[size_t(r)])),
              ncclSuccess);
    ASSERT_EQ(ncclRecv(recv[size_t(r)]->ptr, kCount, ncclInt32, 1 - r, comms_[size_t(r)], asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(recv[size_t(r)]->host<int32_t>()[i], int32_t((1 - r) * 1000003 + int(i))) << "rank " << r << " at " << i;
  // AllGather in place through the registered receive buffers.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    char* base = static_cast<char*>(recv[size_t(r)]->ptr);
    const size_t half = kCount / 2;
    std::memcpy(EmulatedDevice::hostView(base + size_t(r) * half * 4), send[size_t(r)]->host<int32_t>(), half * 4);
    ASSERT_EQ(ncclAllGather(base + size_t(r) * half * 4, base, half, ncclInt32, comms_[size_t(r)],
                            asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
  for (int r = 0; r < 2; ++r)
    for (int p = 0; p < 2; ++p)
      for (size_t i = 0; i < kCount / 2; ++i)
        ASSERT_EQ(recv[size_t(r)]->host<int32_t>()[size_t(p) * (kCount / 2) + i], int32_t(p * 1000003 + int(i)));
  // A Reduce from registered buffers: the root's last step receives from a
  // registered buffer, and the other rank's stream is released only once
  // the root said it copied it (each stream drained on its own).
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < kCount; ++i) send[size_t(r)]->host<int32_t>()[i] = int32_t(r + 1);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclReduce(send[size_t(r)]->ptr, recv[size_t(r)]->ptr, kCount, ncclInt32, ncclSum, 0, comms_[size_t(r)],
                         asCuda(streams_[size_t(r)])),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_TRUE(drains(streams_[1]));
  ASSERT_TRUE(drains(streams_[0]));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(recv[0]->host<int32_t>()[i], 3) << "at " << i;
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 2; ++k) EXPECT_EQ(ncclCommDeregister(comms_[size_t(r)], handles[size_t(2 * r + k)]), ncclSuccess);
}

// ncclCommFinalize returns only once the queued work has run.
TEST_F(CudaMode, FinalizeWaitsForQueuedWork) {
  makeRanks(2);
  constexpr size_t kCount = 1000;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  for (int r = 0; r < 2; ++r) {
    bufs.push_back(std::make_unique<DeviceBuffer>(kCount * 4));
    std::fill_n(bufs.back()->host<float>(), kCount, 1.0f);
  }
  Latch latch;
  latch.holdStream(streams_[0]);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclAllReduce(bufs[size_t(r)]->ptr, bufs[size_t(r)]->ptr, kCount, ncclFloat, ncclSum,
                            comms_[size_t(r)], asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  auto finalize = std::async(std::launch::async, [&] {
    ncclResult_t r0 = ncclCommFinalize(comms_[0]);
    ncclResult_t r1 = ncclCommFinalize(comms_[1]);
    return r0 == ncclSuccess && r1 == ncclSuccess;
  });
  EXPECT_EQ(finalize.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "ncclCommFinalize returned while rank 0's operation was still held behind its stream";
  latch.open();
  ASSERT_EQ(finalize.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(finalize.get());
  for (int r = 0; r < 2; ++r) EXPECT_EQ(bufs[size_t(r)]->host<float>()[kCount - 1], 2.0f);
}

// LOOM_CHECK_COLLECTIVES on device buffers: a group whose ranks disagree
// queues nothing (the streams drain, the outputs keep their values) and
// fails naming the calls; the communicators go on.
TEST_F(CudaMode, CollectiveCheckQueuesNothingOnAMismatch) {
  setenv("LOOM_CHECK_COLLECTIVES", "1", 1);
  loom::settings::reload();
  makeRanks(3);
  unsetenv("LOOM_CHECK_COLLECTIVES");
  loom::settings::reload();
  constexpr size_t kCount = 4099;
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  for (int r = 0; r < n(); ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    out.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    std::fill_n(in.back()->host<float>(), kCount, float(r + 1));
    std::fill_n(out.back()->host<float>(), kCount, -1.0f);
  }
  auto group = [&](int odd, size_t oddCount) {
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n(); ++r) {
      EXPECT_EQ(ncclAllReduce(in[size_t(r)]->ptr, out[size_t(r)]->ptr, r == odd ? oddCount : kCount, ncclFloat,
                              ncclSum, comms_[size_t(r)], asCuda(streams_[size_t(r)])),
                ncclSuccess);
    }
    return ncclGroupEnd();
  };
  EXPECT_EQ(group(2, kCount - 1), ncclInvalidUsage);
  const std::string error = ncclGetLastError(nullptr);
  EXPECT_NE(error.find("ranks 0-1 call AllReduce of 4099 x float (sum); rank 2 calls AllReduce of 4098"),
            std::string::npos)
      << error;
  for (int r = 0; r < n(); ++r) {
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    EXPECT_EQ(out[size_t(r)]->host<float>()[0], -1.0f) << "rank " << r << ": the mismatched call ran";
  }
  ASSERT_EQ(group(-1, 0), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n(); ++r) {
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    EXPECT_EQ(out[size_t(r)]->host<float>()[kCount - 1], 6.0f) << "rank " << r;
  }
  // A host communicator in the same group still runs when the device ones
  // disagree (its peers may have grouped it apart).
  ASSERT_EQ(loomSetBufferMode(loomBufferModeHost), ncclSuccess);
  ncclComm_t host[3] = {nullptr, nullptr, nullptr};
  ASSERT_EQ(ncclCommInitAll(host, 3, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(loomSetBufferMode(loomBufferModeCuda), ncclSuccess);
  std::vector<std::vector<float>> hostBuf(3, std::vector<float>(64, 1.0f));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n(); ++r) {
    ASSERT_EQ(ncclAllReduce(hostBuf[size_t(r)].data(), hostBuf[size_t(r)].data(), 64, ncclFloat, ncclSum, host[r],
                            nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(in[size_t(r)]->ptr, out[size_t(r)]->ptr, r == 0 ? 7 : 8, ncclFloat, ncclSum,
                            comms_[size_t(r)], asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  for (int r = 0; r < n(); ++r) EXPECT_EQ(hostBuf[size_t(r)][63], 3.0f) << "rank " << r;
  for (ncclComm_t c : host) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclCommGrow in cuda mode: the old ranks' grown communicators keep their
// mode and devices; the new rank's comes from its own thread's mode; an
// AllReduce on device buffers runs on all three.
TEST_F(CudaMode, GrowKeepsTheModeAndDevice) {
  makeRanks(2);
  ncclUniqueId id;
  ASSERT_EQ(ncclCommGetUniqueId(comms_[0], &id), ncclSuccess) << ncclGetLastError(comms_[0]);
  std::vector<ncclComm_t> grown(3, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      if (r < 2) {
        EXPECT_EQ(ncclCommGrow(comms_[size_t(r)], 3, r == 0 ? &id : nullptr, -1, &grown[size_t(r)], nullptr),
                  ncclSuccess)
            << ncclGetLastError(nullptr);
      } else {
        ASSERT_EQ(loomSetBufferMode(loomBufferModeCuda), ncclSuccess);
        ASSERT_TRUE(emu().setDevice(1).isOk());
        EXPECT_EQ(ncclCommGrow(nullptr, 3, &id, 2, &grown[2], nullptr), ncclSuccess) << ncclGetLastError(nullptr);
      }
    });
  }
  for (auto& t : threads) t.join();
  streams_.push_back(streamOn(1));  // the new rank's
  constexpr size_t kCount = 1000;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  for (int r = 0; r < 3; ++r) {
    ASSERT_NE(grown[size_t(r)], nullptr);
    loomBufferMode_t mode = loomBufferModeDefault;
    ASSERT_EQ(loomCommGetBufferMode(grown[size_t(r)], &mode), ncclSuccess);
    EXPECT_EQ(mode, loomBufferModeCuda) << "rank " << r;
    int device = -1;
    ASSERT_EQ(ncclCommCuDevice(grown[size_t(r)], &device), ncclSuccess);
    EXPECT_EQ(device, r < 2 ? r % 2 : 1) << "rank " << r;
    bufs.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    std::fill_n(bufs.back()->host<float>(), kCount, float(r + 1));
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ncclAllReduce(bufs[size_t(r)]->ptr, bufs[size_t(r)]->ptr, kCount, ncclFloat, ncclSum, grown[size_t(r)],
                            asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    EXPECT_EQ(bufs[size_t(r)]->host<float>()[kCount - 1], 6.0f) << "rank " << r;
  }
  for (ncclComm_t c : grown) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// A rank whose peer never calls: ncclCommAbort releases its stream, with
// the operation's work abandoned.
TEST_F(CudaMode, AbortReleasesTheStream) {
  makeRanks(2);
  DeviceBuffer buf(4096);
  ASSERT_EQ(ncclAllReduce(buf.ptr, buf.ptr, 1024, ncclFloat, ncclSum, comms_[0], asCuda(streams_[0])), ncclSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_GT(emu().pending(streams_[0]), 0u) << "the stream should wait for the operation";
  ASSERT_EQ(ncclCommAbort(comms_[0]), ncclSuccess);
  comms_[0] = nullptr;
  EXPECT_TRUE(drains(streams_[0], 10));
}

// A peer that fails mid-operation: the waiting rank's operation fails, its
// stream is released, and the error is sticky and asynchronous.
TEST_F(CudaMode, FailedPeerIsAnAsyncErrorAndReleasesTheStream) {
  makeRanks(2);
  DeviceBuffer buf(4096);
  ASSERT_EQ(ncclAllReduce(buf.ptr, buf.ptr, 1024, ncclFloat, ncclSum, comms_[0], asCuda(streams_[0])), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(comms_[1]), ncclSuccess);
  comms_[1] = nullptr;
  EXPECT_TRUE(drains(streams_[0], 30));
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 300 && async == ncclSuccess; ++i) {
    ASSERT_EQ(ncclCommGetAsyncError(comms_[0], &async), ncclSuccess);
    if (async == ncclSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(async, ncclSuccess);
  EXPECT_NE(ncclAllReduce(buf.ptr, buf.ptr, 1024, ncclFloat, ncclSum, comms_[0], asCuda(streams_[0])), ncclSuccess)
      << "a failed communicator must refuse new work";
}

// A PreMulSum scalar in device memory is read when the operation runs:
// a write queued on the stream before the call is seen.
TEST_F(CudaMode, DeviceScalarIsReadWhenTheOperationRuns) {
  makeRanks(2);
  constexpr size_t kCount = 513;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs, scalars;
  std::vector<ncclRedOp_t> ops(2);
  Latch latch;
  for (int r = 0; r < 2; ++r) {
    scalars.push_back(std::make_unique<DeviceBuffer>(sizeof(float)));
    *scalars.back()->host<float>() = 1.0f;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&ops[size_t(r)], scalars.back()->ptr, ncclFloat, ncclScalarDevice,
                                       comms_[size_t(r)]),
              ncclSuccess);
    bufs.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    std::fill_n(bufs.back()->host<float>(), kCount, float(r + 1));
  }
  for (int r = 0; r < 2; ++r) {
    float* s = scalars[size_t(r)]->host<float>();
    latch.holdStream(streams_[size_t(r)], [s] { *s = 0.5f; });
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclAllReduce(bufs[size_t(r)]->ptr, bufs[size_t(r)]->ptr, kCount, ncclFloat, ops[size_t(r)],
                            comms_[size_t(r)], asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  latch.open();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    EXPECT_EQ(bufs[size_t(r)]->host<float>()[kCount - 1], 1.5f);  // 0.5 * (1 + 2)
    EXPECT_EQ(ncclRedOpDestroy(ops[size_t(r)], comms_[size_t(r)]), ncclSuccess);
  }
}

// loomSetBufferMode: host communicators beside cuda ones in one process,
// each behaving as its mode says.
TEST_F(CudaMode, HostAndCudaCommunicatorsSideBySide) {
  makeRanks(2);
  ASSERT_EQ(loomSetBufferMode(loomBufferModeHost), ncclSuccess);
  ncclComm_t host[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclCommInitAll(host, 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(loomSetBufferMode(loomBufferModeCuda), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    loomBufferMode_t mode = loomBufferModeDefault;
    ASSERT_EQ(loomCommGetBufferMode(host[r], &mode), ncclSuccess);
    EXPECT_EQ(mode, loomBufferModeHost);
    ASSERT_EQ(loomCommGetBufferMode(comms_[size_t(r)], &mode), ncclSuccess);
    EXPECT_EQ(mode, loomBufferModeCuda);
    int device = 0;
    ASSERT_EQ(ncclCommCuDevice(host[r], &device), ncclSuccess);
    EXPECT_EQ(device, -1) << "a host communicator has no device";
  }
  // Host buffers on the host communicators (complete at ncclGroupEnd),
  // device buffers on the cuda ones (complete on their streams).
  std::vector<float> hostBuf[2] = {std::vector<float>(64, 1.0f), std::vector<float>(64, 2.0f)};
  DeviceBuffer dev0(64 * sizeof(float)), dev1(64 * sizeof(float));
  DeviceBuffer* dev[2] = {&dev0, &dev1};
  for (int r = 0; r < 2; ++r) std::fill_n(dev[r]->host<float>(), 64, float(10 * (r + 1)));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclAllReduce(hostBuf[r].data(), hostBuf[r].data(), 64, ncclFloat, ncclSum, host[r], nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(dev[r]->ptr, dev[r]->ptr, 64, ncclFloat, ncclSum, comms_[size_t(r)],
                            asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(hostBuf[r][63], 3.0f);
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    EXPECT_EQ(dev[r]->host<float>()[63], 30.0f);
    EXPECT_EQ(ncclCommDestroy(host[r]), ncclSuccess);
  }
  EXPECT_EQ(loomSetBufferMode(loomBufferMode_t(7)), ncclInvalidArgument);
}

// ncclMemAlloc gives device memory in cuda mode (usable by the calls),
// ncclMemFree gives it back.
TEST_F(CudaMode, MemAllocGivesDeviceMemory) {
  makeRanks(2);
  const size_t before = emu().liveAllocations();
  void* bufs[2] = {nullptr, nullptr};
  for (auto& b : bufs) {
    ASSERT_EQ(ncclMemAlloc(&b, 1024 * sizeof(float)), ncclSuccess);
    EXPECT_TRUE(EmulatedDevice::isDevicePointer(b));
    std::fill_n(static_cast<float*>(EmulatedDevice::hostView(b)), 1024, 2.0f);
  }
  EXPECT_EQ(emu().liveAllocations(), before + 2);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclAllReduce(bufs[r], bufs[r], 1024, ncclFloat, ncclSum, comms_[size_t(r)], asCuda(streams_[size_t(r)])),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    EXPECT_EQ(static_cast<float*>(EmulatedDevice::hostView(bufs[r]))[1023], 4.0f);
  }
  const size_t beforeFree = emu().liveAllocations();  // the queues' staging memory came meanwhile
  for (void* b : bufs) EXPECT_EQ(ncclMemFree(b), ncclSuccess);
  EXPECT_EQ(emu().liveAllocations(), beforeFree - 2);
  EXPECT_EQ(ncclMemFree(bufs[0]), ncclInvalidArgument) << "a second free is refused";
}

// Captured into a graph: nothing runs at the call; each replay runs the
// collective again, after the work queued before it on the stream and
// before the work after it, reading the buffers' contents of that moment.
// Replays after the communicators are gone run nothing and never hang.
TEST_F(CudaMode, CapturedCollectiveReplaysInStreamOrder) {
  makeRanks(2);
  constexpr size_t kCount = 3000;
  constexpr int kReplays = 10;
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  for (int r = 0; r < 2; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    out.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(float)));
    std::fill_n(out.back()->host<float>(), kCount, -1.0f);
  }
  for (int r = 0; r < 2; ++r) emu().beginCapture(streams_[size_t(r)]);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllReduce(in[size_t(r)]->ptr, out[size_t(r)]->ptr, kCount, ncclFloat, ncclSum, comms_[size_t(r)],
                            asCuda(streams_[size_t(r)])),
              ncclSuccess)
        << ncclGetLastError(comms_[size_t(r)]);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  std::shared_ptr<EmulatedDevice::Graph> graphs[2];
  for (int r = 0; r < 2; ++r) graphs[r] = emu().endCapture(streams_[size_t(r)]);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(out[0]->host<float>()[0], -1.0f) << "capturing must not run the collective";

  std::vector<std::vector<float>> seen(2 * kReplays);
  for (int k = 1; k <= kReplays; ++k) {
    for (int r = 0; r < 2; ++r) {
      float* src = in[size_t(r)]->host<float>();
      emu().launch(streams_[size_t(r)], [src, r, k] { std::fill_n(src, kCount, float((r + 1) * k)); });
      emu().launchGraph(*graphs[r], streams_[size_t(r)]);
      const float* dst = out[size_t(r)]->host<float>();
      auto* keep = &seen[size_t(2 * (k - 1) + r)];
      emu().launch(streams_[size_t(r)], [dst, keep] { keep->assign(dst, dst + kCount); });
    }
  }
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(drains(streams_[size_t(r)]));
  for (int k = 1; k <= kReplays; ++k)
    for (int r = 0; r < 2; ++r) {
      const auto& v = seen[size_t(2 * (k - 1) + r)];
      ASSERT_EQ(v.size(), kCount);
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(v[i], float(3 * k)) << "replay " << k << " rank " << r;
    }

  // A call made right after launching the graph on the same stream, while
  // the stream is still busy: the replay runs first, then the call.
  Latch latch;
  for (int r = 0; r < 2; ++r) {
    latch.holdStream(streams_[size_t(r)]);
    float* src = in[size_t(r)]->host<float>();
    emu().launch(streams_[size_t(r)], [src, r] { std::fill_n(src, kCount, float(r + 1)); });
    emu().launchGraph(*graphs[r], streams_[size_t(r)]);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllReduce(out[size_t(r)]->ptr, out[size_t(r)]->ptr, kCount, ncclFloat, ncclSum, comms_[size_t(r)],
                            asCuda(streams_[size_t(r)])),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  latch.open();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(drains(streams_[size_t(r)])) << "a call after a graph launch hangs";
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[size_t(r)]->host<float>()[i], 6.0f) << "replay, then the call";

  for (ncclComm_t& c : comms_) {
    ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    c = nullptr;
  }
  for (int r = 0; r < 2; ++r) emu().launchGraph(*graphs[r], streams_[size_t(r)]);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(drains(streams_[size_t(r)])) << "a replay without its communicator hangs";
}

// A graph replayed on another stream than its capture stream, with a call
// made after it on that stream: the queue runs calls in call order and
// cannot see that the call waits for the replay, so they wait for each
// other. The stall is named in a warning (after LOOM_STALL_WARN_S), and
// abort still releases every stream.
TEST_F(CudaMode, ReplayOnAnotherStreamHeldBehindACallIsNamed) {
  setenv("LOOM_STALL_WARN_S", "1", 1);
  loom::settings::reload();
  makeRanks(2);
  unsetenv("LOOM_STALL_WARN_S");
  loom::settings::reload();
  constexpr size_t kCount = 1000;
  DeviceBuffer buf0(kCount * sizeof(float)), buf1(kCount * sizeof(float));
  DeviceBuffer* buf[2] = {&buf0, &buf1};
  for (int r = 0; r < 2; ++r) emu().beginCapture(streams_[size_t(r)]);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllReduce(buf[r]->ptr, buf[r]->ptr, kCount, ncclFloat, ncclSum, comms_[size_t(r)],
                            asCuda(streams_[size_t(r)])),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  std::shared_ptr<EmulatedDevice::Graph> graphs[2];
  for (int r = 0; r < 2; ++r) graphs[r] = emu().endCapture(streams_[size_t(r)]);
  Stream other[2] = {streamOn(0), streamOn(1)};
  Latch latch;  // the call is queued before the replay reaches the host
  for (int r = 0; r < 2; ++r) {
    latch.holdStream(other[r]);
    emu().launchGraph(*graphs[r], other[r]);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllReduce(buf[r]->ptr, buf[r]->ptr, kCount, ncclFloat, ncclSum, comms_[size_t(r)],
                            asCuda(other[r])),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  LOOM_WARN("test: no stall warning yet");  // lastWarning() is the process's
  latch.open();
  bool named = false;
  for (int i = 0; i < 100 && !named; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    named = std::string(loom::log::lastWarning()).find("graph replay has been ready") != std::string::npos;
  }
  EXPECT_TRUE(named) << "last warning: " << loom::log::lastWarning();
  // Both at once, as the ranks' processes would: freeing one's device
  // memory waits for the device, so for the other's held stream too.
  std::vector<std::future<ncclResult_t>> aborts;
  for (ncclComm_t c : comms_) aborts.push_back(std::async(std::launch::async, [c] { return ncclCommAbort(c); }));
  for (auto& a : aborts) EXPECT_EQ(a.get(), ncclSuccess);
  for (ncclComm_t& c : comms_) c = nullptr;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(drains(other[r])) << "abort must release the replay's stream";
    emu().destroyStream(other[r]);
  }
}

// A captured group must keep each communicator's calls on one stream: else
// refused at the call, with the reason.
TEST_F(CudaMode, CaptureAcrossStreamsIsRefusedClearly) {
  makeRanks(1);
  DeviceBuffer buf(4096);
  Stream other = emu().createStream().value();
  emu().beginCapture(streams_[0]);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf.ptr, buf.ptr, 512, ncclFloat, ncclSum, comms_[0], asCuda(streams_[0])), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf.ptr, buf.ptr, 512, ncclFloat, ncclSum, comms_[0], asCuda(other)), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comms_[0])).find("use the same stream"), std::string::npos)
      << ncclGetLastError(comms_[0]);
  emu().endCapture(streams_[0]);
  EXPECT_TRUE(drains(other));
  emu().destroyStream(other);
}

// Many operations queued on several streams per rank without waiting in
// between: they run in call order and every stream drains.
TEST_F(CudaMode, ManyQueuedOperationsAcrossStreams) {
  makeRanks(2);
  constexpr int kOps = 20;
  constexpr size_t kCount = 257;
  Stream extra[2] = {streamOn(0), streamOn(1)};
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  for (int r = 0; r < 2; ++r) {
    bufs.push_back(std::make_unique<DeviceBuffer>(kCount * sizeof(int32_t)));
    std::fill_n(bufs.back()->host<int32_t>(), kCount, 1);
  }
  for (int k = 0; k < kOps; ++k) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      Stream s = k % 2 ? extra[r] : streams_[size_t(r)];
      ASSERT_EQ(ncclAllReduce(bufs[size_t(r)]->ptr, bufs[size_t(r)]->ptr, kCount, ncclInt32, ncclSum,
                              comms_[size_t(r)], asCuda(s)),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(drains(streams_[size_t(r)]));
    ASSERT_TRUE(drains(extra[r]));
    emu().destroyStream(extra[r]);
  }
  // Each operation doubles: the streams' interleaving never reordered them.
  for (int r = 0; r < 2; ++r) EXPECT_EQ(bufs[size_t(r)]->host<int32_t>()[kCount - 1], 1 << kOps);
}

// A driver that is installed but cannot be used (older than the runtime)
// is an error for cuda mode, never "no GPU": auto would otherwise take
// host mode and be handed device pointers. Host mode still works.
TEST(CudaModeDriver, UnusableDriverIsAnErrorNotHostMode) {
  EmulatedDevice::Options options;
  options.driverError = "the CUDA driver here (CUDA 12.2) is older than the CUDA runtime";
  EmulatedDevice old(options);
  loom::device::setApiForTesting(&old);
  ASSERT_EQ(loomSetBufferMode(loomBufferModeCuda), ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitAll(&comm, 1, nullptr), ncclUnhandledCudaError);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("older than the CUDA runtime"), std::string::npos)
      << ncclGetLastError(nullptr);
  ASSERT_EQ(loomSetBufferMode(loomBufferModeHost), ncclSuccess);
  ASSERT_EQ(ncclCommInitAll(&comm, 1, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  loomBufferMode_t mode = loomBufferModeDefault;
  ASSERT_EQ(loomCommGetBufferMode(comm, &mode), ncclSuccess);
  EXPECT_EQ(mode, loomBufferModeHost);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  ASSERT_EQ(loomSetBufferMode(loomBufferModeDefault), ncclSuccess);
  loom::device::setApiForTesting(nullptr);
}

}  // namespace
