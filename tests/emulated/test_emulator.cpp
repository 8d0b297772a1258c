// The GPU emulation's own tests: launches are refused as a GPU refuses them, shuffles and the
// tensor-core instructions follow the PTX ISA, fresh memory is poisoned, blocks interleave,
// streams defer their work, and each class of bug the emulation exists to catch is caught (death
// tests: the emulator aborts with a message naming the bug), among them the patterns of the
// mutation audit's survivors (docs/cuda.md): races between blocks, a read one past the end, an
// index past 2^31 through 32 bits, bank conflicts, a missing event wait between streams.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "emu/counters.h"
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

TEST_F(EmulatedGpu, FreshDeviceMemoryIsPoisonedWithNaN) {
  for (const size_t bytes : {size_t(4), size_t(1000), size_t(100) << 20}) {  // the last one is sparse
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    std::vector<uint32_t> words(std::min<size_t>(bytes, 4096) / 4);
    ASSERT_EQ(cudaMemcpy(words.data(), static_cast<char*>(p) + bytes - words.size() * 4, words.size() * 4,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (const uint32_t w : words) ASSERT_EQ(w, 0xffffffffu) << bytes << "-byte allocation";
    float f;
    std::memcpy(&f, words.data(), 4);
    EXPECT_TRUE(std::isnan(f));
    ASSERT_EQ(cudaFree(p), cudaSuccess);
  }
}

// The chunked cross-entropy reading one column past its chunk (`<=` for `<`): one element past an
// allocation of exactly n elements is outside it, however the allocator rounds.
TEST_F(EmulatedGpu, ReadingOnePastTheEndAborts) {
  for (const int n : {13, 64, 1000}) {
    DeviceArray<float> in(random_floats(size_t(n), 5)), out(size_t(n) + 1);
    ASSERT_EQ(emutest::launch_double(in.get(), out.get(), n, false), cudaSuccess);
    EXPECT_EQ(out.host()[size_t(n) - 1], 2.f * random_floats(size_t(n), 5)[size_t(n) - 1]);
    EXPECT_DEATH(emutest::launch_double(in.get(), out.get(), n, true), "past its end");
  }
}

// The flash attention backward's dQ accumulated with += instead of atomicAdd: blocks of one launch
// touching the same words without atomics are reported, whatever the schedule.
TEST_F(EmulatedGpu, RacesBetweenBlocksAbort) {
  DeviceArray<float2> acc(size_t{96});
  ASSERT_EQ(emutest::launch_accumulate(acc.get(), 96, 5, true), cudaSuccess);
  for (const float2 v : acc.host()) {
    ASSERT_EQ(v.x, 15.f);  // 1 + 2 + ... + 5
    ASSERT_EQ(v.y, 5.f);
  }
  EXPECT_DEATH(emutest::launch_accumulate(acc.get(), 96, 5, false), "race between the blocks of one launch");
  DeviceArray<int> flag(size_t{1}), out(size_t{4});
  EXPECT_DEATH(emutest::launch_flag_between_blocks(flag.get(), out.get(), 4), "race between the blocks");
  DeviceArray<int> x(size_t{64 * 6});
  ASSERT_EQ(emutest::launch_own_part(x.get(), 6), cudaSuccess);  // blocks apart: no race
  const auto got = x.host();
  for (int i = 0; i < 64 * 6; ++i) ASSERT_EQ(got[size_t(i)], i + (i / 64 * 64 + (i % 64 + 1) % 64));
}

TEST_F(EmulatedGpu, SeveralBlocksAreResidentAndInterleave) {
  const emu::Counters before = emu::counters();
  DeviceArray<int> x(size_t{64 * 16});
  for (int k = 0; k < 12; ++k) ASSERT_EQ(emutest::launch_own_part(x.get(), 16), cudaSuccess);
  const emu::Counters after = emu::counters();
  EXPECT_GE(after.max_resident_blocks, 2u) << "no launch kept several blocks resident";
  EXPECT_GT(after.memory_switches, before.memory_switches) << "no thread switch at a memory access";
}

// The fused AdamW's element offsets in 32 bits: an index past 2^31 elements into a sparse
// allocation of more than 2^31 floats (only the touched pages cost memory).
TEST_F(EmulatedGpu, IndicesPast2To31ElementsInASparseAllocation) {
  const int64_t n = (int64_t(1) << 31) + (1 << 20);
  float* x = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&x), size_t(n) * sizeof(float)), cudaSuccess);
  const int64_t base = (int64_t(1) << 31) + 4096 + 16;
  ASSERT_EQ(emutest::launch_write_at(x, base, false), cudaSuccess);
  std::vector<float> got(34);
  ASSERT_EQ(cudaMemcpy(got.data(), x + base - 1, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::isnan(got[0])) << "untouched: still poisoned";
  for (int t = 0; t < 32; ++t) EXPECT_EQ(got[size_t(t) + 1], float(t));
  EXPECT_TRUE(std::isnan(got[33]));
  EXPECT_DEATH(emutest::launch_write_at(x, base, true), "device (memory|allocation)");
  ASSERT_EQ(cudaFree(x), cudaSuccess);
}

// A shared memory layout that is meant to be conflict-free can be asserted to be: the counter
// sees ldmatrix rows that share bank groups.
TEST_F(EmulatedGpu, BankConflictsAreCounted) {
  DeviceArray<uint32_t> out(size_t{32});
  cudaDeviceSynchronize();
  emu::Counters c0 = emu::counters();
  ASSERT_EQ(emutest::launch_ldmatrix_rows(out.get(), 16), cudaSuccess);  // 8 rows, 8 bank groups
  emu::Counters c1 = emu::counters();
  EXPECT_EQ(c1.ldmatrix_phases - c0.ldmatrix_phases, 1u);
  EXPECT_EQ(c1.ldmatrix_conflicts - c0.ldmatrix_conflicts, 0u);
  ASSERT_EQ(emutest::launch_ldmatrix_rows(out.get(), 32), cudaSuccess);  // 2 rows per bank group
  emu::Counters c2 = emu::counters();
  EXPECT_EQ(c2.ldmatrix_conflicts - c1.ldmatrix_conflicts, 1u);
  ASSERT_EQ(emutest::launch_ldmatrix_rows(out.get(), 128), cudaSuccess);  // all 8 in one group
  EXPECT_EQ(emu::counters().ldmatrix_conflicts - c2.ldmatrix_conflicts, 7u);
}

// ---- streams ----

class EmulatedStreams : public EmulatedGpu {
 protected:
  void SetUp() override {
    EmulatedGpu::SetUp();
    ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    cudaDeviceSynchronize();
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t e = nullptr;
};

// The communication stream not waiting for the compute stream: work of two streams touching the
// same memory with nothing ordering them is reported, whichever ran first.
TEST_F(EmulatedStreams, AMissingEventWaitIsAHazard) {
  DeviceArray<int> x(size_t{256}), y(size_t{256});
  auto unordered = [&] {
    emutest::queue_fill(x.get(), 256, 7, a);
    emutest::queue_copy(x.get(), y.get(), 256, b);
    cudaDeviceSynchronize();
  };
  EXPECT_DEATH(unordered(), "hazard between streams: (copy|fill)_kernel launched at .* (reads|writes) .* which "
                           "(copy|fill)_kernel launched at");
  // Ordered by an event, by the host, or by one stream: fine.
  emutest::queue_fill(x.get(), 256, 7, a);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  emutest::queue_copy(x.get(), y.get(), 256, b);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  emutest::queue_fill(x.get(), 256, 8, b);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  emutest::queue_copy(x.get(), y.get(), 256, a);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(y.host(), std::vector<int>(256, 8));
  // A copy from pageable host memory on another stream, read by a kernel without a wait.
  std::vector<int> host(256, 3);
  auto h2d = [&] {
    ASSERT_EQ(cudaMemcpyAsync(x.get(), host.data(), 1024, cudaMemcpyHostToDevice, a), cudaSuccess);
    emutest::queue_copy(x.get(), y.get(), 256, b);
    cudaDeviceSynchronize();
  };
  EXPECT_DEATH(h2d(), "hazard between streams");
}

// Work is deferred and the streams' ops run in seeded orders: two streams' work, unordered, runs
// in either order across trials (their event times say which ran first).
TEST_F(EmulatedStreams, UnorderedStreamsRunInEitherOrder) {
  DeviceArray<int> x(size_t{64}), y(size_t{64});
  cudaEvent_t ta, tb;
  ASSERT_EQ(cudaEventCreate(&ta), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&tb), cudaSuccess);
  int a_first = 0, b_first = 0;
  for (int trial = 0; trial < 40; ++trial) {
    emutest::queue_fill(x.get(), 64, trial, a);
    ASSERT_EQ(cudaEventRecord(ta, a), cudaSuccess);
    emutest::queue_fill(y.get(), 64, trial, b);
    ASSERT_EQ(cudaEventRecord(tb, b), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    float ms = 0;
    ASSERT_EQ(cudaEventElapsedTime(&ms, ta, tb), cudaSuccess);
    (ms > 0 ? a_first : b_first)++;
  }
  EXPECT_GT(a_first, 0);
  EXPECT_GT(b_first, 0);
  // Nothing runs before the host waits: a query moves the device on by one op at most.
  emutest::queue_fill(x.get(), 64, -1, a);
  emutest::queue_fill(x.get(), 64, -2, a);
  emutest::queue_fill(x.get(), 64, -3, a);
  EXPECT_EQ(cudaStreamQuery(a), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(a), cudaSuccess);
  EXPECT_EQ(x.host(), std::vector<int>(64, -3));
  cudaEventDestroy(ta);
  cudaEventDestroy(tb);
}

// The legacy default stream waits for (and is waited for by) blocking streams, not non-blocking
// ones.
TEST_F(EmulatedStreams, TheLegacyStreamSynchronisesWithBlockingStreamsOnly) {
  cudaStream_t blocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  DeviceArray<int> x(size_t{64}), y(size_t{64});
  emutest::queue_fill(x.get(), 64, 5, blocking);
  emutest::queue_copy(x.get(), y.get(), 64, nullptr);  // after the blocking stream's fill
  emutest::queue_fill(x.get(), 64, 6, blocking);       // after the legacy stream's copy
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_EQ(y.host(), std::vector<int>(64, 5));
  EXPECT_EQ(x.host(), std::vector<int>(64, 6));
  auto non_blocking = [&] {
    emutest::queue_fill(x.get(), 64, 5, a);
    emutest::queue_copy(x.get(), y.get(), 64, nullptr);
    cudaDeviceSynchronize();
  };
  EXPECT_DEATH(non_blocking(), "hazard between streams");
  cudaStreamDestroy(blocking);
}

}  // namespace
}  // namespace primus::gputest
