#include "bench/bench_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>

#include "kernels/types.h"

namespace loom::bench {
namespace {

using kernels::DataType;
using kernels::RedOp;

constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax,
                             RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv};

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

bool parseSize(const std::string& s, size_t* out) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return false;
  size_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = size_t(1) << 10;
  if (*end == 'M' || *end == 'm') mult = size_t(1) << 20;
  if (*end == 'G' || *end == 'g') mult = size_t(1) << 30;
  *out = size_t(v) * mult;
  return *out > 0;
}

bool parseOp(const std::string& s, RedOp* out) {
  for (RedOp op : kAllOps) {
    if (s == kernels::redOpName(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

bool parseType(const std::string& s, DataType* out) {
  for (int t = 0; t < kernels::kNumDataTypes; ++t) {
    if (s == kernels::dataTypeName(DataType(t))) {
      *out = DataType(t);
      return true;
    }
  }
  return false;
}

}  // namespace

bool parseKernelBenchOptions(int* argc, char** argv, const char* program, KernelBenchOptions* o) {
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    bool ok = true;
    if (const char* v = value("--isa=")) {
      o->isa = v;
    } else if (const char* v = value("--sources=")) {
      o->sources = std::atoi(v);
      ok = o->sources >= 1 && o->sources <= 64;
    } else if (const char* v = value("--types=")) {
      for (const auto& s : splitList(v)) ok = ok && parseType(s, &o->types.emplace_back());
    } else if (const char* v = value("--ops=")) {
      for (const auto& s : splitList(v)) ok = ok && parseOp(s, &o->ops.emplace_back());
    } else if (const char* v = value("--sizes=")) {
      for (const auto& s : splitList(v)) ok = ok && parseSize(s, &o->sizes.emplace_back());
    } else if (const char* v = value("--summary_op=")) {
      ok = parseOp(v, &o->summaryOp);
    } else {
      argv[kept++] = argv[i];
      continue;
    }
    if (!ok) {
      std::fprintf(stderr, "%s: bad flag %s (see bench/bench_options.h)\n", program, a.c_str());
      return false;
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  if (o->types.empty()) {
    for (int t = 0; t < kernels::kNumDataTypes; ++t) o->types.push_back(DataType(t));
  }
  if (o->ops.empty()) o->ops.assign(std::begin(kAllOps), std::end(kAllOps));
  if (o->sizes.empty()) {
    for (size_t s = size_t(4) << 10; s <= size_t(256) << 20; s *= 4) o->sizes.push_back(s);
  }
  return true;
}

std::vector<char*> withDefaultMinTime(int argc, char** argv, const char* seconds) {
  static std::string flag;
  std::vector<char*> args(argv, argv + argc);
  bool given = false;
  for (char* a : args) given = given || std::strncmp(a, "--benchmark_min_time", 20) == 0;
  if (!given) {
    flag = std::string("--benchmark_min_time=") + seconds;
    args.push_back(flag.data());
  }
  args.push_back(nullptr);
  return args;
}

std::string sizeName(size_t bytes) {
  if (bytes % (size_t(1) << 20) == 0) return std::to_string(bytes >> 20) + "MiB";
  if (bytes % (size_t(1) << 10) == 0) return std::to_string(bytes >> 10) + "KiB";
  return std::to_string(bytes) + "B";
}

void fillSampleValues(DataType type, uint64_t seed, unsigned char* out, size_t bytes) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mag(0.5f, 2.0f);
  const size_t size = kernels::dataTypeSize(type);
  for (size_t off = 0; off < bytes; off += size) {
    const float f = (rng() & 1) ? mag(rng) : -mag(rng);
    uint64_t raw = rng();
    switch (type) {
      case DataType::kFloat32: std::memcpy(&raw, &f, 4); break;
      case DataType::kFloat64: { const double d = f; std::memcpy(&raw, &d, 8); break; }
      case DataType::kFloat16: raw = kernels::Half::fromFloat(f).bits; break;
      case DataType::kBfloat16: raw = kernels::Bfloat16::fromFloat(f).bits; break;
      case DataType::kFloat8e4m3: raw = kernels::Float8e4m3::fromFloat(f).bits; break;
      case DataType::kFloat8e5m2: raw = kernels::Float8e5m2::fromFloat(f).bits; break;
      default: break;  // integers: random bits
    }
    std::memcpy(out + off, &raw, std::min(size, bytes - off));
  }
}

}  // namespace loom::bench
