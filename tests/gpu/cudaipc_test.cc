// The CUDA IPC transport (transport/cudaipc) on the emulated device, both
// halves in this process driven by one thread (ranks in other processes:
// cuda_mode_process_test): the Connection contract on device buffers
// (order, sizes, zero bytes, back pressure over the 8 slots, a size
// mismatch), a peer that leaves, and a handle that cannot be mapped.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/time.h"
#include "emulated_device.h"
#include "transport/cudaipc/connection.h"
#include "transport/cudaipc/transport.h"

namespace loom::transport {
namespace {

using test::EmulatedDevice;

EmulatedDevice& emu() {
  static EmulatedDevice* d = new EmulatedDevice(EmulatedDevice::Options{1, 200});
  return *d;
}

struct Pair {
  std::unique_ptr<Connection> a, b;
};

Result<Pair> makePair() {
  const Backend& backend = cudaipc::backend();
  Pair p;
  std::vector<uint8_t> ea, eb;
  LOOM_ASSIGN_OR_RETURN(p.a, backend.listen(1, &ea));
  LOOM_ASSIGN_OR_RETURN(p.b, backend.listen(0, &eb));
  LOOM_TRY(backend.connect(*p.a, eb));
  LOOM_TRY(backend.connect(*p.b, ea));
  return p;
}

// Drives both halves until `finished`, an error (returned) or 30 s.
template <typename F>
Status drive(Pair& p, F finished) {
  Deadline deadline = Deadline::afterSeconds(30);
  while (!finished()) {
    if (p.a) LOOM_TRY(p.a->progress());
    if (p.b) LOOM_TRY(p.b->progress());
    if (deadline.expired()) return remoteError("test: timed out");
    std::this_thread::yield();
  }
  return Status::ok();
}

struct DeviceBytes {
  explicit DeviceBytes(size_t n) : bytes(n), ptr(emu().allocDevice(n).value()) {}
  ~DeviceBytes() { emu().freeDevice(ptr); }
  uint8_t* host() const { return static_cast<uint8_t*>(EmulatedDevice::hostView(ptr)); }
  size_t bytes;
  void* ptr;
};

class CudaIpc : public ::testing::Test {
 protected:
  void SetUp() override {
    device::setApiForTesting(&emu());
    allocations_ = emu().liveAllocations();
  }
  void TearDown() override {
    EXPECT_EQ(emu().liveAllocations(), allocations_) << "inboxes and mappings must be given back";
    EXPECT_EQ(emu().liveEvents(), 0u);
    device::setApiForTesting(nullptr);
  }
  size_t allocations_ = 0;
};

// Mixed sizes (zero, one piece, many pieces, more than all 8 slots at once)
// in both directions, device to device, in order and intact.
TEST_F(CudaIpc, MixedSizesArriveInOrderBothWays) {
  auto pair = makePair();
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  Pair& p = pair.value();
  EXPECT_STREQ(p.a->kind(), "cudaipc");
  const std::vector<size_t> sizes = {0, 1, 4095, 4096, 512 << 10, (512 << 10) + 1, 5 << 20, 0, 77, (9 << 20) + 3};
  std::mt19937 rng(7);
  std::vector<std::unique_ptr<DeviceBytes>> src, dst;
  std::vector<Transfer> sends(2 * sizes.size()), recvs(2 * sizes.size());
  for (size_t i = 0; i < 2 * sizes.size(); ++i) {
    const size_t n = sizes[i % sizes.size()];
    src.push_back(std::make_unique<DeviceBytes>(n));
    dst.push_back(std::make_unique<DeviceBytes>(n));
    for (size_t k = 0; k < n; ++k) src.back()->host()[k] = uint8_t(rng());
    std::memset(dst.back()->host(), 0xee, n);
    const bool aToB = i < sizes.size();
    sends[i] = Transfer{src.back()->ptr, n, MemoryType::kDevice};
    recvs[i] = Transfer{dst.back()->ptr, n, MemoryType::kDevice};
    ASSERT_TRUE((aToB ? p.a : p.b)->postSend(&sends[i]).isOk());
    ASSERT_TRUE((aToB ? p.b : p.a)->postRecv(&recvs[i]).isOk());
  }
  Status s = drive(p, [&] {
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (!recvs[i].done || !sends[i].done) return false;
      if (i > 0 && i != sizes.size() && !recvs[i - 1].done) ADD_FAILURE() << "receive " << i << " done before " << i - 1;
    }
    return true;
  });
  ASSERT_TRUE(s.isOk()) << s.message();
  for (size_t i = 0; i < src.size(); ++i)
    EXPECT_EQ(std::memcmp(src[i]->host(), dst[i]->host(), src[i]->bytes), 0) << "message " << i;
  EXPECT_TRUE(p.a->idle() && p.b->idle());
}

TEST_F(CudaIpc, SizeMismatchIsAnError) {
  auto pair = makePair();
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  Pair& p = pair.value();
  DeviceBytes a(1000), b(999);
  Transfer s{a.ptr, 1000, MemoryType::kDevice}, r{b.ptr, 999, MemoryType::kDevice};
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  Status st = drive(p, [&] { return r.done; });
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_NE(st.message().find("1000-byte message where a 999-byte receive"), std::string::npos) << st.message();
  EXPECT_FALSE(p.b->progress().isOk()) << "errors are sticky";
  ASSERT_TRUE(p.a->quiesce().isOk());
}

// A peer that leaves after its last message is no error; one that leaves
// while this side still waits for it is.
TEST_F(CudaIpc, PeerLeavingIsAnErrorOnlyWhileNeeded) {
  auto pair = makePair();
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  Pair& p = pair.value();
  DeviceBytes a(3 << 20), b(3 << 20);
  Transfer s{a.ptr, a.bytes, MemoryType::kDevice}, r{b.ptr, b.bytes, MemoryType::kDevice};
  ASSERT_TRUE(p.a->postSend(&s).isOk());
  ASSERT_TRUE(p.b->postRecv(&r).isOk());
  ASSERT_TRUE(drive(p, [&] { return r.done && s.done; }).isOk());
  p.a.reset();  // done and gone
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(p.b->progress().isOk());
  Transfer again{b.ptr, 16, MemoryType::kDevice};
  ASSERT_TRUE(p.b->postRecv(&again).isOk());
  Status st = drive(p, [&] { return again.done; });
  ASSERT_FALSE(st.isOk()) << "a receive from a peer that left must fail";
  EXPECT_EQ(st.code(), Code::kRemoteError);
  ASSERT_TRUE(p.b->quiesce().isOk());
}

// A mapping that cannot be opened fails connect() (the pair then moves on
// to the next backend; cuda_mode_process_test checks that part).
TEST_F(CudaIpc, AttachFailsWhenThePeersInboxCannotBeMapped) {
  auto a = cudaipc::CudaIpcConnection::create(1, &emu(), 1 << 20);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  cudaipc::Descriptor other = a.value()->local();
  other.processNonce ^= 1;  // "another process": through the IPC handle
  other.handle[0] ^= 0xff;  // ...which is not one
  auto b = cudaipc::CudaIpcConnection::create(0, &emu(), 1 << 20);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  Status st = b.value()->attach(other);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("mapping rank 0's inbox"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace loom::transport
