// Expert parallelism's token dispatchers (model/token_dispatch.h) on real ranks (mpirun -n 2 and
// -n 4): every rank sends uneven row counts per global expert (some zero, one rank none at all),
// the expert side must hold exactly the rows of this rank's experts, grouped by local expert and
// then by source rank, and combine must bring each row's expert output back to the row's place.
// Both dispatchers must do exactly that. Values are small integers: every copy is exact.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/token_dispatch.h"
#include "parallel/mpi_process_group.h"

using namespace primus;

namespace {

constexpr int64_t kExperts = 8, kWidth = 3;

// Rows rank `src` sends expert e: uneven, with zeros; under `empty_rank` that rank sends none.
int64_t rows_for(int src, int64_t e, int empty_rank) {
  if (src == empty_rank) return 0;
  return (src * 3 + e * 5) % 4;  // 0..3
}

float value(int src, int64_t e, int64_t j, int64_t c) { return float(src * 100000 + e * 1000 + j * 10 + c); }

void check_dispatcher(TokenDispatch type, int empty_rank) {
  auto& world = parallel::mpi_world();
  const int P = world.size(), me = world.rank();
  TokenDispatcher d(world, cpu::cpu_backend(), kExperts, type);
  const int64_t L = kExperts / P;

  // This rank's token side: rows grouped by global expert.
  std::vector<int64_t> offsets(kExperts + 1, 0);
  for (int64_t e = 0; e < kExperts; ++e) offsets[size_t(e + 1)] = offsets[size_t(e)] + rows_for(me, e, empty_rank);
  const int64_t T = offsets.back();
  Tensor x;
  if (T > 0) {
    x = Tensor::empty({T, kWidth});
    for (int64_t e = 0; e < kExperts; ++e)
      for (int64_t j = 0; j < rows_for(me, e, empty_rank); ++j)
        for (int64_t c = 0; c < kWidth; ++c) x.data<float>()[(offsets[size_t(e)] + j) * kWidth + c] = value(me, e, j, c);
  }

  const DispatchPlan plan = d.plan(offsets);
  EXPECT_EQ(plan.token_rows, T);
  const Tensor xp = d.dispatch(plan, x, kWidth, DType::F32);

  // The expert side: this rank's experts only, each grouped by source rank in rank order.
  int64_t at = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    const bool mine = e / L == me;
    int64_t n = 0;
    if (mine)
      for (int s = 0; s < P; ++s) n += rows_for(s, e, empty_rank);
    ASSERT_EQ(plan.expert_offsets[size_t(e + 1)] - plan.expert_offsets[size_t(e)], n) << "expert " << e;
    if (!mine) continue;
    for (int s = 0; s < P; ++s)
      for (int64_t j = 0; j < rows_for(s, e, empty_rank); ++j, ++at)
        for (int64_t c = 0; c < kWidth; ++c)
          ASSERT_EQ(xp.data<float>()[at * kWidth + c], value(s, e, j, c))
              << "expert " << e << " from rank " << s << " row " << j;
  }
  EXPECT_EQ(at, plan.expert_rows);
  EXPECT_EQ(xp.defined(), plan.expert_rows > 0);

  // An "expert" that doubles its rows and adds its index: combine returns each row's output to
  // the row's place on its own rank.
  Tensor yp;
  if (plan.expert_rows > 0) {
    yp = Tensor::empty({plan.expert_rows, kWidth});
    for (int64_t e = 0; e < kExperts; ++e)
      for (int64_t r = plan.expert_offsets[size_t(e)]; r < plan.expert_offsets[size_t(e + 1)]; ++r)
        for (int64_t c = 0; c < kWidth; ++c)
          yp.data<float>()[r * kWidth + c] = 2 * xp.data<float>()[r * kWidth + c] + float(e);
  }
  const Tensor y = d.combine(plan, yp, kWidth, DType::F32);
  ASSERT_EQ(y.defined(), T > 0);
  for (int64_t e = 0; e < kExperts; ++e)
    for (int64_t j = 0; j < rows_for(me, e, empty_rank); ++j)
      for (int64_t c = 0; c < kWidth; ++c)
        ASSERT_EQ(y.data<float>()[(offsets[size_t(e)] + j) * kWidth + c], 2 * value(me, e, j, c) + float(e))
            << "expert " << e << " row " << j;
}

}  // namespace

TEST(TokenDispatch, AllToAllDeliversAndReturnsEveryRow) { check_dispatcher(TokenDispatch::AllToAll, -1); }
TEST(TokenDispatch, AllGatherDeliversAndReturnsEveryRow) { check_dispatcher(TokenDispatch::AllGather, -1); }
// A rank without a single routed row still joins every collective (and receives rows).
TEST(TokenDispatch, AllToAllWithARankWithoutRows) { check_dispatcher(TokenDispatch::AllToAll, 1); }
TEST(TokenDispatch, AllGatherWithARankWithoutRows) { check_dispatcher(TokenDispatch::AllGather, 1); }

TEST(TokenDispatch, UnknownTypeIsRefusedByName) {
  try {
    parse_token_dispatch("flex");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("moe_token_dispatcher_type 'flex'"), std::string::npos) << e.what();
  }
}
