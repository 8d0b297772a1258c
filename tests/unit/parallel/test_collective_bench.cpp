// benchmark collectives' engine (parallel/collective_bench.h) on real MPI ranks: every op's check
// passes over a sweep of sizes and dtypes, on the world and on the groups of a layout; the bus
// bandwidth is the algorithm bandwidth times nccl-tests' factor, computed here by hand; a group
// that corrupts a result is caught by the check.
#include <gtest/gtest.h>

#include "parallel/collective_bench.h"
#include "parallel/mesh.h"
#include "parallel/mpi_process_group.h"

namespace primus::parallel {
namespace {

TEST(CollectiveBench, EveryOpChecksOverASweepOfSizes) {
  ProcessGroup& world = mpi_world();
  const CollBenchOptions o{1, 2, true};
  for (DType t : {DType::F32, DType::BF16, DType::I32})
    for (CollOp op : kAllCollOps)
      for (int64_t bytes : size_sweep(64, 256 * 1024, 8)) {
        const CollResult r = run_collective(world, op, t, bytes, o);
        EXPECT_TRUE(r.checked);
        EXPECT_EQ(r.wrong, 0) << coll_op_name(op) << " " << dtype_name(t) << " " << bytes << " bytes";
        EXPECT_GT(r.seconds, 0);
      }
}

TEST(CollectiveBench, BusBandwidthByHand) {
  ProcessGroup& world = mpi_world();
  const double n = world.size();
  const CollResult r = run_collective(world, CollOp::AllReduce, DType::F32, 1 << 16, {1, 3, false});
  EXPECT_EQ(r.bytes, 1 << 16);
  EXPECT_EQ(r.count, (1 << 16) / 4);
  EXPECT_DOUBLE_EQ(r.algbw_gbs, 65536.0 / r.seconds / 1e9);
  EXPECT_DOUBLE_EQ(r.busbw_gbs, r.algbw_gbs * 2 * (n - 1) / n);
  // all_gather's size is the gathered buffer: a size that does not split evenly is rounded down.
  const CollResult g = run_collective(world, CollOp::AllGather, DType::F32, 4000 + 4, {0, 1, false});
  EXPECT_EQ(g.count, 1001 / world.size());
  EXPECT_EQ(g.bytes, g.count * 4 * world.size());
  EXPECT_DOUBLE_EQ(g.busbw_gbs, g.algbw_gbs * (n - 1) / n);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollOp::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollOp::SendRecv, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollOp::AllToAll, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollOp::ReduceScatter, 8), 7.0 / 8);
}

TEST(CollectiveBench, GroupsOfALayout) {
  ProcessGroup& world = mpi_world();
  if (world.size() % 2) GTEST_SKIP() << "needs an even rank count";
  const RankMesh mesh(world.size(), {1, 1, 2, 1});  // pp 2
  MeshGroups groups = build_groups(mesh, world);
  for (MeshDim d : {MeshDim::PP, MeshDim::DP})
    for (CollOp op : kAllCollOps) {
      const CollResult r = run_collective(groups.get(d), op, DType::F32, 4096, {0, 1, true});
      EXPECT_EQ(r.ranks, mesh.size(d));
      EXPECT_EQ(r.wrong, 0) << coll_op_name(op) << " on " << mesh_dim_name(d);
    }
}

// A group whose all_reduce gets one element wrong on rank 0: the check must count it.
class OffByOneGroup : public ProcessGroup {
 public:
  explicit OffByOneGroup(ProcessGroup& g) : g_(g) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  const std::string& name() const override { return g_.name(); }
  std::string backend() const override { return g_.backend(); }
  Device device() const override { return g_.device(); }
  const std::vector<int>& world_ranks() const override { return g_.world_ranks(); }
  void all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override {
    g_.all_reduce(buf, count, t, op);
    if (t == CommType::F32 && count > 1 && rank() == 0) static_cast<float*>(buf)[1] += 1;
  }
  void reduce_scatter(const void* s, void* r, int64_t c, CommType t, ReduceOp op) override {
    g_.reduce_scatter(s, r, c, t, op);
  }
  void all_gather(const void* s, void* r, int64_t c, CommType t) override { g_.all_gather(s, r, c, t); }
  void broadcast(void* b, int64_t c, CommType t, int root) override { g_.broadcast(b, c, t, root); }
  void all_to_all(const void* s, void* r, int64_t c, CommType t) override { g_.all_to_all(s, r, c, t); }
  void barrier() override { g_.barrier(); }
  WorkPtr iall_reduce(void* b, int64_t c, CommType t, ReduceOp op) override { return g_.iall_reduce(b, c, t, op); }
  WorkPtr ireduce_scatter(const void* s, void* r, int64_t c, CommType t, ReduceOp op) override {
    return g_.ireduce_scatter(s, r, c, t, op);
  }
  WorkPtr iall_gather(const void* s, void* r, int64_t c, CommType t) override { return g_.iall_gather(s, r, c, t); }
  WorkPtr isend(const void* b, int64_t c, CommType t, int dst, int tag) override { return g_.isend(b, c, t, dst, tag); }
  WorkPtr irecv(void* b, int64_t c, CommType t, int src, int tag) override { return g_.irecv(b, c, t, src, tag); }
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
    return g_.split(color, key, name);
  }

 private:
  ProcessGroup& g_;
};

TEST(CollectiveBench, CheckCountsAWrongResult) {
  OffByOneGroup bad(mpi_world());
  const CollResult r = run_collective(bad, CollOp::AllReduce, DType::F32, 1024, {0, 1, true});
  EXPECT_EQ(r.wrong, 1);
}

TEST(CollectiveBench, SizesAndNames) {
  EXPECT_EQ(parse_byte_size("64K"), 65536);
  EXPECT_EQ(parse_byte_size("1M"), 1 << 20);
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  EXPECT_EQ(size_sweep(1024, 8192, 2), (std::vector<int64_t>{1024, 2048, 4096, 8192}));
  EXPECT_EQ(parse_coll_op("allreduce"), CollOp::AllReduce);
  EXPECT_EQ(parse_coll_op("all_to_all"), CollOp::AllToAll);
  EXPECT_THROW(parse_coll_op("allreduse"), Error);
  EXPECT_THROW(parse_byte_size("12X"), Error);
  EXPECT_THROW(size_sweep(1024, 8192, 1), Error);
  EXPECT_EQ(parse_coll_dtype("bf16"), DType::BF16);
}

}  // namespace
}  // namespace primus::parallel
