// Flags shared by loom's kernel benchmarks (taken out of argv before Google
// Benchmark sees it):
//   --isa=auto|all|avx512vbmi|avx512|avx2|scalar   host levels to measure (host bench only)
//   --sources=N        sources per reduce (default 2: one partial + local)
//   --types=a,b        data types (nccl-tests names; default all)
//   --ops=a,b          sum,prod,max,min,premulsum,sumpostdiv (default all)
//   --sizes=a,b        bytes per buffer, K/M/G suffixes (default 4K..256M, x4 steps)
//   --summary_op=sum   op shown in the summary table
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/datatype.h"

namespace loom::bench {

struct KernelBenchOptions {
  std::string isa = "auto";
  int sources = 2;
  std::vector<kernels::DataType> types;
  std::vector<kernels::RedOp> ops;
  std::vector<size_t> sizes;
  kernels::RedOp summaryOp = kernels::RedOp::kSum;
};

// Removes the flags above from argv (updating *argc) and fills defaults.
// False, after printing why, on a bad value.
bool parseKernelBenchOptions(int* argc, char** argv, const char* program, KernelBenchOptions* o);

// argv plus --benchmark_min_time=<seconds> unless the caller gave one;
// the returned vector ends with a null pointer.
std::vector<char*> withDefaultMinTime(int argc, char** argv, const char* seconds);

// "4KiB", "64MiB", "1000B".
std::string sizeName(size_t bytes);

// Fills `bytes` bytes with elements of `type` drawn from `seed`: floating
// types get finite values of magnitude 0.5..2 and random sign (no overflow,
// NaN or subnormal slows any kernel), integers random bits.
void fillSampleValues(kernels::DataType type, uint64_t seed, unsigned char* out, size_t bytes);

}  // namespace loom::bench
