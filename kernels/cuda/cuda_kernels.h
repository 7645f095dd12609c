// Device (CUDA) reduce/copy, the counterparts of kernels/reduce.h for
// device memory. Built only with CUDA (target loom_kernels_cuda); this header
// needs no CUDA headers: a stream is passed as its cudaStream_t value.
//
// The CUDA runtime is linked statically and loads the driver only when first
// used, so a program linking this runs, and deviceCount() returns 0, on a
// machine without a GPU or driver.
//
// Thread safety: any number of threads may call these at once (each call
// only queues work on the given stream of the calling thread's current
// device).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/reduce.h"

namespace loom::kernels::cuda {

// Devices the CUDA runtime sees; 0 without a GPU or driver (never fails).
int deviceCount();

// Loads all of loom's kernels on the current device, once per device (later
// calls return at once). Every function below calls it first, so loom's
// first kernel launch on a device loads them all: CUDA loads kernels lazily
// (at first launch, by default), and a load can wait for the whole device,
// gates included, which would deadlock once a gate waits for loom's host
// side. Call it early to move that cost out of the first operation.
Status loadKernels();

// dst = partials[0] (+) ... (+) pre(local), then post: exactly the contract of
// kernels::reduce() (reduce.h), with the same bits as the host kernels (NaN
// payloads aside), on device memory of the current device, queued on
// `stream` (a cudaStream_t; null = the legacy default stream). Returns once
// queued; errors of the launch come back as Code::kCudaError. `partials` is a
// host array of device pointers. Chains longer than the sources one launch
// takes (8) run as several launches in order, each continuing from dst; with
// Accumulation::kFloat32 the float sum is then rounded once per launch.
Status reduce(const Reduction& r, void* dst, const void* const* partials, int npartials, const void* local,
              size_t count, bool applyPost, void* stream);

// Copies src to every dsts[i] (device memory), reading src once per group of
// 8 destinations; one destination uses cudaMemcpyAsync. A destination equal
// to src is skipped; others must not overlap src or each other.
Status copyToMany(void* const* dsts, int ndsts, const void* src, size_t bytes, void* stream);

// Queues on `stream` a gate: work queued after it starts once *word >= value.
// `word` is pinned host memory mapped for the device (cudaHostAlloc with
// cudaHostAllocMapped, same address on both sides); the host writes it.
Status gate(const uint64_t* word, uint64_t value, void* stream);
// The same until *word >= *target, *target read when the gate starts (both
// pinned, mapped host memory).
Status gateIndirect(const uint64_t* word, const uint64_t* target, void* stream);

}  // namespace loom::kernels::cuda
