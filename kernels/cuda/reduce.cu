// Device reduce/copy kernels: the same chain as the host kernels
// (kernels/chain.h, kernels/ops.h), so results are bit-identical to the host
// scalar level for every type and op (built with --fmad=false so no multiply
// is fused into an add; only NaN payloads may differ, as on the host).
//
// Layout of the work: grid-stride loops. Where every pointer has the same
// misalignment modulo 16 bytes (and is aligned to its element size), a body
// of 16-byte packs is loaded and stored with one vector access per source;
// the elements before and after it (and everything otherwise) run one
// element per thread.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/chain.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_kernel.cuh"
#include "kernels/ops.h"
#include "kernels/types.h"

namespace loom::kernels::cuda::detail {
namespace {

using Byte = unsigned char;
constexpr size_t kPackBytes = 16;

struct Params {
  const Byte* src[kMaxSourcesPerLaunch];
  Byte* dst;
  int nsources;
  bool lastIsLocal;
  bool applyPost;
  size_t count;
  size_t head;   // elements before the packed body
  size_t packs;  // 16-byte packs in the body (0: elements only)
};

template <typename T>
__device__ __forceinline__ T loadElement(const Byte* p, size_t i) {
  T v;
  memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
__device__ __forceinline__ void loadPack(const Byte* p, size_t firstElement, T* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p + firstElement * sizeof(T));
  memcpy(out, &raw, kPackBytes);
}

// One element of the chain over all sources.
template <typename T, typename Op, bool kFp32>
__device__ __forceinline__ T chainAt(const Op& op, const Fp32Terms& terms, const Params& p, size_t i) {
  const bool onlyLocal = p.nsources == 1 && p.lastIsLocal;
  if constexpr (kFp32) {
    float acc = chainFirstFp32<T>(terms, loadElement<T>(p.src[0], i), onlyLocal);
    for (int s = 1; s < p.nsources; ++s) {
      acc = chainNextFp32<T>(terms, acc, loadElement<T>(p.src[s], i), p.lastIsLocal && s == p.nsources - 1);
    }
    return chainLastFp32<T>(terms, acc, p.applyPost);
  } else {
    T acc = chainFirst<T>(op, loadElement<T>(p.src[0], i), onlyLocal);
    for (int s = 1; s < p.nsources; ++s) {
      acc = chainNext<T>(op, acc, loadElement<T>(p.src[s], i), p.lastIsLocal && s == p.nsources - 1);
    }
    return chainLast<T>(op, acc, p.applyPost);
  }
}

// The chain on one 16-byte pack of every source.
template <typename T, typename Op, bool kFp32>
__device__ __forceinline__ void chainPack(const Op& op, const Fp32Terms& terms, const Params& p, size_t first) {
  constexpr int kPer = int(kPackBytes / sizeof(T));
  const bool onlyLocal = p.nsources == 1 && p.lastIsLocal;
  T x[kPer];
  T out[kPer];
  loadPack<T>(p.src[0], first, x);
  if constexpr (kFp32) {
    float acc[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) acc[k] = chainFirstFp32<T>(terms, x[k], onlyLocal);
    for (int s = 1; s < p.nsources; ++s) {
      const bool isLocal = p.lastIsLocal && s == p.nsources - 1;
      loadPack<T>(p.src[s], first, x);
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[k] = chainNextFp32<T>(terms, acc[k], x[k], isLocal);
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) out[k] = chainLastFp32<T>(terms, acc[k], p.applyPost);
  } else {
#pragma unroll
    for (int k = 0; k < kPer; ++k) out[k] = chainFirst<T>(op, x[k], onlyLocal);
    for (int s = 1; s < p.nsources; ++s) {
      const bool isLocal = p.lastIsLocal && s == p.nsources - 1;
      loadPack<T>(p.src[s], first, x);
#pragma unroll
      for (int k = 0; k < kPer; ++k) out[k] = chainNext<T>(op, out[k], x[k], isLocal);
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) out[k] = chainLast<T>(op, out[k], p.applyPost);
  }
  uint4 raw;
  memcpy(&raw, out, kPackBytes);
  *reinterpret_cast<uint4*>(p.dst + first * sizeof(T)) = raw;
}

template <typename T, typename Op, bool kFp32>
__global__ void reduceKernel(Params p, Op op, Fp32Terms terms) {
  constexpr size_t kPer = kPackBytes / sizeof(T);
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t v = tid; v < p.packs; v += stride) chainPack<T, Op, kFp32>(op, terms, p, p.head + v * kPer);
  // Elements outside the packed body: the head, then the tail.
  const size_t tailStart = p.head + p.packs * kPer;
  const size_t loose = p.head + (p.count - tailStart);
  for (size_t j = tid; j < loose; j += stride) {
    const size_t i = j < p.head ? j : tailStart + (j - p.head);
    const T out = chainAt<T, Op, kFp32>(op, terms, p, i);
    memcpy(p.dst + i * sizeof(T), &out, sizeof(T));
  }
}

template <typename T, typename Op>
int launchOp(const ReduceLaunch& l, const Params& p, const Op& op, cudaStream_t stream) {
  Fp32Terms terms;
  if constexpr (Fp32Sum<T, Op>::value) {
    if (l.fp32) {
      terms = Fp32Sum<T, Op>::terms(op);
      return launchKernel(reduceKernel<T, Op, true>, l.blocks, l.threads, stream, p, op, terms);
    }
  }
  return launchKernel(reduceKernel<T, Op, false>, l.blocks, l.threads, stream, p, op, terms);
}

template <typename T>
T scalarAs(uint64_t raw) {
  T v;
  memcpy(&v, &raw, sizeof(T));
  return v;
}

template <typename T>
int launchTyped(const ReduceLaunch& l, cudaStream_t stream) {
  Params p{};
  for (int s = 0; s < l.nsources; ++s) p.src[s] = static_cast<const Byte*>(l.sources[s]);
  p.dst = static_cast<Byte*>(l.dst);
  p.nsources = l.nsources;
  p.lastIsLocal = l.lastIsLocal;
  p.applyPost = l.applyPost;
  p.count = l.count;
  // The packed body needs every pointer at the same offset within 16 bytes,
  // and that offset a multiple of the element size.
  const uintptr_t mis = reinterpret_cast<uintptr_t>(l.dst) % kPackBytes;
  bool same = mis % sizeof(T) == 0;
  for (int s = 0; s < l.nsources; ++s) same = same && reinterpret_cast<uintptr_t>(l.sources[s]) % kPackBytes == mis;
  if (same) {
    p.head = ((kPackBytes - mis) % kPackBytes) / sizeof(T);
    if (p.head > p.count) p.head = p.count;
    p.packs = (p.count - p.head) / (kPackBytes / sizeof(T));
  } else {
    p.head = p.count;
    p.packs = 0;
  }
  switch (l.op) {
    case RedOp::kSum: return launchOp<T>(l, p, SumOp<T>{}, stream);
    case RedOp::kProd: return launchOp<T>(l, p, ProdOp<T>{}, stream);
    case RedOp::kMax: return launchOp<T>(l, p, MaxOp<T>{}, stream);
    case RedOp::kMin: return launchOp<T>(l, p, MinOp<T>{}, stream);
    case RedOp::kPreMulSum: return launchOp<T>(l, p, PreMulSumOp<T>{scalarAs<T>(l.scalar)}, stream);
    case RedOp::kSumPostDiv: return launchOp<T>(l, p, SumPostDivOp<T>{l.divisor}, stream);
  }
  return int(cudaErrorInvalidValue);
}

struct CopyParams {
  Byte* dst[kMaxSourcesPerLaunch];
  int ndsts;
  const Byte* src;
  size_t bytes;
  size_t head;   // bytes before the packed body
  size_t packs;  // 16-byte packs
};

__global__ void copyKernel(CopyParams p) {
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t v = tid; v < p.packs; v += stride) {
    const size_t off = p.head + v * kPackBytes;
    const uint4 raw = *reinterpret_cast<const uint4*>(p.src + off);
    for (int d = 0; d < p.ndsts; ++d) *reinterpret_cast<uint4*>(p.dst[d] + off) = raw;
  }
  const size_t tailStart = p.head + p.packs * kPackBytes;
  const size_t loose = p.head + (p.bytes - tailStart);
  for (size_t j = tid; j < loose; j += stride) {
    const size_t i = j < p.head ? j : tailStart + (j - p.head);
    const Byte b = p.src[i];
    for (int d = 0; d < p.ndsts; ++d) p.dst[d][i] = b;
  }
}

// Loading a kernel by name (cudaFuncGetAttributes) makes the driver load it
// now instead of at its first launch (see preloadReduceKernels in launch.h).
template <typename T, typename Op>
cudaError_t loadOp() {
  cudaFuncAttributes a;
  if constexpr (Fp32Sum<T, Op>::value) {
    if (cudaError_t e = cudaFuncGetAttributes(&a, reduceKernel<T, Op, true>); e != cudaSuccess) return e;
  }
  return cudaFuncGetAttributes(&a, reduceKernel<T, Op, false>);
}

template <typename T>
cudaError_t loadTyped() {
  for (cudaError_t e : {loadOp<T, SumOp<T>>(), loadOp<T, ProdOp<T>>(), loadOp<T, MaxOp<T>>(), loadOp<T, MinOp<T>>(),
                        loadOp<T, PreMulSumOp<T>>(), loadOp<T, SumPostDivOp<T>>()}) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

int launchReduce(const ReduceLaunch& l, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (l.type) {
    case DataType::kInt8: return launchTyped<int8_t>(l, s);
    case DataType::kUint8: return launchTyped<uint8_t>(l, s);
    case DataType::kInt32: return launchTyped<int32_t>(l, s);
    case DataType::kUint32: return launchTyped<uint32_t>(l, s);
    case DataType::kInt64: return launchTyped<int64_t>(l, s);
    case DataType::kUint64: return launchTyped<uint64_t>(l, s);
    case DataType::kFloat16: return launchTyped<Half>(l, s);
    case DataType::kFloat32: return launchTyped<float>(l, s);
    case DataType::kFloat64: return launchTyped<double>(l, s);
    case DataType::kBfloat16: return launchTyped<Bfloat16>(l, s);
    case DataType::kFloat8e4m3: return launchTyped<Float8e4m3>(l, s);
    case DataType::kFloat8e5m2: return launchTyped<Float8e5m2>(l, s);
  }
  return int(cudaErrorInvalidValue);
}

int launchCopy(const CopyLaunch& l, void* stream) {
  CopyParams p{};
  for (int d = 0; d < l.ndsts; ++d) p.dst[d] = static_cast<Byte*>(l.dsts[d]);
  p.ndsts = l.ndsts;
  p.src = static_cast<const Byte*>(l.src);
  p.bytes = l.bytes;
  const uintptr_t mis = reinterpret_cast<uintptr_t>(l.src) % kPackBytes;
  bool same = true;
  for (int d = 0; d < l.ndsts; ++d) same = same && reinterpret_cast<uintptr_t>(l.dsts[d]) % kPackBytes == mis;
  if (same) {
    p.head = (kPackBytes - mis) % kPackBytes;
    if (p.head > p.bytes) p.head = p.bytes;
    p.packs = (p.bytes - p.head) / kPackBytes;
  } else {
    p.head = p.bytes;
    p.packs = 0;
  }
  return launchKernel(copyKernel, l.blocks, l.threads, stream, p);
}

int preloadReduceKernels() {
  cudaFuncAttributes a;
  for (cudaError_t e : {loadTyped<int8_t>(), loadTyped<uint8_t>(), loadTyped<int32_t>(), loadTyped<uint32_t>(),
                        loadTyped<int64_t>(), loadTyped<uint64_t>(), loadTyped<Half>(), loadTyped<float>(),
                        loadTyped<double>(), loadTyped<Bfloat16>(), loadTyped<Float8e4m3>(), loadTyped<Float8e5m2>(),
                        cudaFuncGetAttributes(&a, copyKernel)}) {
    if (e != cudaSuccess) return int(e);
  }
  return int(cudaSuccess);
}

}  // namespace loom::kernels::cuda::detail
