// The shape-only backend's parts on their own: the meta device counts bytes and holds none, the
// backend records every call, the router's load, and the recording process group.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "core/meta_device.h"
#include "kernels/host_values.h"
#include "kernels/meta/meta_backend.h"
#include "parallel/recording_process_group.h"

namespace primus {
namespace {

TEST(MetaDevice, CountsBytesHoldsNoneAndReadsAsZeros) {
  const size_t base = meta_memory_stats().in_use;
  reset_peak_meta_memory();
  {
    Tensor a = Tensor::empty({1000, 1000}, DType::F32, Device::Meta);  // 4 MB, never touched
    Tensor b = Tensor::zeros({3}, DType::BF16, Device::Meta);          // 6 bytes: one 64-byte block
    EXPECT_EQ(meta_memory_stats().in_use - base, size_t(4'000'000 + 64));
    EXPECT_TRUE(is_meta_address(a.raw()));
    EXPECT_FALSE(is_meta_address(&base));
    EXPECT_NE(a.raw(), b.raw());
    Tensor v = a.slice(0, 10, 5);  // views share the storage
    EXPECT_EQ(static_cast<const char*>(v.raw()) - static_cast<const char*>(a.raw()), 10 * 1000 * 4);
    EXPECT_EQ(meta_memory_stats().in_use - base, size_t(4'000'000 + 64));
    // To the host: zeros. From the host: nothing moves.
    Tensor host = Tensor::empty({3}, DType::F32);
    host.data<float>()[1] = 7;
    Tensor m = host.to(Device::Meta);
    EXPECT_EQ(ops::host_values(m), std::vector<double>(3, 0.0));
  }
  EXPECT_EQ(meta_memory_stats().in_use, base);
  EXPECT_GE(meta_memory_stats().peak - base, size_t(4'000'000 + 64));
}

TEST(MetaBackend, RecordsEveryCallWithItsShapesAndCosts) {
  ops::MetaBackend be;
  Tensor A = be.empty({8, 16}, DType::BF16), B = be.empty({32, 16}, DType::BF16), D = be.empty({8, 32}, DType::F32);
  be.gemm(false, true, 1.0f, A, B, 0.0f, Tensor(), D, Tensor());
  ASSERT_EQ(be.calls().size(), 1u);
  const ops::OpCall& g = be.calls().front();
  EXPECT_STREQ(g.op, "gemm");
  EXPECT_EQ(g.a, 8);
  EXPECT_EQ(g.b, 32);
  EXPECT_EQ(g.c, 16);
  EXPECT_EQ(g.dtype, DType::BF16);
  EXPECT_EQ(g.out, DType::F32);
  EXPECT_DOUBLE_EQ(g.flops, 2.0 * 8 * 32 * 16);
  EXPECT_DOUBLE_EQ(g.bytes, 8 * 16 * 2 + 32 * 16 * 2 + 8 * 32 * 4);
  EXPECT_EQ(g.weight, B.raw());  // the weight it reads: y = x W^T
  // A device copy of a column block and a zeroed tensor are device work too.
  copy_block(D, 0, 0, be.zeros({8, 32}, DType::F32), 0, 0, 8, 4);
  const auto calls = be.take_calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_STREQ(calls[1].op, "zero");
  EXPECT_STREQ(calls[2].op, "copy");
  EXPECT_EQ(calls[2].a, 8);       // rows
  EXPECT_EQ(calls[2].b, 4 * 4);   // bytes per row
  EXPECT_EQ(calls[2].c, 32 * 4);  // pitches
  EXPECT_TRUE(be.calls().empty());
  Tensor m = be.empty({4}, DType::F32), s = be.empty({4}, DType::F32), zt = be.empty({4}, DType::F32);
  EXPECT_EQ(be.ce_finish(m, s, zt, be.empty({4}, DType::I32), m), 0.0);  // a loss of 0
  EXPECT_EQ(be.row_dots(A, {0, 1, 2}, be.empty({3, 16}, DType::BF16)), std::vector<double>(3, 0.0));
  // One shape-only backend at a time: it owns the meta device's observer.
  EXPECT_THROW(ops::MetaBackend second, Error);
}

TEST(RouterLoad, BalancedOrAMeasuredHistogram) {
  ops::RouterLoad balanced;
  EXPECT_EQ(balanced.counts(0, 10, 2, 4), (std::vector<int64_t>{5, 5, 5, 5}));
  EXPECT_EQ(balanced.counts(0, 3, 3, 4), (std::vector<int64_t>{3, 2, 2, 2}));  // the remainder to the lowest
  ops::RouterLoad measured;
  measured.shares = {3, 1, 0, 0};
  measured.per_layer[5] = {1, 1, 1, 1};
  EXPECT_EQ(measured.counts(0, 8, 1, 4), (std::vector<int64_t>{6, 2, 0, 0}));
  EXPECT_EQ(measured.counts(5, 8, 1, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  const auto odd = measured.counts(0, 7, 1, 4);
  EXPECT_EQ(std::accumulate(odd.begin(), odd.end(), int64_t(0)), 7);
  measured.shares = {1, 1};
  EXPECT_THROW(measured.counts(0, 8, 1, 4), Error);  // two shares for four experts
}

TEST(RecordingProcessGroup, RecordsCollectivesAndTheirOverlap) {
  size_t clock = 0;
  parallel::CommLog log([&] { return clock; });
  parallel::RecordingProcessGroup g("tp", 4, 0, log);
  Tensor t = Tensor::empty({256}, DType::BF16, Device::Meta);
  g.all_reduce(t);
  Tensor big = Tensor::empty({1024}, DType::BF16, Device::Meta);
  g.all_gather(t, big);
  auto recv = g.irecv(t, 3, 0);
  clock = 5;  // five ops ran while it was in flight
  recv->wait();
  ASSERT_EQ(log.calls().size(), 3u);
  EXPECT_STREQ(log.calls()[0].op, "all_reduce");
  EXPECT_DOUBLE_EQ(log.calls()[0].bytes, 512);
  EXPECT_DOUBLE_EQ(log.calls()[1].bytes, 2048);  // a gather counts its output
  EXPECT_EQ(log.calls()[1].ranks, 4);
  EXPECT_EQ(log.calls()[2].issued, 0u);
  EXPECT_EQ(log.calls()[2].waited, 5u);
  // Host values: as if every rank held this one's.
  std::vector<double> sum = {1.5, 2};
  g.all_reduce(sum);
  EXPECT_EQ(sum, (std::vector<double>{6, 8}));
  std::vector<int64_t> most = {3, -3};
  g.all_reduce(most, parallel::ReduceOp::Max);
  EXPECT_EQ(most, (std::vector<int64_t>{3, -3}));
  std::vector<int32_t> mine = {7}, all(4, 0);
  g.all_gather(mine.data(), all.data(), 1, parallel::CommType::I32);
  EXPECT_EQ(all, std::vector<int32_t>(4, 7));
}

}  // namespace
}  // namespace primus
