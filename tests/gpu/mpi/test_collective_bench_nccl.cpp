// benchmark collectives' engine on NCCL (one GPU per rank, under mpirun): every op's check passes
// in fp32 and bf16 over a sweep of sizes, on the world and on a layout's groups (ncclCommSplit),
// with nccl-tests' bus bandwidth. tests/emulated runs it on the emulated GPUs and NCCL.
#include <gtest/gtest.h>

#include "core/launch_env.h"
#include "gpu_per_rank.h"
#include "parallel/collective_bench.h"
#include "parallel/mesh.h"
#include "parallel/mpi_process_group.h"
#include "parallel/nccl_process_group.h"

namespace primus::parallel {
namespace {

class CollectiveBenchNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    PRIMUS_REQUIRE_A_GPU_PER_RANK();
#ifndef PRIMUS_EMULATED_GPU
    cuda::init(discover_launch_env().local_rank);
#endif
    world_ = NcclProcessGroup::create(mpi_world(), "world");
  }
  std::unique_ptr<NcclProcessGroup> world_;
};

TEST_F(CollectiveBenchNccl, EveryOpChecksOverASweepOfSizes) {
  for (DType t : {DType::F32, DType::BF16})
    for (CollOp op : kAllCollOps)
      for (int64_t bytes : size_sweep(256, 64 * 1024, 16)) {
        const CollResult r = run_collective(*world_, op, t, bytes, {1, 2, true});
        EXPECT_EQ(r.wrong, 0) << coll_op_name(op) << " " << dtype_name(t) << " " << bytes << " bytes";
        const double n = world_->size();
        if (op == CollOp::AllReduce) EXPECT_DOUBLE_EQ(r.busbw_gbs, r.algbw_gbs * 2 * (n - 1) / n);
      }
}

TEST_F(CollectiveBenchNccl, GroupsOfALayout) {
  if (world_->size() % 2) GTEST_SKIP() << "needs an even rank count";
  const RankMesh mesh(world_->size(), {1, 1, 2, 1});
  MeshGroups groups = build_groups(mesh, *world_);
  for (CollOp op : kAllCollOps) {
    const CollResult r = run_collective(groups.get(MeshDim::PP), op, DType::F32, 4096, {0, 1, true});
    EXPECT_EQ(r.wrong, 0) << coll_op_name(op) << " on pp";
  }
}

}  // namespace
}  // namespace primus::parallel
