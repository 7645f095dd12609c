// The device kernels (kernels/cuda/cuda_kernels.h) against the host kernels'
// scalar level, which the other tests check against the independent
// reference: every type x op x chain shape on random bit patterns, every
// fp8 pair, every half/bfloat16 value against an operand set, odd lengths and
// every misalignment 1..63, aliasing, chains longer than one launch, fp32
// accumulation, and copies to several destinations. Results must be the
// host's bytes; only a NaN result may carry another NaN payload.
//
// Without a CUDA device every device test is skipped ("skipped: no CUDA
// device"), never counted as passed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "isa_levels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/reduce.h"
#include "reference.h"

namespace loom::kernels {
namespace {

constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax,
                             RedOp::kMin, RedOp::kPreMulSum, RedOp::kSumPostDiv};

// Device memory owned by the test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr_, bytes ? bytes : 1) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::deviceCount() == 0) GTEST_SKIP() << "skipped: no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  struct Case {
    Reduction r;
    int npartials = 1;
    bool withLocal = true;
    bool applyPost = true;
    size_t count = 1000;
    std::vector<size_t> offsets;  // per buffer (partials, local, dst); empty: all 0
    int dstAliases = -1;          // index of the source dst is, or -1
  };

  // Runs `c` on the device and on the host's scalar level with the same
  // inputs (given, or random bits) and returns a description of mismatches.
  std::string compare(const Case& c, const std::vector<std::vector<unsigned char>>* given = nullptr) {
    const size_t size = dataTypeSize(c.r.type);
    const size_t bytes = c.count * size;
    const int nsources = c.npartials + (c.withLocal ? 1 : 0);
    std::mt19937_64 rng(bytes * 131 + size_t(c.r.op) * 7 + size_t(c.npartials));
    std::vector<std::vector<unsigned char>> host(size_t(nsources) + 1, std::vector<unsigned char>(bytes + 64, 0));
    for (int s = 0; s < nsources; ++s) {
      if (given != nullptr) {
        std::memcpy(host[s].data(), (*given)[s].data(), bytes);
      } else {
        for (size_t i = 0; i < bytes; ++i) host[s][i] = uint8_t(rng());
      }
    }
    auto offsetOf = [&](size_t b) { return c.offsets.empty() ? size_t(0) : c.offsets[b % c.offsets.size()]; };
    // Host: buffers at the same offsets.
    std::vector<std::vector<unsigned char>> placed(host.size(), std::vector<unsigned char>(bytes + 64, 0));
    for (size_t b = 0; b < host.size(); ++b) std::memcpy(placed[b].data() + offsetOf(b), host[b].data(), bytes);
    const size_t dstIndex = c.dstAliases >= 0 ? size_t(c.dstAliases) : host.size() - 1;
    std::vector<const void*> hostPartials;
    for (int p = 0; p < c.npartials; ++p) hostPartials.push_back(placed[p].data() + offsetOf(p));
    reduce(test::configFor(CpuIsa::kScalar), c.r, placed[dstIndex].data() + offsetOf(dstIndex), hostPartials.data(),
           c.npartials, c.withLocal ? placed[nsources - 1].data() + offsetOf(nsources - 1) : nullptr, c.count,
           c.applyPost);
    // Device.
    std::vector<std::unique_ptr<DeviceBuffer>> device;
    for (size_t b = 0; b < host.size(); ++b) {
      device.push_back(std::make_unique<DeviceBuffer>(bytes + 64));
      if (device.back()->get() == nullptr) return "cudaMalloc failed";
      if (cudaMemcpy(device.back()->get() + offsetOf(b), host[b].data(), bytes, cudaMemcpyHostToDevice) !=
          cudaSuccess) {
        return "cudaMemcpy to the device failed";
      }
    }
    std::vector<const void*> devPartials;
    for (int p = 0; p < c.npartials; ++p) devPartials.push_back(device[p]->get() + offsetOf(p));
    unsigned char* devDst = device[dstIndex]->get() + offsetOf(dstIndex);
    const Status st = cuda::reduce(c.r, devDst, devPartials.data(), c.npartials,
                                   c.withLocal ? device[nsources - 1]->get() + offsetOf(nsources - 1) : nullptr,
                                   c.count, c.applyPost, stream_);
    if (!st.isOk()) return st.toString();
    if (cudaStreamSynchronize(stream_) != cudaSuccess) return "kernel failed";
    std::vector<unsigned char> got(bytes);
    if (cudaMemcpy(got.data(), devDst, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return "cudaMemcpy back failed";
    const unsigned char* expected = placed[dstIndex].data() + offsetOf(dstIndex);
    std::ostringstream err;
    int bad = 0;
    for (size_t i = 0; i < c.count; ++i) {
      const unsigned char* e = expected + i * size;
      const unsigned char* g = got.data() + i * size;
      if (std::memcmp(e, g, size) == 0) continue;
      if (ref::isNanPattern(c.r.type, e) && ref::isNanPattern(c.r.type, g)) continue;
      if (++bad <= 3) err << dataTypeName(c.r.type) << " " << redOpName(c.r.op) << " element " << i << " differs\n";
    }
    if (bad > 0) err << bad << " of " << c.count << " differ";
    return err.str();
  }

  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaKernels, EveryTypeOpAndShapeMatchesTheHost) {
  uint64_t seed = 9;
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (RedOp op : kAllOps) {
      for (Accumulation acc : {Accumulation::kElementType, Accumulation::kFloat32}) {
        // npartials 0..3, and 9 + local: longer than one launch (8 sources).
        for (int np : {0, 1, 2, 3, 9}) {
          for (bool withLocal : {false, true}) {
            if (np == 0 && !withLocal) continue;
            Case c;
            c.r = Reduction{DataType(t), op};
            c.r.scalar = seed * 0x9e3779b97f4a7c15ull;
            c.r.divisor = 1 + seed % 5;
            c.r.accumulation = acc;
            c.npartials = np;
            c.withLocal = withLocal;
            c.count = 5000 + seed % 13;
            ++seed;
            EXPECT_EQ(compare(c), "") << "npartials=" << np << " local=" << withLocal << " fp32=" << int(acc);
          }
        }
      }
    }
  }
}

TEST_F(CudaKernels, Fp8AllPairs) {
  for (DataType type : {DataType::kFloat8e4m3, DataType::kFloat8e5m2}) {
    std::vector<std::vector<unsigned char>> in(2, std::vector<unsigned char>(65536));
    for (uint32_t i = 0; i < 65536; ++i) {
      in[0][i] = uint8_t(i >> 8);
      in[1][i] = uint8_t(i);
    }
    for (RedOp op : kAllOps) {
      for (uint64_t scalar : {0x38u, 0xbcu, 0x01u, 0x7bu}) {
        Case c;
        c.r = Reduction{type, op};
        c.r.scalar = scalar;
        c.r.divisor = 3;
        c.count = 65536;
        EXPECT_EQ(compare(c, &in), "") << dataTypeName(type) << " " << redOpName(op);
        if (op != RedOp::kPreMulSum) break;  // the scalar only matters there
      }
    }
  }
}

TEST_F(CudaKernels, HalfAndBfloat16EveryValue) {
  const uint16_t halfOperands[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x0001,
                                   0x83ff, 0x0400, 0x7bff, 0x3c00, 0xbc01, 0x1400, 0xc248};
  const uint16_t bf16Operands[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001,
                                   0x807f, 0x0080, 0x7f7f, 0x3f80, 0xbf81, 0x3a80, 0xc049};
  for (DataType type : {DataType::kFloat16, DataType::kBfloat16}) {
    const uint16_t* operands = type == DataType::kFloat16 ? halfOperands : bf16Operands;
    for (int o = 0; o < 14; ++o) {
      std::vector<std::vector<unsigned char>> in(2, std::vector<unsigned char>(2 * 65536));
      for (uint32_t i = 0; i < 65536; ++i) {
        std::memcpy(in[0].data() + 2 * i, &i, 2);
        std::memcpy(in[1].data() + 2 * i, &operands[o], 2);
      }
      for (RedOp op : kAllOps) {
        Case c;
        c.r = Reduction{type, op};
        c.r.scalar = operands[(o + 5) % 14];
        c.r.divisor = 7;
        c.count = 65536;
        EXPECT_EQ(compare(c, &in), "") << dataTypeName(type) << " " << redOpName(op) << " operand " << o;
      }
    }
  }
}

TEST_F(CudaKernels, OddLengthsAndEveryMisalignment) {
  for (DataType type : {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                        DataType::kFloat8e4m3, DataType::kBfloat16}) {
    for (size_t offset = 1; offset < 64; ++offset) {
      for (size_t count : {size_t(1), size_t(17), size_t(1000 + offset)}) {
        Case c;
        c.r = Reduction{type, offset % 2 ? RedOp::kSum : RedOp::kPreMulSum};
        c.r.scalar = 0x3c;
        c.count = count;
        c.offsets = {offset};  // all buffers alike: the packed body runs
        EXPECT_EQ(compare(c), "") << "offset " << offset << " count " << count;
        c.offsets = {offset, (offset * 7) % 64, 0};  // mixed: element by element
        EXPECT_EQ(compare(c), "") << "mixed offsets " << offset << " count " << count;
      }
    }
  }
  Case big;
  big.r = Reduction{DataType::kBfloat16, RedOp::kSum};
  big.count = (size_t(1) << 22) + 3;
  big.offsets = {2};
  EXPECT_EQ(compare(big), "") << "4 Mi elements";
}

TEST_F(CudaKernels, DstAliasesASource) {
  for (int alias : {0, 1, 2}) {  // first partial, second partial, local
    Case c;
    c.r = Reduction{DataType::kFloat32, RedOp::kPreMulSum};
    c.r.scalar = 0x3f000000;  // 0.5f
    c.npartials = 2;
    c.count = 100003;
    c.dstAliases = alias;
    EXPECT_EQ(compare(c), "") << "alias " << alias;
  }
}

TEST_F(CudaKernels, CopyToManyDestinations) {
  for (int ndsts : {1, 2, 9}) {
    for (size_t offset : {size_t(0), size_t(5)}) {
      const size_t bytes = (size_t(1) << 20) + 77;
      std::vector<unsigned char> src(bytes);
      for (size_t i = 0; i < bytes; ++i) src[i] = uint8_t(i * 31 + 1);
      DeviceBuffer devSrc(bytes + 64);
      ASSERT_NE(devSrc.get(), nullptr);
      ASSERT_EQ(cudaMemcpy(devSrc.get() + offset, src.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      std::vector<std::unique_ptr<DeviceBuffer>> dsts;
      std::vector<void*> ptrs;
      for (int d = 0; d < ndsts; ++d) {
        dsts.push_back(std::make_unique<DeviceBuffer>(bytes + 64));
        ASSERT_EQ(cudaMemset(dsts.back()->get(), 0, bytes + 64), cudaSuccess);
        ptrs.push_back(dsts.back()->get() + (d % 2 == 0 ? offset : 64 - offset - 1));
      }
      ASSERT_TRUE(cuda::copyToMany(ptrs.data(), ndsts, devSrc.get() + offset, bytes, stream_).isOk());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      std::vector<unsigned char> got(bytes);
      for (int d = 0; d < ndsts; ++d) {
        ASSERT_EQ(cudaMemcpy(got.data(), ptrs[d], bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(std::memcmp(got.data(), src.data(), bytes), 0) << "destination " << d << " of " << ndsts;
      }
    }
  }
}

// Without a device (or driver) calls fail with a CUDA error instead of
// crashing; with one, this test has nothing to check.
TEST(CudaKernelsWithoutDevice, CallsReportAnErrorInsteadOfCrashing) {
  if (cuda::deviceCount() > 0) GTEST_SKIP() << "skipped: a CUDA device is present";
  float a = 1, b = 2, out = 0;
  const void* partials[] = {&a};
  const Status st = cuda::reduce(Reduction{DataType::kFloat32, RedOp::kSum}, &out, partials, 1, &b, 1, false, nullptr);
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kCudaError) << st.toString();
  EXPECT_EQ(out, 0.0f);
}

}  // namespace
}  // namespace loom::kernels
