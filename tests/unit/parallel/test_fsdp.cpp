// FSDP's two collectives on real ranks (mpirun -n 2 and -n 4), parallel/fsdp.h: a unit's tensors,
// split along a middle dim whose length is not a multiple of dp (and one shorter than dp, so
// that some ranks hold none of it), must come back whole from the all-gather of the ranks'
// shards, and the reduce-scatter of every rank's full gradient must leave each rank the exact
// sums of its rows. Values are small integers: every sum is exact.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "parallel/fsdp.h"
#include "parallel/mpi_process_group.h"

using namespace primus;
using namespace primus::parallel;

namespace {

// A unit of three tensors as [outer, length, inner] around their shard dim: a matrix split by
// rows, one split by columns (a column block of each row), and a short vector.
FsdpUnit make_unit(int dp, int rank) {
  FsdpUnit u;
  const int64_t shapes[3][3] = {{1, 7, 3}, {5, 6, 1}, {1, 1, 1}};
  for (const auto& s : shapes) {
    FsdpTensor t{s[0], s[1], s[2], u.full_numel, u.shard_numel};
    u.tensors.push_back(t);
    u.full_numel += s[0] * s[1] * s[2];
    u.shard_numel += s[0] * fsdp_rows(s[1], dp, rank).count * s[2];
  }
  return u;
}

float full_value(int64_t i, int scale) { return float(scale * (int(i % 97) + 1)); }

}  // namespace

TEST(Fsdp, RowsCoverEveryTensorOnce) {
  for (int dp : {1, 2, 3, 4, 8})
    for (int64_t length : {1, 2, 5, 7, 16}) {
      int64_t next = 0;
      for (int r = 0; r < dp; ++r) {
        const FsdpRows rows = fsdp_rows(length, dp, r);
        EXPECT_GE(rows.count, 0);
        if (rows.count > 0) EXPECT_EQ(rows.first, next) << length << " over " << dp;
        next += rows.count;
      }
      EXPECT_EQ(next, length) << length << " over " << dp;
    }
}

TEST(Fsdp, GatherAndReduceScatter) {
  auto& world = mpi_world();
  const int dp = world.size(), rank = world.rank();
  std::vector<FsdpUnit> units = {make_unit(dp, rank), make_unit(dp, rank)};
  FsdpGroup group(world, units);
  const FsdpUnit& u = group.units()[0];

  // This rank's shard of unit 0: its rows of each tensor of the full values.
  Tensor shard = Tensor::zeros({std::max<int64_t>(u.shard_numel, 1)});
  for (const FsdpTensor& t : u.tensors) {
    const FsdpRows rows = fsdp_rows(t.length, dp, rank);
    for (int64_t o = 0; o < t.outer; ++o)
      for (int64_t l = 0; l < rows.count; ++l)
        for (int64_t i = 0; i < t.inner; ++i)
          shard.data<float>()[t.shard_offset + (o * rows.count + l) * t.inner + i] =
              full_value(t.full_offset + (o * t.length + rows.first + l) * t.inner + i, 1);
  }
  // Two gathers in flight at once (a prefetch), completed in order.
  Tensor full0 = Tensor::empty({u.full_numel}), full1 = Tensor::empty({u.full_numel});
  auto g0 = group.start_gather(0, shard, full0);
  auto g1 = group.start_gather(1, shard, full1);
  EXPECT_GT(g0->bytes(), 0);
  g0->wait();
  g1->wait();
  EXPECT_EQ(g0->bytes(), 0);  // the wire buffers are released
  for (int64_t i = 0; i < u.full_numel; ++i) {
    ASSERT_EQ(full0.data<float>()[i], full_value(i, 1)) << "element " << i;
    ASSERT_EQ(full1.data<float>()[i], full_value(i, 1)) << "element " << i;
  }

  // Rank q's full gradient is (q + 1) x the values: the sum over ranks is dp (dp + 1) / 2 x them.
  Tensor grads = Tensor::empty({u.full_numel});
  for (int64_t i = 0; i < u.full_numel; ++i) grads.data<float>()[i] = full_value(i, rank + 1);
  Tensor shard_grads = Tensor::zeros({std::max<int64_t>(u.shard_numel, 1)});
  auto red = group.start_reduce(0, grads, shard_grads);
  red->wait();
  const int sum = dp * (dp + 1) / 2;
  for (const FsdpTensor& t : u.tensors) {
    const FsdpRows rows = fsdp_rows(t.length, dp, rank);
    for (int64_t o = 0; o < t.outer; ++o)
      for (int64_t l = 0; l < rows.count; ++l)
        for (int64_t i = 0; i < t.inner; ++i)
          ASSERT_EQ(shard_grads.data<float>()[t.shard_offset + (o * rows.count + l) * t.inner + i],
                    full_value(t.full_offset + (o * t.length + rows.first + l) * t.inner + i, sum));
  }
}

TEST(Fsdp, WrongBufferIsAnError) {
  auto& world = mpi_world();
  FsdpGroup group(world, {make_unit(world.size(), world.rank())});
  Tensor shard = Tensor::zeros({64}), wrong = Tensor::empty({3});
  EXPECT_THROW(group.start_gather(0, shard, wrong), Error);
  EXPECT_THROW(group.start_reduce(0, wrong, shard), Error);
}
