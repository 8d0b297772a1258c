// The emulated NCCL's own tests across ranks (mpirun, one emulated GPU per process): what a
// communicator of one rank cannot tell apart is told apart here. Every reduction op gives its own
// answer, counts are the real ones (a reduce-scatter given the total count reads past the send
// buffer and is refused), and ops issued on a communicator run in issue order across its
// streams. The DISABLED_ cases break NCCL's rules on purpose: CMake runs each alone and expects
// the emulation's report (a GPU would hang or corrupt memory).
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "gpu_test_util.h"
#include "parallel/mpi_process_group.h"

namespace primus::gputest {
namespace {

using parallel::CommType;
using parallel::mpi_world;

class EmulatedNcclRanks : public testing::Test {
 protected:
  void SetUp() override {
    PRIMUS_REQUIRE_GPU();
    rank = mpi_world().rank();
    size = mpi_world().size();
    ncclUniqueId id{};
    if (rank == 0) ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    mpi_world().broadcast(&id, int64_t(sizeof id), CommType::U8, 0);
    ASSERT_EQ(ncclCommInitRank(&comm, size, id, rank), ncclSuccess);
  }
  void TearDown() override {
    if (comm) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1;
};

TEST_F(EmulatedNcclRanks, EveryReductionOpGivesItsOwnAnswer) {
  ASSERT_GE(size, 2) << "run under mpirun -np 2 or more";
  // Rank r contributes r + 1: sum n(n+1)/2, average (n+1)/2, product n!, max n, min 1.
  double sum = 0, prod = 1;
  for (int r = 1; r <= size; ++r) sum += r, prod *= r;
  const std::vector<std::pair<ncclRedOp_t, float>> want = {
      {ncclSum, float(sum)}, {ncclAvg, float(sum / size)}, {ncclProd, float(prod)}, {ncclMax, float(size)},
      {ncclMin, 1.f}};
  for (const auto& [op, value] : want) {
    DeviceArray<float> a(std::vector<float>(1000, float(rank + 1))), b(size_t{1000});
    ASSERT_EQ(ncclAllReduce(a.get(), b.get(), 1000, ncclFloat32, op, comm, cuda::stream()), ncclSuccess);
    EXPECT_EQ(b.host(), std::vector<float>(1000, value)) << "op " << int(op);
  }
  EXPECT_NE(float(sum), float(sum / size)) << "Sum and Avg must differ for this check to mean anything";
}

TEST_F(EmulatedNcclRanks, ReduceScatterTakesTheCountPerRank) {
  const size_t n = 64;
  std::vector<int32_t> mine(n * size_t(size));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = int32_t(i) * (rank + 1);
  DeviceArray<int32_t> send(mine), recv(n);
  // The total count: the send buffer would need size * size * n elements.
  EXPECT_EQ(ncclReduceScatter(send.get(), recv.get(), n * size_t(size), ncclInt32, ncclSum, comm, cuda::stream()),
            ncclInvalidArgument);
  ASSERT_EQ(ncclReduceScatter(send.get(), recv.get(), n, ncclInt32, ncclSum, comm, cuda::stream()), ncclSuccess);
  const int32_t ranks_sum = size * (size + 1) / 2;
  const auto got = recv.host();
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], int32_t(rank * n + i) * ranks_sum) << i;
}

TEST_F(EmulatedNcclRanks, OpsOfACommunicatorRunInIssueOrderAcrossStreams) {
  // Two streams, one communicator: the all-gather issued second (on stream b) waits for the
  // all-reduce issued first (on stream a) on every rank, whatever order the executor picks.
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  DeviceArray<double> x(std::vector<double>(10, double(rank))), g(size_t(10 * size));
  ASSERT_EQ(ncclAllReduce(x.get(), x.get(), 10, ncclFloat64, ncclMax, comm, a), ncclSuccess);
  DeviceArray<double> y(std::vector<double>(10, double(-rank)));
  ASSERT_EQ(ncclAllGather(y.get(), g.get(), 10, ncclFloat64, comm, b), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_EQ(x.host(), std::vector<double>(10, double(size - 1)));
  const auto all = g.host();
  for (int q = 0; q < size; ++q)
    for (int i = 0; i < 10; ++i) EXPECT_EQ(all[size_t(q * 10 + i)], double(-q));
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// ---- run alone by CMake, which expects the report in the output ----

TEST_F(EmulatedNcclRanks, DISABLED_RanksDisagreeingOnACountAreReported) {
  DeviceArray<float> a(size_t{100});
  const size_t count = rank == 0 ? 100 : 99;
  ASSERT_EQ(ncclAllReduce(a.get(), a.get(), count, ncclFloat32, ncclSum, comm, cuda::stream()), ncclSuccess);
  cuda::synchronize();
}

TEST_F(EmulatedNcclRanks, DISABLED_ASendMeetingAReceiveOfAnotherCountIsReported) {
  DeviceArray<float> a(size_t{100});
  const int peer = (rank + 1) % size, from = (rank + size - 1) % size;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(a.get(), 100, ncclFloat32, peer, comm, cuda::stream()), ncclSuccess);
  ASSERT_EQ(ncclRecv(a.get(), 50, ncclFloat32, from, comm, cuda::stream()), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  cuda::synchronize();
}

}  // namespace
}  // namespace primus::gputest
