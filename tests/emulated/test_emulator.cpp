// The GPU emulation's own tests: launches are refused as a GPU refuses them, shuffles and the
// tensor-core instructions follow the PTX ISA, and each class of kernel bug the emulation exists
// to catch is caught (death tests: the emulator aborts with a message naming the bug).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "selftest_kernels.h"

namespace primus::gputest {
namespace {

using emutest::launch_write_flag;

class EmulatedGpu : public testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    PRIMUS_REQUIRE_GPU();
  }
};

TEST_F(EmulatedGpu, LaunchesAreCheckedAsOnAGpu) {
  DeviceArray<int> flag(1);
  ASSERT_EQ(emutest::allow_dynamic_smem_for_write_flag(48 * 1024), cudaSuccess);  // the default (for --gtest_repeat)
  EXPECT_EQ(launch_write_flag(flag.get(), 0, 32, 0), cudaErrorInvalidConfiguration) << "zero blocks";
  EXPECT_EQ(launch_write_flag(flag.get(), 1, 1025, 0), cudaErrorInvalidConfiguration) << "1025 threads";
  EXPECT_EQ(launch_write_flag(flag.get(), 1, 32, 64 * 1024), cudaErrorInvalidValue)
      << "64 KB of dynamic shared memory without cudaFuncSetAttribute";
  EXPECT_EQ(flag.host()[0], 0) << "a refused launch ran";
  EXPECT_EQ(emutest::allow_dynamic_smem_for_write_flag(228 * 1024), cudaErrorInvalidValue) << "over 227 KB";
  cudaGetLastError();
  ASSERT_EQ(emutest::allow_dynamic_smem_for_write_flag(64 * 1024), cudaSuccess);
  EXPECT_EQ(launch_write_flag(flag.get(), 1, 32, 64 * 1024), cudaSuccess);
  EXPECT_EQ(flag.host()[0], 7);
  EXPECT_EQ(launch_write_flag(flag.get(), 1, 32, 64 * 1024 + 16), cudaErrorInvalidValue) << "over the attribute";
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_EQ(p.major, 9);
  EXPECT_EQ(p.multiProcessorCount, 132);
  EXPECT_EQ(p.sharedMemPerBlockOptin, size_t(227 * 1024));
}

TEST_F(EmulatedGpu, ShufflesFollowTheCudaSemantics) {
  for (const int width : {32, 8}) {
    for (const int delta : {1, 3, 5}) {
      DeviceArray<int> out(32 * 4);
      ASSERT_EQ(emutest::launch_shuffles(out.get(), delta, width), cudaSuccess);
      const std::vector<int> got = out.host();
      for (int lane = 0; lane < 32; ++lane) {
        const int seg = lane / width * width, in_seg = lane % width;
        const int up = in_seg >= delta ? lane - delta : lane;
        const int down = in_seg + delta < width ? lane + delta : lane;
        const int x = lane ^ delta, bfly = x < seg + width ? x : lane;  // later segments: own value
        const int idx = seg + delta % width;
        EXPECT_EQ(got[size_t(lane * 4)], up) << "up, lane " << lane << " delta " << delta << " width " << width;
        EXPECT_EQ(got[size_t(lane * 4 + 1)], down) << "down, lane " << lane;
        EXPECT_EQ(got[size_t(lane * 4 + 2)], bfly) << "xor, lane " << lane;
        EXPECT_EQ(got[size_t(lane * 4 + 3)], idx) << "idx, lane " << lane;
      }
    }
  }
}

TEST_F(EmulatedGpu, LdmatrixAndMmaComputeTheProduct) {
  const auto a = round_bf16(random_floats(16 * 16, 1));
  const auto b = round_bf16(random_floats(16 * 8, 2));
  const auto c = random_floats(16 * 8, 3);
  DeviceBf16 da(to_bf16_bits(a)), db(to_bf16_bits(b));
  DeviceArray<float> dc(c), dd(16 * 8);
  ASSERT_EQ(emutest::launch_mma(reinterpret_cast<__nv_bfloat16*>(da.get()), reinterpret_cast<__nv_bfloat16*>(db.get()),
                                dc.get(), dd.get()),
            cudaSuccess);
  std::vector<float> want(16 * 8);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double s = c[size_t(i * 8 + j)];
      for (int k = 0; k < 16; ++k) s += double(a[size_t(i * 16 + k)]) * double(b[size_t(k * 8 + j)]);
      want[size_t(i * 8 + j)] = float(s);
    }
  expect_close(dd.host(), want, 1e-5, 1e-5, "D = A B + C");
}

TEST_F(EmulatedGpu, UninitialisedSharedMemoryReadsAsNaN) {
  DeviceArray<float> out(64);
  ASSERT_EQ(emutest::launch_uninitialised_shared(out.get()), cudaSuccess);
  for (const float v : out.host()) EXPECT_TRUE(std::isnan(v));
}

// ---- each bug the emulation must catch ----

TEST_F(EmulatedGpu, BarrierNotReachedByEveryThreadAborts) {
  DeviceArray<int> out(128);
  EXPECT_DEATH(emutest::launch_divergent_barrier(out.get()), "__syncthreads");
  EXPECT_DEATH(emutest::launch_early_exit_barrier(out.get()), "__syncthreads");
}

TEST_F(EmulatedGpu, ShuffleFromAnExitedLaneAborts) {
  DeviceArray<int> out(32);
  EXPECT_DEATH(emutest::launch_shuffle_from_exited_lane(out.get()), "does not take part");
}

TEST_F(EmulatedGpu, ReadingACpAsyncDestinationBeforeItsWaitAborts) {
  DeviceBf16 src(std::vector<uint16_t>(64, 0x3f80));
  DeviceArray<uint32_t> out(32);
  EXPECT_DEATH(emutest::launch_unwaited_cp_async(reinterpret_cast<__nv_bfloat16*>(src.get()), out.get()),
               "has not waited for");
}

TEST_F(EmulatedGpu, MisalignedVectorAccessAborts) {
  DeviceArray<float> p(64), out(32);
  EXPECT_DEATH(emutest::launch_misaligned_vector(p.get(), out.get()), "misaligned address");
}

TEST_F(EmulatedGpu, AccessesOutsideTheirMemoryAbort) {
  float4* p = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), 4 * sizeof(float4)), cudaSuccess);
  EXPECT_DEATH(emutest::launch_global_overrun(p, 4), "past its end");
  cudaFree(p);
  EXPECT_DEATH(emutest::launch_shared_overrun(64), "past the end of the block's shared memory");
}

}  // namespace
}  // namespace primus::gputest
