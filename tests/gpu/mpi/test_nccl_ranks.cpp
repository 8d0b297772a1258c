// The NCCL process group across real ranks (run under mpirun, one GPU per rank): a world over MPI,
// its tensor-, pipeline- and data-parallel sub-groups (ncclCommSplit), every collective the group
// offers in every wire type the trainer uses, and batches of isend/irecv as the pipeline posts
// them between stages. Values depend on the rank, so a wrong reduction op, count, offset or peer
// shows. On a machine with fewer GPUs than ranks every case skips (NCCL refuses two ranks on one
// GPU); tests/emulated runs it on emulated GPUs, one per rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "gpu_test_util.h"
#include "parallel/mpi_process_group.h"
#include "parallel/nccl_process_group.h"

namespace primus::parallel {
namespace {

using namespace primus::gputest;

// Every rank on its own GPU (its local rank's), or skip. (Emulated: every process has its own.)
#ifdef PRIMUS_EMULATED_GPU
#define REQUIRE_A_GPU_PER_RANK() PRIMUS_REQUIRE_GPU()
#else
#define REQUIRE_A_GPU_PER_RANK()                                                               \
  do {                                                                                         \
    if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();                        \
    int gpus_ = 0;                                                                             \
    cudaGetDeviceCount(&gpus_);                                                                \
    const LaunchEnv env_ = discover_launch_env();                                              \
    if (gpus_ < env_.local_world_size)                                                         \
      GTEST_SKIP() << gpus_ << " GPUs for " << env_.local_world_size << " ranks on this host"; \
    cuda::init(env_.local_rank);                                                               \
  } while (0)
#endif

class NcclRanks : public testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_A_GPU_PER_RANK();
    world = NcclProcessGroup::create(mpi_world(), "world");
    rank = world->rank();
    size = world->size();
  }
  std::unique_ptr<NcclProcessGroup> world;
  int rank = 0, size = 1;
};

// A value that every rank and index gives differently, small enough that sums stay exact in
// every type (bf16 included: integers below 256).
int64_t val(int r, int64_t i) { return (r * 7 + i * 3) % 29 - 9; }

template <typename T>
std::vector<T> values(int r, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(val(r, i));
  return v;
}

// bf16 buffers as uint16 bits.
std::vector<uint16_t> bf16_values(int r, int64_t n) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = bf16::from_float(float(val(r, i))).bits;
  return v;
}

int64_t fold(ReduceOp op, const std::vector<int64_t>& xs) {
  int64_t out = xs[0];
  for (size_t i = 1; i < xs.size(); ++i)
    out = op == ReduceOp::Sum ? out + xs[i] : op == ReduceOp::Max ? std::max(out, xs[i]) : std::min(out, xs[i]);
  return out;
}

// What an all_reduce over `ranks` (world ranks) gives at index i.
int64_t reduced(ReduceOp op, const std::vector<int>& ranks, int64_t i) {
  std::vector<int64_t> xs;
  for (int r : ranks) xs.push_back(val(r, i));
  return fold(op, xs);
}

std::vector<int> iota_ranks(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

template <typename T>
void check_all_reduce(ProcessGroup& g, CommType t, ReduceOp op, int64_t n) {
  const int me = g.world_ranks()[size_t(g.rank())];
  DeviceArray<T> buf(values<T>(me, n));
  g.all_reduce(buf.get(), n, t, op);
  const std::vector<T> got = buf.host();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(got[size_t(i)], T(reduced(op, g.world_ranks(), i)))
        << comm_type_name(t) << " op " << int(op) << " element " << i << " on " << g.describe();
}

void check_all_reduce_bf16(ProcessGroup& g, ReduceOp op, int64_t n) {
  const int me = g.world_ranks()[size_t(g.rank())];
  DeviceArray<uint16_t> buf(bf16_values(me, n));
  g.all_reduce(buf.get(), n, CommType::BF16, op);
  const std::vector<uint16_t> got = buf.host();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(bf16{got[size_t(i)]}.to_float(), float(reduced(op, g.world_ranks(), i)))
        << "bf16 op " << int(op) << " element " << i << " on " << g.describe();
}

TEST_F(NcclRanks, WorldMatchesMpi) {
  EXPECT_EQ(rank, mpi_world().rank());
  EXPECT_EQ(size, mpi_world().size());
  EXPECT_EQ(world->world_ranks(), iota_ranks(size));
  EXPECT_EQ(world->backend(), "nccl");
}

TEST_F(NcclRanks, AllReduceEveryOpAndType) {
  // 300000 floats: more than one 1 MiB staging round of the emulated NCCL.
  for (const ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    check_all_reduce<float>(*world, CommType::F32, op, 300000);
    check_all_reduce<double>(*world, CommType::F64, op, 1001);
    check_all_reduce<int32_t>(*world, CommType::I32, op, 77);
    check_all_reduce<int64_t>(*world, CommType::I64, op, 5);
    check_all_reduce_bf16(*world, op, 999);
  }
}

TEST_F(NcclRanks, ReduceScatterAllGatherBroadcastAllToAll) {
  const int64_t n = 1000;  // per rank
  // reduce_scatter: rank r gets the sums of elements [r n, (r+1) n).
  DeviceArray<float> send(values<float>(rank, n * size)), recv(static_cast<size_t>(n));
  world->reduce_scatter(send.get(), recv.get(), n, CommType::F32, ReduceOp::Sum);
  const auto rs = recv.host();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(rs[size_t(i)], float(reduced(ReduceOp::Sum, iota_ranks(size), rank * n + i))) << i;
  // ... in place: the input is the output's slot of the send buffer.
  DeviceArray<float> inplace(values<float>(rank, n * size));
  world->reduce_scatter(inplace.get(), inplace.get() + rank * n, n, CommType::F32, ReduceOp::Max);
  const auto ip = inplace.host();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(ip[size_t(rank * n + i)], float(reduced(ReduceOp::Max, iota_ranks(size), rank * n + i))) << i;

  // all_gather: slot q holds rank q's values.
  DeviceArray<int32_t> mine(values<int32_t>(rank, n)), all(static_cast<size_t>(n * size));
  world->all_gather(mine.get(), all.get(), n, CommType::I32);
  const auto ag = all.host();
  for (int q = 0; q < size; ++q)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ag[size_t(q * n + i)], int32_t(val(q, i))) << q << " " << i;

  // broadcast from the last rank.
  DeviceArray<double> bc(values<double>(rank, n));
  world->broadcast(bc.get(), n, CommType::F64, size - 1);
  EXPECT_EQ(bc.host(), values<double>(size - 1, n));

  // all_to_all: chunk j of rank r goes to rank j as its chunk r.
  std::vector<int64_t> a2a(static_cast<size_t>(n * size));
  for (int j = 0; j < size; ++j)
    for (int64_t i = 0; i < n; ++i) a2a[size_t(j * n + i)] = int64_t(rank) * 1000000 + j * 1000 + i;
  DeviceArray<int64_t> a2a_send(a2a), a2a_recv(static_cast<size_t>(n * size));
  world->all_to_all(a2a_send.get(), a2a_recv.get(), n, CommType::I64);
  const auto got = a2a_recv.host();
  for (int q = 0; q < size; ++q)
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[size_t(q * n + i)], int64_t(q) * 1000000 + rank * 1000 + i) << q << " " << i;

  world->barrier();
}

TEST_F(NcclRanks, AsyncOpsOrderedAfterComputeWork) {
  // Data queued on the compute stream just before the collective, no host wait in between: the
  // collective must see it (the group's stream waits for the compute stream).
  const int64_t n = 1 << 16;
  DeviceArray<float> buf(static_cast<size_t>(n));
  const std::vector<float> mine = values<float>(rank, n);
  PRIMUS_CUDA_CHECK(cudaMemcpyAsync(buf.get(), mine.data(), n * sizeof(float), cudaMemcpyHostToDevice, cuda::stream()));
  auto w = world->iall_reduce(buf.get(), n, CommType::F32, ReduceOp::Sum);
  w->wait();
  const auto got = buf.host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], float(reduced(ReduceOp::Sum, iota_ranks(size), i))) << i;
  // Host values through device staging.
  EXPECT_EQ(world->all_reduce_value(int64_t(rank + 1)), int64_t(size) * (size + 1) / 2);
  EXPECT_EQ(world->all_reduce_value(double(rank), ReduceOp::Max), double(size - 1));
}

TEST_F(NcclRanks, PointToPointBatchesLikeThePipeline) {
  // Every rank sends two messages forward and one backward and receives from both neighbours,
  // all in one batch (a pipeline stage exchanging activations and gradients).
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const int64_t n1 = 3000, n2 = 70000, nb = 555;
  DeviceArray<float> fwd1(values<float>(rank, n1)), fwd2(values<float>(rank + 10, n2));
  DeviceArray<uint16_t> bwd(bf16_values(rank + 20, nb));
  DeviceArray<float> in1(static_cast<size_t>(n1)), in2(static_cast<size_t>(n2));
  DeviceArray<uint16_t> inb(static_cast<size_t>(nb));
  std::vector<WorkPtr> works;
  works.push_back(world->irecv(in1.get(), n1, CommType::F32, prev, 1));
  works.push_back(world->isend(fwd1.get(), n1, CommType::F32, next, 1));
  works.push_back(world->isend(bwd.get(), nb, CommType::BF16, prev, 3));
  works.push_back(world->isend(fwd2.get(), n2, CommType::F32, next, 2));
  works.push_back(world->irecv(inb.get(), nb, CommType::BF16, next, 3));
  works.push_back(world->irecv(in2.get(), n2, CommType::F32, prev, 2));
  wait_all(works);
  EXPECT_EQ(in1.host(), values<float>(prev, n1));
  EXPECT_EQ(in2.host(), values<float>(prev + 10, n2));
  EXPECT_EQ(inb.host(), bf16_values(next + 20, nb));

  // A single send and receive between two ranks (others idle), then a collective.
  if (size >= 2 && rank < 2) {
    DeviceArray<int32_t> s(values<int32_t>(rank, 10)), r(size_t{10});
    auto a = world->isend(s.get(), 10, CommType::I32, 1 - rank);
    auto b = world->irecv(r.get(), 10, CommType::I32, 1 - rank);
    b->wait();
    a->wait();
    EXPECT_EQ(r.host(), values<int32_t>(1 - rank, 10));
  }
  world->barrier();
}

TEST_F(NcclRanks, SubGroupsOfAMesh) {
  // tp: consecutive pairs; dp: ranks with the same position in their pair; pp: first half and
  // second half exchange (as pipeline stages do). With two ranks tp is the world and dp singletons.
  const int tp_size = size >= 2 ? 2 : 1;
  auto tp = world->split(rank / tp_size, rank, "tp");
  auto dp = world->split(rank % tp_size, rank, "dp");
  ASSERT_NE(tp, nullptr);
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(tp->size(), tp_size);
  EXPECT_EQ(dp->size(), size / tp_size);
  EXPECT_EQ(tp->world_ranks()[size_t(tp->rank())], rank);
  EXPECT_EQ(dp->world_ranks()[size_t(dp->rank())], rank);
  for (int q = 0; q < tp->size(); ++q) EXPECT_EQ(tp->world_ranks()[size_t(q)], rank / tp_size * tp_size + q);
  for (int q = 0; q < dp->size(); ++q) EXPECT_EQ(dp->world_ranks()[size_t(q)], rank % tp_size + q * tp_size);

  check_all_reduce<float>(*tp, CommType::F32, ReduceOp::Sum, 4097);
  check_all_reduce<float>(*dp, CommType::F32, ReduceOp::Sum, 4097);
  check_all_reduce_bf16(*tp, ReduceOp::Max, 100);
  check_all_reduce<int64_t>(*dp, CommType::I64, ReduceOp::Min, 3);

  // all_gather on tp, reduce_scatter on dp (sequence parallel and ZeRO-1 shapes).
  const int64_t n = 129;
  DeviceArray<float> part(values<float>(rank, n)), whole(size_t(n * tp->size()));
  tp->all_gather(part.get(), whole.get(), n, CommType::F32);
  const auto w = whole.host();
  for (int q = 0; q < tp->size(); ++q)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[size_t(q * n + i)], float(val(tp->world_ranks()[size_t(q)], i)));
  DeviceArray<float> grads(values<float>(rank, n * dp->size())), shard(static_cast<size_t>(n));
  dp->reduce_scatter(grads.get(), shard.get(), n, CommType::F32, ReduceOp::Sum);
  const auto sh = shard.host();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(sh[size_t(i)], float(reduced(ReduceOp::Sum, dp->world_ranks(), dp->rank() * n + i))) << i;

  // Pipeline stages: the first half sends to the second half and back, on a "pp" group of two.
  if (size >= 2) {
    const int half = size / 2;
    auto pp = world->split(rank % half, rank / half, "pp");  // {r, r + half}
    ASSERT_NE(pp, nullptr);
    EXPECT_EQ(pp->size(), 2);
    const int peer = 1 - pp->rank();
    DeviceArray<float> act(values<float>(rank, 2048)), got(size_t{2048});
    std::vector<WorkPtr> ws;
    ws.push_back(pp->isend(act.get(), 2048, CommType::F32, peer));
    ws.push_back(pp->irecv(got.get(), 2048, CommType::F32, peer));
    wait_all(ws);
    EXPECT_EQ(got.host(), values<float>(pp->world_ranks()[size_t(peer)], 2048));
  }

  // new_group of the first and the last rank; the others get no group.
  auto ends = world->new_group({0, size - 1}, "ends");
  if (rank == 0 || rank == size - 1) {
    ASSERT_NE(ends, nullptr);
    EXPECT_EQ(ends->all_reduce_value(int32_t(rank)), size > 1 ? size - 1 : 0);
  } else {
    EXPECT_EQ(ends, nullptr);
  }
  world->barrier();
}

}  // namespace
}  // namespace primus::parallel
