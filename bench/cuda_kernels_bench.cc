// loom_bench_cuda_kernels: bandwidth of the device reduce/copy kernels on GPU
// 0 against a device-to-device cudaMemcpyAsync of the same size, measured in
// the same run. GB/s counts bytes read + written (1e9 bytes/s): a 2-source
// reduce of B bytes per buffer moves 3B, the memcpy 2B. Times come from CUDA
// events around each call (manual time). Each benchmark reports "GB/s" and
// "x_base" (ratio to the memcpy at the same size); a summary table ends the
// run. Flags: bench/bench_options.h (--isa is ignored). Without a CUDA device
// it says "no CUDA device" and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_options.h"
#include "bench/ratio_reporter.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/datatype.h"
#include "kernels/types.h"

namespace loom::bench {
namespace {

using kernels::DataType;
using kernels::RedOp;

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

// Device buffers shared by all benchmarks, filled with ordinary values of
// the type under test when the type or size grows.
class DeviceBuffers {
 public:
  DeviceBuffers(int count, size_t bytes) : bytes_(bytes) {
    for (int i = 0; i < count; ++i) {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) {
        std::fprintf(stderr, "loom_bench_cuda_kernels: cudaMalloc of %zu bytes failed\n", bytes);
        std::exit(1);
      }
      buffers_.emplace_back(p);
    }
  }
  unsigned char* get(int i) { return static_cast<unsigned char*>(buffers_[i].get()); }

  void prepare(DataType type, size_t bytes) {
    if (type == type_ && bytes <= filled_) return;
    std::vector<unsigned char> host(bytes);
    for (size_t b = 0; b < buffers_.size(); ++b) {
      fillSampleValues(type, 99 + b, host.data(), bytes);
      cudaMemcpy(get(int(b)), host.data(), bytes, cudaMemcpyHostToDevice);
    }
    type_ = type;
    filled_ = bytes;
  }

 private:
  size_t bytes_;
  std::vector<std::unique_ptr<void, CudaFree>> buffers_;
  DataType type_ = DataType::kInt8;
  size_t filled_ = 0;
};

DeviceBuffers* gBuffers = nullptr;
cudaStream_t gStream = nullptr;
cudaEvent_t gStart = nullptr;
cudaEvent_t gStop = nullptr;

// Times one call with events; reports the seconds as the iteration time.
template <typename Fn>
void timed(benchmark::State& state, Fn&& fn) {
  cudaEventRecord(gStart, gStream);
  fn();
  cudaEventRecord(gStop, gStream);
  cudaEventSynchronize(gStop);
  float ms = 0;
  cudaEventElapsedTime(&ms, gStart, gStop);
  state.SetIterationTime(double(ms) / 1e3);
}

void setGbs(benchmark::State& state, double bytesPerIteration) {
  state.counters["GB/s"] = benchmark::Counter(bytesPerIteration * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void benchMemcpy(benchmark::State& state, size_t bytes) {
  for (auto _ : state) {
    timed(state, [&] { cudaMemcpyAsync(gBuffers->get(1), gBuffers->get(0), bytes, cudaMemcpyDeviceToDevice, gStream); });
  }
  setGbs(state, 2.0 * double(bytes));
}

void benchReduce(benchmark::State& state, DataType type, RedOp op, int sources, size_t bytes) {
  gBuffers->prepare(type, bytes);
  std::vector<const void*> partials;
  for (int s = 0; s + 1 < sources; ++s) partials.push_back(gBuffers->get(s));
  kernels::Reduction r{type, op};
  r.scalar = 0;  // premulsum by the all-zero pattern (0) keeps the data finite
  r.divisor = 2;
  r.accumulation = kernels::Accumulation::kElementType;
  const size_t count = bytes / kernels::dataTypeSize(type);
  for (auto _ : state) {
    timed(state, [&] {
      const Status st = kernels::cuda::reduce(r, gBuffers->get(sources), partials.data(), int(partials.size()),
                                              gBuffers->get(sources - 1), count, true, gStream);
      if (!st.isOk()) state.SkipWithError(st.toString().c_str());
    });
  }
  setGbs(state, double(sources + 1) * double(bytes));
}

void benchCopyToTwo(benchmark::State& state, size_t bytes) {
  void* dsts[2] = {gBuffers->get(1), gBuffers->get(2)};
  for (auto _ : state) {
    timed(state, [&] {
      const Status st = kernels::cuda::copyToMany(dsts, 2, gBuffers->get(0), bytes, gStream);
      if (!st.isOk()) state.SkipWithError(st.toString().c_str());
    });
  }
  setGbs(state, 3.0 * double(bytes));
}

void registerAll(const KernelBenchOptions& o, RatioReporter& reporter) {
  for (size_t bytes : o.sizes) {
    const std::string size = sizeName(bytes);
    const std::string memcpyName = "baseline/cudaMemcpyD2D/" + size;
    benchmark::RegisterBenchmark(memcpyName.c_str(), benchMemcpy, bytes)->UseManualTime();
    reporter.addBaseline(memcpyName, "cudaMemcpy D2D", size);
    const std::string copyName = "cuda/copy_to_2/" + size;
    benchmark::RegisterBenchmark(copyName.c_str(), benchCopyToTwo, bytes)->UseManualTime();
    reporter.addKernel(copyName, memcpyName, "copy_to_2", size, true);
    for (DataType type : o.types) {
      if (bytes < kernels::dataTypeSize(type)) continue;
      for (RedOp op : o.ops) {
        const std::string name = "cuda/reduce/" + std::string(kernels::dataTypeName(type)) + "/" +
                                 kernels::redOpName(op) + "/" + std::to_string(o.sources) + "src/" + size;
        benchmark::RegisterBenchmark(name.c_str(), benchReduce, type, op, o.sources, bytes)->UseManualTime();
        reporter.addKernel(name, memcpyName, std::string(kernels::dataTypeName(type)) + " " + kernels::redOpName(op),
                           size, op == o.summaryOp);
      }
    }
  }
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  using namespace loom::bench;
  if (loom::kernels::cuda::deviceCount() == 0) {
    std::printf("loom_bench_cuda_kernels: no CUDA device; nothing to measure\n");
    return 0;
  }
  KernelBenchOptions options;
  if (!parseKernelBenchOptions(&argc, argv, "loom_bench_cuda_kernels", &options)) return 2;
  std::vector<char*> args = withDefaultMinTime(argc, argv, "0.1");
  int n = int(args.size()) - 1;
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  cudaSetDevice(0);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("loom device kernels on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  cudaStreamCreateWithFlags(&gStream, cudaStreamNonBlocking);
  cudaEventCreate(&gStart);
  cudaEventCreate(&gStop);
  size_t maxBytes = 0;
  for (size_t s : options.sizes) maxBytes = std::max(maxBytes, s);
  DeviceBuffers buffers(options.sources + 2, maxBytes);
  gBuffers = &buffers;
  RatioReporter reporter;
  registerAll(options, reporter);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  cudaEventDestroy(gStart);
  cudaEventDestroy(gStop);
  cudaStreamDestroy(gStream);
  return 0;
}
