// loom_bench_ceiling: what two CPUs of this machine can move at all, the
// ceiling under which two ranks of a shared-memory collective work. Each
// benchmark runs two threads at once, on the first two CPUs this process
// may use (the caller's thread on one, a worker on the other):
//   - Pipe/<bytes>/<chunk>: one thread copies `bytes` into a FIFO of 4
//     slots of `chunk` bytes, the other copies them out as they fill: how
//     a message travels from one rank's buffer to another's over shared
//     memory, each byte copied twice (memcpy, as the engine copies).
//     payload_GB/s counts each byte once.
//   - InPlaceAdd/<bytes>: each thread adds a float buffer of `bytes` into
//     another, in place (loom's reduce kernel, plain stores), as the
//     reducing step of an in-place AllReduce does; rw_GB/s counts bytes
//     read + written by both.
//   - Copy/<bytes>: each thread copies `bytes` (memcpy); rw_GB/s as above.
// Buffers are written before timing; a size beyond the last-level cache
// measures memory, one within it the caches and the link between the cores.
// Wall time per iteration (manual time).
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/reduce.h"
#include "kernels/types.h"

namespace {

// The first two CPUs this process may run on (-1 where there are fewer).
std::pair<int, int> twoCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {-1, -1};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus.size() == 2 ? std::make_pair(cpus[0], cpus[1]) : std::make_pair(-1, -1);
}

bool pinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// Two threads on two CPUs running one job each per iteration: the caller's
// (side 0; pinned for the object's life, its affinity restored after) and a
// worker (side 1).
class Pair {
 public:
  Pair(int cpu0, int cpu1) : sync_(2) {
    CPU_ZERO(&saved_);
    pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_);
    pinTo(cpu0);
    worker_ = std::thread([this, cpu1] {
      pinTo(cpu1);
      for (;;) {
        sync_.arrive_and_wait();  // a job is set, or stop_
        if (stop_) return;
        (*job_)(1);
        sync_.arrive_and_wait();
      }
    });
  }
  ~Pair() {
    stop_ = true;
    sync_.arrive_and_wait();
    worker_.join();
    pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
  }
  // Both sides at once; the wall seconds from the start until both ended.
  double run(const std::function<void(int)>& job) {
    job_ = &job;
    const auto t0 = std::chrono::steady_clock::now();
    sync_.arrive_and_wait();
    job(0);
    sync_.arrive_and_wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  std::barrier<> sync_;
  const std::function<void(int)>* job_ = nullptr;
  bool stop_ = false;
  cpu_set_t saved_;
  std::thread worker_;
};

struct Buffer {
  explicit Buffer(size_t bytes) : data(static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) & ~size_t(4095)))) {
    std::memset(data.get(), 1, bytes);
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data;
};

// Skips (with why) where two CPUs are not available; else the pair.
std::unique_ptr<Pair> pairOrSkip(benchmark::State& state) {
  const auto [a, b] = twoCpus();
  if (a < 0) {
    state.SkipWithError("needs two CPUs to run on (sched_getaffinity lists fewer)");
    return nullptr;
  }
  return std::make_unique<Pair>(a, b);
}

void Pipe(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0)), chunk = size_t(state.range(1));
  constexpr uint64_t kSlots = 4;
  Buffer in(bytes), out(bytes), fifo(chunk * kSlots);
  // Chunks written (head) and read (tail) so far, each on a line of its own.
  struct alignas(64) Counter {
    std::atomic<uint64_t> value{0};
  };
  Counter head, tail;
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  uint64_t base = 0;  // chunks moved by earlier iterations
  std::function<void(int)> job = [&](int side) {
    for (uint64_t c = 0; c < chunks; ++c) {
      const uint64_t k = base + c;
      const size_t at = c * chunk, n = std::min(chunk, bytes - at);
      std::byte* slot = fifo.data.get() + (k % kSlots) * chunk;
      if (side == 0) {
        while (k - tail.value.load(std::memory_order_acquire) >= kSlots) {
        }
        std::memcpy(slot, in.data.get() + at, n);
        head.value.store(k + 1, std::memory_order_release);
      } else {
        while (head.value.load(std::memory_order_acquire) <= k) {
        }
        std::memcpy(out.data.get() + at, slot, n);
        tail.value.store(k + 1, std::memory_order_release);
      }
    }
  };
  auto pair = pairOrSkip(state);
  if (!pair) return;
  for (auto _ : state) {
    state.SetIterationTime(pair->run(job));
    base += chunks;
  }
  state.counters["payload_GB/s"] =
      benchmark::Counter(double(bytes) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void InPlaceAdd(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  Buffer a0(bytes), b0(bytes), a1(bytes), b1(bytes);
  loom::kernels::Reduction sum;
  sum.type = loom::kernels::DataType::kFloat32;
  sum.op = loom::kernels::RedOp::kSum;
  // Plain stores: the lines were just read, and streaming stores would
  // evict them first (they measured slower here).
  loom::kernels::CpuKernelConfig plain = loom::kernels::defaultCpuKernelConfig();
  plain.streamingMinBytes = SIZE_MAX;
  std::function<void(int)> job = [&](int side) {
    std::byte* a = (side == 0 ? a0 : a1).data.get();
    const void* b[] = {(side == 0 ? b0 : b1).data.get()};
    loom::kernels::reduce(plain, sum, a, b, 1, a, bytes / sizeof(float), true);
  };
  auto pair = pairOrSkip(state);
  if (!pair) return;
  for (auto _ : state) state.SetIterationTime(pair->run(job));
  state.counters["rw_GB/s"] =
      benchmark::Counter(6.0 * double(bytes) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void Copy(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  Buffer from0(bytes), to0(bytes), from1(bytes), to1(bytes);
  std::function<void(int)> job = [&](int side) {
    std::memcpy((side == 0 ? to0 : to1).data.get(), (side == 0 ? from0 : from1).data.get(), bytes);
  };
  auto pair = pairOrSkip(state);
  if (!pair) return;
  for (auto _ : state) state.SetIterationTime(pair->run(job));
  state.counters["rw_GB/s"] =
      benchmark::Counter(4.0 * double(bytes) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;

BENCHMARK(Pipe)
    ->ArgsProduct({{1 * kMiB, 16 * kMiB, 256 * kMiB}, {64 * kKiB, 512 * kKiB}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(InPlaceAdd)->Arg(16 * kMiB)->Arg(256 * kMiB)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(Copy)->Arg(16 * kMiB)->Arg(256 * kMiB)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
