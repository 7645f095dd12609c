// Tests of include/nccl.h itself (no library needed): the compile-time ABI
// checks in C++ (nccl_abi_checks.h), the values of the initialiser macros,
// agreement between the C99 and C++ views of the structs, and agreement of
// the header's version with the one CMake configures (LOOM_NCCL_*).
#include <nccl.h>

#include <gtest/gtest.h>

#include <array>
#include <climits>
#include <cstddef>
#include <type_traits>

#include "header_abi_c.h"
#include "nccl_abi_checks.h"

// Handle and stream types must carry NVIDIA's struct tags: C++ code that
// mangles them (overloads, templates) then links against either header.
static_assert(std::is_same_v<ncclComm_t, ncclComm*>);
static_assert(std::is_same_v<ncclWindow_t, ncclWindow_vidmem*>);
static_assert(std::is_same_v<cudaStream_t, CUstream_st*>);
static_assert(std::is_same_v<ncclConfig_t, ncclConfig_v22800>);
static_assert(std::is_same_v<ncclSimInfo_t, ncclSimInfo_v22200>);
static_assert(std::is_standard_layout_v<ncclConfig_t> && std::is_trivial_v<ncclConfig_t>);

namespace {

constexpr std::array<std::size_t, 17> kConfigOffsets = {
    offsetof(ncclConfig_t, size),           offsetof(ncclConfig_t, magic),
    offsetof(ncclConfig_t, version),        offsetof(ncclConfig_t, blocking),
    offsetof(ncclConfig_t, cgaClusterSize), offsetof(ncclConfig_t, minCTAs),
    offsetof(ncclConfig_t, maxCTAs),        offsetof(ncclConfig_t, netName),
    offsetof(ncclConfig_t, splitShare),     offsetof(ncclConfig_t, trafficClass),
    offsetof(ncclConfig_t, commName),       offsetof(ncclConfig_t, collnetEnable),
    offsetof(ncclConfig_t, CTAPolicy),      offsetof(ncclConfig_t, shrinkShare),
    offsetof(ncclConfig_t, nvlsCTAs),       offsetof(ncclConfig_t, nChannelsPerNetPeer),
    offsetof(ncclConfig_t, nvlinkCentricSched),
};

void expectDefaultConfig(const ncclConfig_t& c) {
  EXPECT_EQ(c.size, sizeof(ncclConfig_t));
  EXPECT_EQ(c.magic, 0xcafebeefu);
  EXPECT_EQ(c.version, static_cast<unsigned>(NCCL_VERSION_CODE));
  for (int field : {c.blocking, c.cgaClusterSize, c.minCTAs, c.maxCTAs, c.splitShare,
                    c.trafficClass, c.collnetEnable, c.CTAPolicy, c.shrinkShare, c.nvlsCTAs,
                    c.nChannelsPerNetPeer, c.nvlinkCentricSched}) {
    EXPECT_EQ(field, INT_MIN);
  }
  EXPECT_EQ(c.netName, nullptr);
  EXPECT_EQ(c.commName, nullptr);
}

TEST(NcclHeader, ConfigInitializerMarksEveryOptionUnset) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  expectDefaultConfig(config);
}

TEST(NcclHeader, CInitializerEqualsCppInitializer) {
  ncclConfig_t fromC;
  loomTestCConfigInitializer(&fromC);
  expectDefaultConfig(fromC);
}

TEST(NcclHeader, SimInfoInitializer) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(info.size, sizeof(ncclSimInfo_t));
  EXPECT_EQ(info.magic, 0x74685283u);
  EXPECT_EQ(info.version, static_cast<unsigned>(NCCL_VERSION_CODE));
  EXPECT_EQ(info.estimatedTime, NCCL_UNDEF_FLOAT);

  ncclSimInfo_t fromC;
  loomTestCSimInfoInitializer(&fromC);
  EXPECT_EQ(fromC.size, info.size);
  EXPECT_EQ(fromC.magic, info.magic);
  EXPECT_EQ(fromC.version, info.version);
  EXPECT_EQ(fromC.estimatedTime, info.estimatedTime);
}

TEST(NcclHeader, CAndCppAgreeOnConfigLayout) {
  std::array<std::size_t, kConfigOffsets.size()> fromC{};
  ASSERT_EQ(loomTestCConfigOffsets(fromC.data(), fromC.size()), kConfigOffsets.size());
  EXPECT_EQ(fromC, kConfigOffsets);
  EXPECT_EQ(loomTestCConfigSize(), sizeof(ncclConfig_t));
}

TEST(NcclHeader, VersionMatchesBuildConfiguration) {
  // LOOM_TEST_NCCL_* come from LOOM_NCCL_* in the top CMakeLists.txt.
  EXPECT_EQ(NCCL_MAJOR, LOOM_TEST_NCCL_MAJOR);
  EXPECT_EQ(NCCL_MINOR, LOOM_TEST_NCCL_MINOR);
  EXPECT_EQ(NCCL_PATCH, LOOM_TEST_NCCL_PATCH);
  EXPECT_EQ(NCCL_VERSION_CODE,
            NCCL_VERSION(LOOM_TEST_NCCL_MAJOR, LOOM_TEST_NCCL_MINOR, LOOM_TEST_NCCL_PATCH));
  EXPECT_EQ(loomTestCVersionCode(), NCCL_VERSION_CODE);
  EXPECT_STREQ(NCCL_SUFFIX, "");
}

TEST(NcclHeader, HostOnlyBuildDeclaresOpaqueStream) {
  // Neither half of this test is given a CUDA include path, so both should
  // take the header's host-only branch, and they must at least agree.
  EXPECT_EQ(loomTestCHaveCudaHeaders(), LOOM_NCCL_HAVE_CUDA_HEADERS);
  if (LOOM_NCCL_HAVE_CUDA_HEADERS != 0) {
    GTEST_SKIP() << "cuda_runtime.h is on the compiler's default include path, so the "
                    "host-only branch of nccl.h cannot be reached in this build";
  }
  // The opaque declaration must be a plain pointer type, assignable from
  // nullptr, exactly like CUDA's.
  cudaStream_t stream = nullptr;
  EXPECT_EQ(stream, nullptr);
}

TEST(NcclHeader, CommNullIsNullHandle) {
  ncclComm_t comm = NCCL_COMM_NULL;
  EXPECT_EQ(comm, nullptr);
}

}  // namespace
