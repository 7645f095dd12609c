// More than 2^31 elements: one uint8 sum AllReduce of 2^31 + 5 elements on
// 2 ranks (threads). Rank 0 works in place, rank 1 out of place, so both
// the read and the write side are exercised past the 32-bit boundary.
// Memory: 2 GiB (rank 0) + 4 GiB (rank 1).
//
// Inputs follow a cheap pattern that depends on the high bits of the index
// too (element i and i + 2^31 differ), so an offset truncated to 32 bits
// shows up. Every element is compared; the guard bytes after each buffer
// must be untouched.
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <thread>

#include "mp_util.h"

namespace loom::test {
namespace {

constexpr size_t kCount = (size_t(1) << 31) + 5;
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xc3;

// Element i of rank r: a 256-entry table indexed by the low byte plus a
// term from the higher bits, so that whole 256-byte blocks can be filled and
// compared with vector code.
constexpr size_t kBlock = 256;
inline uint8_t lowTerm(size_t i) { return uint8_t((i & 255) * 0x9d); }
inline uint8_t highTerm(size_t i, int rank) {
  return uint8_t((i >> 8) * 3 + (i >> 31) * 0x71 + size_t(rank) * 0x3b);
}
inline uint8_t pattern(size_t i, int rank) { return uint8_t(lowTerm(i) + highTerm(i, rank)); }

// Fills or checks [begin, end) (begin a multiple of kBlock) block by block.
void fillPattern(uint8_t* dst, size_t begin, size_t end, int rank) {
  for (size_t b = begin; b < end; b += kBlock) {
    const uint8_t hi = highTerm(b, rank);
    const size_t n = std::min(kBlock, end - b);
    for (size_t j = 0; j < n; ++j) dst[b + j] = uint8_t(lowTerm(j) + hi);
  }
}
// First index in [begin, end) where buf differs from the sum of both
// ranks' patterns (sum) or rank 1's pattern (!sum); SIZE_MAX when none.
size_t firstMismatch(const uint8_t* buf, size_t begin, size_t end, bool sum) {
  uint8_t want[kBlock];
  for (size_t b = begin; b < end; b += kBlock) {
    const uint8_t hi = sum ? uint8_t(highTerm(b, 0) + highTerm(b, 1)) : highTerm(b, 1);
    const size_t n = std::min(kBlock, end - b);
    for (size_t j = 0; j < n; ++j) want[j] = uint8_t((sum ? 2 : 1) * lowTerm(j) + hi);
    if (std::memcmp(buf + b, want, n) != 0) {
      for (size_t j = 0; j < n; ++j)
        if (buf[b + j] != want[j]) return b + j;
    }
  }
  return SIZE_MAX;
}

// Runs fn(begin, end) over [0, count) on every core.
template <typename F>
void parallel(size_t count, F fn) {
  const size_t workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    const size_t part = count / workers / kBlock * kBlock;  // blocks never straddle two workers
    const size_t begin = part * w, end = w + 1 == workers ? count : part * (w + 1);
    threads.emplace_back([=] { fn(begin, end); });
  }
  for (auto& t : threads) t.join();
}

size_t availableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

struct Buffer {
  std::unique_ptr<uint8_t[]> mem;
  uint8_t* data() { return mem.get(); }
  bool allocate(size_t bytes) {
    mem.reset(new (std::nothrow) uint8_t[bytes + kGuard]);
    if (mem) std::memset(mem.get() + bytes, kGuardByte, kGuard);
    return bool(mem);
  }
  bool guardIntact(size_t bytes) const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem[bytes + i] != kGuardByte) return false;
    return true;
  }
};

TEST(LargeCount, AllReduceUint8SumOverTwoToThe31Elements) {
  if (availableBytes() < (size_t(7) << 30)) {
    GTEST_SKIP() << "needs about 7 GiB of free memory (6 GiB of buffers), "
                 << (availableBytes() >> 20) << " MiB available";
  }
  Buffer inPlace, send1, recv1;
  ASSERT_TRUE(inPlace.allocate(kCount) && send1.allocate(kCount) && recv1.allocate(kCount))
      << "cannot allocate 6 GiB";
  parallel(kCount, [&](size_t b, size_t e) {
    fillPattern(inPlace.data(), b, e, 0);
    fillPattern(send1.data(), b, e, 1);
  });
  std::memset(recv1.data(), 0x5a, 4096);  // the rest is overwritten unseen; the check covers all of it

  ncclComm_t comms[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  ncclResult_t rc[2] = {ncclInternalError, ncclInternalError};
  onRanks(2, [&](int r) {
    rc[r] = r == 0 ? ncclAllReduce(inPlace.data(), inPlace.data(), kCount, ncclUint8, ncclSum, comms[0], nullptr)
                   : ncclAllReduce(send1.data(), recv1.data(), kCount, ncclUint8, ncclSum, comms[1], nullptr);
  });
  ASSERT_EQ(rc[0], ncclSuccess) << ncclGetLastError(comms[0]);
  ASSERT_EQ(rc[1], ncclSuccess) << ncclGetLastError(comms[1]);

  // Samples around the 2^31 boundary first, for a readable message.
  for (size_t i : {size_t(0), (size_t(1) << 31) - 1, size_t(1) << 31, kCount - 1}) {
    const uint8_t want = uint8_t(pattern(i, 0) + pattern(i, 1));
    EXPECT_EQ(inPlace.data()[i], want) << "rank 0 element " << i;
    EXPECT_EQ(recv1.data()[i], want) << "rank 1 element " << i;
  }
  std::atomic<size_t> bad{0}, firstBad{SIZE_MAX};
  parallel(kCount, [&](size_t b, size_t e) {
    for (size_t at : {firstMismatch(inPlace.data(), b, e, true), firstMismatch(recv1.data(), b, e, true),
                      firstMismatch(send1.data(), b, e, false)}) {
      if (at == SIZE_MAX) continue;
      ++bad;
      size_t prev = firstBad.load();
      while (at < prev && !firstBad.compare_exchange_weak(prev, at)) {
      }
    }
  });
  EXPECT_EQ(bad.load(), 0u) << "buffer ranges with wrong elements; the first wrong element is " << firstBad.load()
                            << " (the send buffer of rank 1 must be unchanged too)";
  EXPECT_TRUE(inPlace.guardIntact(kCount) && send1.guardIntact(kCount) && recv1.guardIntact(kCount))
      << "bytes after a buffer were overwritten";
  for (auto c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

}  // namespace
}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
