// The CUDA IPC transport (transport/cudaipc) on the emulated device, both
// halves in this process driven by one thread (ranks in other processes:
// cuda_mode_process_test): the Connection contract on device buffers
// (order, sizes, zero bytes, back pressure over the 8 slots, a size
// mismatch), registered buffers copied directly, pieces handed to a
// holding sink, a peer that leaves, and a handle that cannot be mapped.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/settings.h"
#include "common/time.h"
#include "emulated_device.h"
#include "transport/cudaipc/connection.h"
#include "transport/cudaipc/endpoint.h"
#include "transport/cudaipc/transport.h"

namespace loom::transport {
namespace {

using test::EmulatedDevice;

EmulatedDevice& emu() {
  static EmulatedDevice* d = new EmulatedDevice(EmulatedDevice::Options::with(1, 200));
  return *d;
}

struct Pair {
  std::unique_ptr<Connection> a, b;
};

// Through the registry's backend, as core sets it up. With `asProcesses`
// each half takes the other for a rank of another process (the IPC handles
// are opened: the emulated device maps them through /proc/self/fd).
Result<Pair> makePair(bool asProcesses = false) {
  const Backend& backend = cudaipc::backend();
  Pair p;
  std::vector<uint8_t> ea, eb;
  LOOM_ASSIGN_OR_RETURN(p.a, backend.listen(1, Selection{}, &ea));
  LOOM_ASSIGN_OR_RETURN(p.b, backend.listen(0, Selection{}, &eb));
  if (asProcesses) {
    for (auto* blob : {&ea, &eb}) {
      LOOM_ASSIGN_OR_RETURN(cudaipc::Descriptor d, cudaipc::readEndpoint(*blob));
      d.processNonce ^= 1;
      cudaipc::writeEndpoint(d, blob);
    }
  }
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
  // Small slots (NCCL_BUFFSIZE / 8 = 32 KiB): many pieces per message and
  // back pressure with little data, which keeps the sanitizer tiers fast.
  void SetUp() override {
    setenv("NCCL_BUFFSIZE", "262144", 1);
    settings::reload();
    device::setApiForTesting(&emu());
    allocations_ = emu().liveAllocations();
  }
  void TearDown() override {
    EXPECT_EQ(emu().liveAllocations(), allocations_) << "inboxes and mappings must be given back";
    EXPECT_EQ(emu().liveEvents(), 0u);
    device::setApiForTesting(nullptr);
    unsetenv("NCCL_BUFFSIZE");
    settings::reload();
  }
  static constexpr size_t kSlot = 32 << 10;
  size_t allocations_ = 0;
};

// Mixed sizes (zero, one piece, many pieces, more than all 8 slots at once)
// in both directions, device to device, in order and intact.
class CudaIpcPair : public CudaIpc, public ::testing::WithParamInterface<bool> {};
INSTANTIATE_TEST_SUITE_P(Peers, CudaIpcPair, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "processes" : "threads"; });

TEST_P(CudaIpcPair, MixedSizesArriveInOrderBothWays) {
  auto pair = makePair(GetParam());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  Pair& p = pair.value();
  EXPECT_STREQ(p.a->kind(), "cudaipc");
  // One slot, one slot and a byte, more than all 8 slots, a bit of both.
  const std::vector<size_t> sizes = {0, 1, 4095, kSlot, kSlot + 1, 10 * kSlot, 0, 77, 19 * kSlot + 3};
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
  DeviceBytes a(3 * kSlot), b(3 * kSlot);
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

// A send from a registered buffer of at least one slot skips the inboxes:
// the receiver copies it directly (one copy), in order with the messages
// around it, and the send is done only once it has.
TEST_P(CudaIpcPair, RegisteredSendsAreCopiedDirectlyInOrder) {
  auto pair = makePair(GetParam());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  Pair& p = pair.value();
  auto* a = static_cast<cudaipc::CudaIpcConnection*>(p.a.get());
  DeviceBytes big(12 * kSlot), small(1000), bigOut(12 * kSlot), smallOut(1000), small2Out(1000);
  std::mt19937 rng(3);
  for (size_t k = 0; k < big.bytes; ++k) big.host()[k] = uint8_t(rng());
  for (size_t k = 0; k < small.bytes; ++k) small.host()[k] = uint8_t(rng());
  // Registered: a buffer inside a larger allocation (an offset to carry).
  char* inside = static_cast<char*>(big.ptr) + 4096;
  const size_t n = big.bytes - 8192;
  auto region = p.a->registerMemory(inside, n, MemoryType::kDevice);
  ASSERT_TRUE(region.isOk()) << region.status().message();
  EXPECT_FALSE(p.a->registerMemory(inside, big.bytes, MemoryType::kDevice).isOk())
      << "a region past the end of its allocation must be refused";
  Transfer s1{small.ptr, small.bytes, MemoryType::kDevice}, s2{inside, n, MemoryType::kDevice},
      s3{small.ptr, small.bytes, MemoryType::kDevice};
  s2.region = region.value().get();
  Transfer r1{smallOut.ptr, small.bytes, MemoryType::kDevice}, r2{bigOut.ptr, n, MemoryType::kDevice},
      r3{small2Out.ptr, small.bytes, MemoryType::kDevice};
  for (Transfer* t : {&s1, &s2, &s3}) ASSERT_TRUE(p.a->postSend(t).isOk());
  for (Transfer* t : {&r1, &r2, &r3}) ASSERT_TRUE(p.b->postRecv(t).isOk());
  bool orderKept = true, directDoneWhenReceived = true;
  Status st = drive(p, [&] {
    orderKept = orderKept && (!s3.done || s2.done);
    directDoneWhenReceived = directDoneWhenReceived && (!s2.done || r2.done);
    return s1.done && s2.done && s3.done && r1.done && r2.done && r3.done;
  });
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_TRUE(orderKept) << "sends must finish in order";
  EXPECT_EQ(std::memcmp(bigOut.host(), big.host() + 4096, n), 0);
  EXPECT_EQ(std::memcmp(smallOut.host(), small.host(), small.bytes), 0);
  EXPECT_EQ(std::memcmp(small2Out.host(), small.host(), small.bytes), 0);
  auto* b = static_cast<cudaipc::CudaIpcConnection*>(p.b.get());
  if (!GetParam()) {
    EXPECT_TRUE(directDoneWhenReceived) << "a direct send is done only once the peer copied it";
    EXPECT_EQ(a->directSends(), 1u);
    EXPECT_EQ(b->declinedPulls(), 0u);
    return;
  }
  // Another process's buffer is mapped only by prepare() (mapping may wait
  // for the whole device): the receiver declined, the message went through
  // the inboxes, and the same buffer goes direct once prepare() ran.
  EXPECT_EQ(a->directSends(), 0u);
  EXPECT_EQ(b->declinedPulls(), 1u);
  ASSERT_TRUE(p.b->prepare().isOk());
  std::memset(bigOut.host(), 0, bigOut.bytes);
  Transfer again{inside, n, MemoryType::kDevice}, againIn{bigOut.ptr, n, MemoryType::kDevice};
  again.region = region.value().get();
  ASSERT_TRUE(p.a->postSend(&again).isOk());
  ASSERT_TRUE(p.b->postRecv(&againIn).isOk());
  directDoneWhenReceived = true;  // the declined send was done once in the inbox
  st = drive(p, [&] {
    directDoneWhenReceived = directDoneWhenReceived && (!again.done || againIn.done);
    return again.done && againIn.done;
  });
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_TRUE(directDoneWhenReceived) << "a direct send is done only once the peer copied it";
  EXPECT_EQ(a->directSends(), 1u);
  EXPECT_EQ(b->declinedPulls(), 1u);
  EXPECT_EQ(std::memcmp(bigOut.host(), big.host() + 4096, n), 0);
}

// Memory CUDA IPC cannot export (cudaMallocAsync pools, PyTorch's
// expandable segments) registers all the same; its messages go through the
// inboxes instead of failing.
TEST_F(CudaIpc, RegisteredMemoryThatCannotBeExportedGoesThroughTheInbox) {
  auto pair = makePair();
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  Pair& p = pair.value();
  DeviceBytes big(4 * kSlot), out(4 * kSlot);
  std::mt19937 rng(5);
  for (size_t k = 0; k < big.bytes; ++k) big.host()[k] = uint8_t(rng());
  emu().refuseIpcExport(true);
  auto region = p.a->registerMemory(big.ptr, big.bytes, MemoryType::kDevice);
  emu().refuseIpcExport(false);
  ASSERT_TRUE(region.isOk()) << region.status().message();
  Transfer send{big.ptr, big.bytes, MemoryType::kDevice}, recv{out.ptr, out.bytes, MemoryType::kDevice};
  send.region = region.value().get();
  ASSERT_TRUE(p.a->postSend(&send).isOk());
  ASSERT_TRUE(p.b->postRecv(&recv).isOk());
  Status st = drive(p, [&] { return send.done && recv.done; });
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(std::memcmp(out.host(), big.host(), big.bytes), 0);
  EXPECT_EQ(static_cast<cudaipc::CudaIpcConnection*>(p.a.get())->directSends(), 0u);
}

// A receive with a holding sink is handed each piece where it lies in the
// inbox (no copy); its slot goes back only at release(), so a sender that
// filled all 8 slots waits until the sink's consumer is done.
TEST_F(CudaIpc, HeldSinkPiecesKeepTheirSlotsUntilReleased) {
  auto pair = makePair();
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  Pair& p = pair.value();
  auto* b = static_cast<cudaipc::CudaIpcConnection*>(p.b.get());
  constexpr int kMessages = 12;
  const size_t n = kSlot;  // one slot each
  struct Copier final : Sink {
    void consume(size_t offset, const void* bytes, size_t count) override {
      std::memcpy(static_cast<uint8_t*>(EmulatedDevice::hostView(dst)) + offset, EmulatedDevice::hostView(bytes), count);
      ++pieces;
    }
    void* dst = nullptr;
    int pieces = 0;
  };
  std::vector<std::unique_ptr<DeviceBytes>> src, dst;
  std::vector<Copier> sinks(kMessages);
  std::vector<Transfer> sends(kMessages), recvs(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    src.push_back(std::make_unique<DeviceBytes>(n));
    dst.push_back(std::make_unique<DeviceBytes>(n));
    std::memset(src.back()->host(), 'a' + i, n);
    sinks[size_t(i)].dst = dst.back()->ptr;
    sends[size_t(i)] = Transfer{src.back()->ptr, n, MemoryType::kDevice};
    recvs[size_t(i)] = Transfer{dst.back()->ptr, n, MemoryType::kDevice};
    recvs[size_t(i)].sink = &sinks[size_t(i)];
    recvs[size_t(i)].hold = true;
    ASSERT_TRUE(p.a->postSend(&sends[size_t(i)]).isOk());
    ASSERT_TRUE(p.b->postRecv(&recvs[size_t(i)]).isOk());
  }
  auto doneCount = [&] {
    int k = 0;
    for (const Transfer& r : recvs) k += r.done;
    return k;
  };
  ASSERT_TRUE(drive(p, [&] { return doneCount() == int(cudaipc::kSlots); }).isOk());
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(p.a->progress().isOk());
    ASSERT_TRUE(p.b->progress().isOk());
  }
  EXPECT_EQ(doneCount(), int(cudaipc::kSlots)) << "held slots must not be reused before release";
  for (int i = 0; i < kMessages; ++i) {
    Status st = drive(p, [&] { return recvs[size_t(i)].done; });
    ASSERT_TRUE(st.isOk()) << st.message();
    EXPECT_TRUE(recvs[size_t(i)].sunk);
    ASSERT_TRUE(p.b->release(&recvs[size_t(i)]).isOk());
  }
  ASSERT_TRUE(drive(p, [&] {
    for (const Transfer& s : sends)
      if (!s.done) return false;
    return p.b->idle();
  }).isOk());
  EXPECT_EQ(b->piecesSunk(), uint64_t(kMessages));
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(sinks[size_t(i)].pieces, 1);
    EXPECT_EQ(std::memcmp(src[size_t(i)]->host(), dst[size_t(i)]->host(), n), 0) << "message " << i;
  }
}

// A mapping that cannot be opened fails connect() (the pair then moves on
// to the next backend; cuda_mode_process_test checks that part).
TEST_F(CudaIpc, AttachFailsWhenThePeersInboxCannotBeMapped) {
  auto a = cudaipc::CudaIpcConnection::create(1, &emu(), kSlot);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  cudaipc::Descriptor other = a.value()->local();
  other.processNonce ^= 1;  // "another process": through the IPC handle
  other.handle[0] ^= 0xff;  // ...which is not one
  auto b = cudaipc::CudaIpcConnection::create(0, &emu(), kSlot);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  Status st = b.value()->attach(other);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("mapping rank 0's inbox"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace loom::transport
