// loom_bench_kernels: bandwidth of the host reduce/copy kernels, single
// thread, against single-thread baselines measured in the same run:
//   - STREAM-style add c[i] = a[i] + b[i] on float (plain C++ loop, compiled
//     at the build's baseline ISA like STREAM itself; regular stores), the
//     baseline of every reduce;
//   - memcpy (glibc), the baseline of copy and copyToMany.
// GB/s counts bytes read + written (1e9 bytes/s): a 2-source reduce of B bytes
// per buffer moves 3B. Each benchmark reports "GB/s" and "x_base" (ratio to
// its baseline at the same size, run again right before it); a summary table
// ends the run (its baseline rows show the last baseline runs).
//
// Own flags: bench/bench_options.h (--isa=auto|all|avx512vbmi|avx512|avx2|scalar: auto
// measures the level reduce() uses, all every level the CPU runs).
// --benchmark_min_time defaults to 0.1 s here; use --benchmark_repetitions=N
// for medians on a noisy machine. Times are CPU time of the benchmark
// thread, so time the machine gives to other processes does not count.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_options.h"
#include "bench/ratio_reporter.h"
#include "kernels/datatype.h"
#include "kernels/reduce.h"
#include "kernels/types.h"

namespace loom::bench {
namespace {

using kernels::CpuIsa;
using kernels::DataType;
using kernels::RedOp;

// The levels --isa asks for; false (after printing why) on a bad value.
bool chooseLevels(const std::string& isa, std::vector<CpuIsa>* levels) {
  if (isa == "all") {
    for (CpuIsa level : kernels::kAllCpuIsas) {
      if (kernels::cpuIsaSupported(level)) levels->push_back(level);
    }
    return true;
  }
  if (isa == "auto") {
    levels->push_back(kernels::defaultCpuKernelConfig().isa);
    return true;
  }
  CpuIsa level;
  if (!kernels::parseCpuIsa(isa, &level)) {
    std::fprintf(stderr, "loom_bench_kernels: --isa=%s: use auto, all, avx512vbmi, avx512, avx2 or scalar\n", isa.c_str());
    return false;
  }
  if (!kernels::cpuIsaSupported(level)) {
    std::fprintf(stderr, "loom_bench_kernels: this CPU lacks %s; measuring %s\n", isa.c_str(),
                 kernels::cpuIsaName(kernels::detectedCpuIsa()));
    level = kernels::detectedCpuIsa();
  }
  levels->push_back(level);
  return true;
}

// ---- buffers ------------------------------------------------------------------

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// 64-byte aligned buffers shared by all benchmarks, filled with values of
// the type under test (normal numbers for floating types, random bits for
// integers) when the type or size grows.
class Buffers {
 public:
  Buffers(int count, size_t bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    for (int i = 0; i < count; ++i) {
      buffers_.emplace_back(static_cast<unsigned char*>(std::aligned_alloc(64, rounded)));
      if (!buffers_.back()) {
        std::fprintf(stderr, "loom_bench_kernels: out of memory for %zu-byte buffers\n", rounded);
        std::exit(1);
      }
    }
  }
  unsigned char* get(int i) { return buffers_[i].get(); }

  void prepare(DataType type, size_t bytes) {
    if (type == type_ && bytes <= filled_) return;
    for (size_t b = 0; b < buffers_.size(); ++b) {
      const std::vector<unsigned char> tile = makeTile(type, 1234 + b);
      for (size_t off = 0; off < bytes; off += tile.size()) {
        std::memcpy(get(int(b)) + off, tile.data(), std::min(tile.size(), bytes - off));
      }
    }
    type_ = type;
    filled_ = bytes;
  }

 private:
  static std::vector<unsigned char> makeTile(DataType type, uint64_t seed) {
    std::vector<unsigned char> tile(64 << 10);
    fillSampleValues(type, seed, tile.data(), tile.size());
    return tile;
  }

  std::vector<std::unique_ptr<unsigned char, FreeDeleter>> buffers_;
  DataType type_ = DataType::kInt8;
  size_t filled_ = 0;
};

Buffers* gBuffers = nullptr;

// 0.5 as a value of `type`, for kPreMulSum.
uint64_t halfScalar(DataType type) {
  uint64_t raw = 0;
  switch (type) {
    case DataType::kFloat32: { const float f = 0.5f; std::memcpy(&raw, &f, 4); break; }
    case DataType::kFloat64: { const double d = 0.5; std::memcpy(&raw, &d, 8); break; }
    case DataType::kFloat16: raw = kernels::Half::fromFloat(0.5f).bits; break;
    case DataType::kBfloat16: raw = kernels::Bfloat16::fromFloat(0.5f).bits; break;
    case DataType::kFloat8e4m3: raw = kernels::Float8e4m3::fromFloat(0.5f).bits; break;
    case DataType::kFloat8e5m2: raw = kernels::Float8e5m2::fromFloat(0.5f).bits; break;
    default: raw = 3; break;
  }
  return raw;
}

void setGbs(benchmark::State& state, double bytesPerIteration) {
  state.counters["GB/s"] = benchmark::Counter(bytesPerIteration * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

// ---- baselines -------------------------------------------------------------------

__attribute__((noinline)) void streamAdd(float* __restrict c, const float* __restrict a,
                                         const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

void benchStreamAdd(benchmark::State& state, size_t bytes) {
  gBuffers->prepare(DataType::kFloat32, bytes);
  auto* a = reinterpret_cast<const float*>(gBuffers->get(0));
  auto* b = reinterpret_cast<const float*>(gBuffers->get(1));
  auto* c = reinterpret_cast<float*>(gBuffers->get(2));
  for (auto _ : state) {
    streamAdd(c, a, b, bytes / sizeof(float));
    benchmark::ClobberMemory();
  }
  setGbs(state, 3.0 * double(bytes));
}

void benchMemcpy(benchmark::State& state, size_t bytes) {
  unsigned char* src = gBuffers->get(0);
  unsigned char* dst = gBuffers->get(1);
  for (auto _ : state) {
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
  }
  setGbs(state, 2.0 * double(bytes));
}

// ---- kernels ---------------------------------------------------------------------

kernels::CpuKernelConfig configFor(CpuIsa isa) {
  kernels::CpuKernelConfig config = kernels::defaultCpuKernelConfig();
  config.isa = isa;
  return config;
}

void benchReduce(benchmark::State& state, CpuIsa isa, DataType type, RedOp op, int sources, size_t bytes) {
  gBuffers->prepare(type, bytes);
  std::vector<const void*> partials;
  for (int s = 0; s + 1 < sources; ++s) partials.push_back(gBuffers->get(s));
  const void* local = gBuffers->get(sources - 1);
  void* dst = gBuffers->get(sources);
  kernels::Reduction r{type, op};
  r.scalar = halfScalar(type);
  r.divisor = 2;
  r.accumulation = kernels::Accumulation::kElementType;
  const kernels::CpuKernelConfig config = configFor(isa);
  const size_t count = bytes / kernels::dataTypeSize(type);
  for (auto _ : state) {
    kernels::reduce(config, r, dst, partials.data(), int(partials.size()), local, count, true);
    benchmark::ClobberMemory();
  }
  setGbs(state, double(sources + 1) * double(bytes));
}

void benchCopy(benchmark::State& state, CpuIsa isa, int ndsts, size_t bytes) {
  const kernels::CpuKernelConfig config = configFor(isa);
  unsigned char* src = gBuffers->get(0);
  void* dsts[2] = {gBuffers->get(1), gBuffers->get(2)};
  for (auto _ : state) {
    if (ndsts == 1) {
      kernels::copy(config, dsts[0], src, bytes);
    } else {
      kernels::copyToMany(config, dsts, ndsts, src, bytes);
    }
    benchmark::ClobberMemory();
  }
  setGbs(state, double(1 + ndsts) * double(bytes));
}

void registerAll(const KernelBenchOptions& o, const std::vector<CpuIsa>& levels, RatioReporter& reporter) {
  for (size_t bytes : o.sizes) {
    const std::string size = sizeName(bytes);
    const std::string streamName = "baseline/stream_add/float/" + size;
    const std::string memcpyName = "baseline/memcpy/" + size;
    // Every kernel is compared with its baseline measured right before it
    // (the reporter keeps the latest run of a name), so a machine whose
    // speed drifts during the run still gives side-by-side ratios.
    auto streamBaseline = [&] {
      benchmark::RegisterBenchmark(streamName.c_str(), benchStreamAdd, bytes);
      reporter.addBaseline(streamName, "STREAM add (float)", size);
    };
    auto memcpyBaseline = [&] {
      benchmark::RegisterBenchmark(memcpyName.c_str(), benchMemcpy, bytes);
      reporter.addBaseline(memcpyName, "memcpy", size);
    };
    for (CpuIsa isa : levels) {
      const std::string level = kernels::cpuIsaName(isa);
      for (int ndsts : {1, 2}) {
        const std::string what = ndsts == 1 ? "copy" : "copy_to_2";
        const std::string name = what + "/" + level + "/" + size;
        memcpyBaseline();
        benchmark::RegisterBenchmark(name.c_str(), benchCopy, isa, ndsts, bytes);
        reporter.addKernel(name, memcpyName, level + " " + what, size, true);
      }
    }
    for (DataType type : o.types) {
      if (bytes < kernels::dataTypeSize(type)) continue;
      for (RedOp op : o.ops) {
        for (CpuIsa isa : levels) {
          const std::string level = kernels::cpuIsaName(isa);
          const std::string name = "reduce/" + level + "/" + kernels::dataTypeName(type) + "/" +
                                   kernels::redOpName(op) + "/" + std::to_string(o.sources) + "src/" + size;
          streamBaseline();
          benchmark::RegisterBenchmark(name.c_str(), benchReduce, isa, type, op, o.sources, bytes);
          reporter.addKernel(name, streamName,
                             level + " " + kernels::dataTypeName(type) + " " + kernels::redOpName(op), size,
                             op == o.summaryOp);
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  using namespace loom::bench;
  KernelBenchOptions options;
  std::vector<loom::kernels::CpuIsa> levels;
  if (!parseKernelBenchOptions(&argc, argv, "loom_bench_kernels", &options)) return 2;
  if (!chooseLevels(options.isa, &levels)) return 2;
  std::vector<char*> args = withDefaultMinTime(argc, argv, "0.1");
  int n = int(args.size()) - 1;
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  size_t maxBytes = 0;
  for (size_t s : options.sizes) maxBytes = std::max(maxBytes, s);
  Buffers buffers(options.sources + 2, maxBytes);
  gBuffers = &buffers;
  std::printf("loom host kernels: CPU runs up to %s; measuring", loom::kernels::cpuIsaName(loom::kernels::detectedCpuIsa()));
  for (auto isa : levels) std::printf(" %s", loom::kernels::cpuIsaName(isa));
  const size_t streaming = loom::kernels::defaultCpuKernelConfig().streamingMinBytes;
  std::printf("; streaming stores from %s; single thread, CPU time\n",
              streaming == SIZE_MAX ? "never" : sizeName(streaming).c_str());
  RatioReporter reporter;
  registerAll(options, levels, reporter);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
