// ProcessGroup over MPI on real ranks: run under `mpirun -np N` (N = 2 or 4). Every rank runs
// every case in the same order, so the collectives inside the cases line up. Expected values
// are computed from the rank numbers alone, so a wrong chunk, order or root shows up.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

#include <sched.h>

#include "core/error.h"
#include "parallel/mesh.h"
#include "parallel/mpi_process_group.h"

using namespace primus;
using namespace primus::parallel;

namespace {
MpiProcessGroup& world() { return mpi_world(); }
int64_t rank_sum(int n) { return int64_t{n} * (n - 1) / 2; }
}  // namespace

TEST(MpiInit, ThreadLevelAndWorld) {
  EXPECT_TRUE(mpi_initialized());
  EXPECT_GE(mpi_thread_level(), ThreadLevel::Funneled);
  auto env_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_NE(env_size, nullptr) << "run this binary under mpirun";
  EXPECT_EQ(world().size(), std::atoi(env_size));
  EXPECT_EQ(world().rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_EQ(world().name(), "world");
  init_mpi();  // a second call is a no-op
  EXPECT_EQ(&world(), &mpi_world());
}

// The wait mode PRIMUS_MPI_WAIT chose (ctest runs this binary under each mode: the cases below
// then check every collective both ways); auto sleeps when this node's ranks outnumber the cores.
TEST(MpiInit, WaitModeFollowsPrimusMpiWait) {
  const char* env = std::getenv("PRIMUS_MPI_WAIT");
  const std::string mode = env ? env : "auto";
  if (mode == "sleep" || mode == "spin") {
    EXPECT_EQ(mpi_waits_by_sleeping(), mode == "sleep");
    return;
  }
  cpu_set_t cores;
  CPU_ZERO(&cores);
  ASSERT_EQ(sched_getaffinity(0, sizeof cores, &cores), 0);
  EXPECT_EQ(mpi_waits_by_sleeping(), world().size() > CPU_COUNT(&cores))
      << "all ranks of this test run on one node";
}

TEST(MpiCollectives, AllReduceSumMaxMinEveryType) {
  const int r = world().rank(), n = world().size();
  const int64_t len = 5;
  std::vector<float> f(len);
  std::vector<double> d(len);
  std::vector<int64_t> i(len);
  for (int64_t k = 0; k < len; ++k) {
    f[k] = static_cast<float>(r * 10 + k);
    d[k] = 0.5 * r + k;
    i[k] = int64_t{r} * 1000000000000LL + k;  // beyond 32 bits
  }
  world().all_reduce(f);
  world().all_reduce(d);
  world().all_reduce(i);
  for (int64_t k = 0; k < len; ++k) {
    EXPECT_FLOAT_EQ(f[k], static_cast<float>(10 * rank_sum(n) + n * k));
    EXPECT_DOUBLE_EQ(d[k], 0.5 * rank_sum(n) + n * k);
    EXPECT_EQ(i[k], rank_sum(n) * 1000000000000LL + n * k);
  }
  EXPECT_EQ(world().all_reduce_value<int64_t>(r, ReduceOp::Max), n - 1);
  EXPECT_EQ(world().all_reduce_value<int64_t>(r + 3, ReduceOp::Min), 3);
  EXPECT_DOUBLE_EQ(world().all_reduce_value<double>(-r, ReduceOp::Min), -(n - 1));
  EXPECT_FLOAT_EQ(world().all_reduce_value<float>(r * 1.5f, ReduceOp::Max), (n - 1) * 1.5f);

  Tensor t = Tensor::empty({2, 3});
  for (int k = 0; k < 6; ++k) t.data<float>()[k] = static_cast<float>(r == 1 ? 100 + k : -k);
  world().all_reduce(t, ReduceOp::Max);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(t.data<float>()[k], 100 + k);
}

TEST(MpiCollectives, ReduceScatterChunks) {
  const int r = world().rank(), n = world().size();
  const int64_t chunk = 3;
  Tensor in = Tensor::empty({n * chunk}, DType::F64);
  for (int64_t j = 0; j < n * chunk; ++j) in.data<double>()[j] = r + 10.0 * j;
  Tensor out = Tensor::zeros({chunk}, DType::F64);
  world().reduce_scatter(in, out);
  // Rank r receives chunk r summed over ranks.
  for (int64_t k = 0; k < chunk; ++k)
    EXPECT_DOUBLE_EQ(out.data<double>()[k], rank_sum(n) + n * 10.0 * (r * chunk + k));

  // Non-blocking variant with max.
  Tensor out2 = Tensor::zeros({chunk}, DType::F64);
  auto w = world().ireduce_scatter(in, out2, ReduceOp::Max);
  w->wait();
  for (int64_t k = 0; k < chunk; ++k)
    EXPECT_DOUBLE_EQ(out2.data<double>()[k], (n - 1) + 10.0 * (r * chunk + k));
}

TEST(MpiCollectives, AllGatherRankOrder) {
  const int r = world().rank(), n = world().size();
  Tensor in = Tensor::empty({2});
  in.data<float>()[0] = 100.f * r;
  in.data<float>()[1] = 100.f * r + 1;
  Tensor out = Tensor::zeros({n, 2});
  world().all_gather(in, out);
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(out.data<float>()[2 * j], 100.f * j);
    EXPECT_EQ(out.data<float>()[2 * j + 1], 100.f * j + 1);
  }
  Tensor out2 = Tensor::zeros({2 * n});
  auto w = world().iall_gather(in, out2);
  w->wait();
  EXPECT_EQ(std::vector<float>(out.data<float>(), out.data<float>() + 2 * n),
            std::vector<float>(out2.data<float>(), out2.data<float>() + 2 * n));
}

TEST(MpiCollectives, BroadcastFromNonZeroRoot) {
  const int r = world().rank(), n = world().size();
  const int root = n - 1;
  Tensor t = Tensor::empty({4}, DType::F64);
  for (int k = 0; k < 4; ++k) t.data<double>()[k] = r == root ? 7.25 * (k + 1) : -1.0;
  world().broadcast(t, root);
  for (int k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(t.data<double>()[k], 7.25 * (k + 1));

  int64_t v = r == 1 ? 424242 : 0;
  world().broadcast(&v, 1, CommType::I64, 1);
  EXPECT_EQ(v, 424242);
}

TEST(MpiCollectives, AllToAll) {
  const int r = world().rank(), n = world().size();
  const int64_t c = 2;
  Tensor in = Tensor::empty({n * c});
  // Chunk j goes to rank j.
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < c; ++k) in.data<float>()[j * c + k] = 1000.f * r + 10.f * j + k;
  Tensor out = Tensor::zeros({n * c});
  world().all_to_all(in, out);
  // Chunk j came from rank j.
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < c; ++k) EXPECT_EQ(out.data<float>()[j * c + k], 1000.f * j + 10.f * r + k);
}

TEST(MpiCollectives, Barrier) {
  // Rank 0 arrives late: nobody may leave the barrier before it arrives.
  using clock = std::chrono::steady_clock;
  world().barrier();
  auto t0 = clock::now();
  if (world().rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  world().barrier();
  double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  EXPECT_GE(ms, 250.0);
}

TEST(MpiPointToPoint, IsendIrecvRing) {
  const int r = world().rank(), n = world().size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor send = Tensor::empty({8}, DType::F64);
  for (int k = 0; k < 8; ++k) send.data<double>()[k] = 100.0 * r + k;
  Tensor recv = Tensor::zeros({8}, DType::F64);
  // Post the receive first, as the pipeline executor will.
  auto rw = world().irecv(recv, prev, /*tag=*/7);
  auto sw = world().isend(send, next, /*tag=*/7);
  // test() polls until done; then wait() is a no-op.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!rw->test()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "ring receive never completed";
    std::this_thread::yield();
  }
  rw->wait();
  sw->wait();
  for (int k = 0; k < 8; ++k) EXPECT_DOUBLE_EQ(recv.data<double>()[k], 100.0 * prev + k);

  // Raw-pointer path with int64 and a batch of handles, tags keeping two messages apart.
  std::vector<int64_t> a(3, r), b(3, -r), ra(3), rb(3);
  std::vector<WorkPtr> works;
  works.push_back(world().irecv(rb.data(), 3, CommType::I64, prev, 2));
  works.push_back(world().irecv(ra.data(), 3, CommType::I64, prev, 1));
  works.push_back(world().isend(a.data(), 3, CommType::I64, next, 1));
  works.push_back(world().isend(b.data(), 3, CommType::I64, next, 2));
  wait_all(works);
  EXPECT_EQ(ra, std::vector<int64_t>(3, prev));
  EXPECT_EQ(rb, std::vector<int64_t>(3, -prev));
}

TEST(MpiPointToPoint, IallReduceOverlapsWork) {
  const int r = world().rank(), n = world().size();
  std::vector<double> g(1000, r + 1.0);
  auto w = world().iall_reduce(g.data(), 1000, CommType::F64, ReduceOp::Sum);
  double local = 0;  // "compute" while the reduction is in flight
  for (int k = 0; k < 1000; ++k) local += k;
  w->wait();
  EXPECT_EQ(local, 499500.0);
  for (double v : g) EXPECT_DOUBLE_EQ(v, rank_sum(n) + n);
}

// The progress thread (set_mpi_progress_interval): it runs MPI's progress while a non-blocking
// collective is in flight, whatever this thread does (here: sleeps, no MPI call), and not at all
// while none is; the result is the same. Interval 0 stops it.
TEST(MpiProgress, RunsWhileACollectiveIsInFlightAndSleepsOtherwise) {
  ASSERT_EQ(mpi_thread_level(), ThreadLevel::Multiple) << "OpenMPI grants MPI_THREAD_MULTIPLE";
  ASSERT_TRUE(set_mpi_progress_interval(50));
  const int r = world().rank(), n = world().size();
  const auto sleep = [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  const int64_t idle = mpi_progress_passes();
  sleep();
  EXPECT_LE(mpi_progress_passes(), idle + 1) << "passes while nothing was in flight";
  std::vector<float> g(1 << 20, float(r + 1));
  auto w = world().iall_reduce(g.data(), int64_t(g.size()), CommType::F32, ReduceOp::Sum);
  const int64_t before = mpi_progress_passes();
  sleep();
  EXPECT_GT(mpi_progress_passes(), before) << "no progress pass while the all-reduce was in flight";
  w->wait();
  for (size_t i = 0; i < g.size(); i += 4099) ASSERT_EQ(g[i], float(rank_sum(n) + n));
  world().barrier();
  EXPECT_FALSE(set_mpi_progress_interval(0));
  const int64_t stopped = mpi_progress_passes();
  auto w2 = world().iall_reduce(g.data(), 16, CommType::F32, ReduceOp::Sum);
  sleep();
  EXPECT_EQ(mpi_progress_passes(), stopped);
  w2->wait();
}

TEST(MpiGroups, NewGroupAndSplit) {
  const int r = world().rank(), n = world().size();
  // The even ranks, listed in reverse: group rank follows the list order.
  std::vector<int> evens;
  for (int k = n - 1; k >= 0; --k)
    if (k % 2 == 0) evens.push_back(k);
  auto g = world().new_group(evens, "evens");
  if (r % 2 != 0) {
    EXPECT_EQ(g, nullptr);
  } else {
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->size(), static_cast<int>(evens.size()));
    EXPECT_EQ(g->world_ranks(), evens);
    EXPECT_EQ(g->world_ranks()[static_cast<size_t>(g->rank())], r);
    int64_t s = g->all_reduce_value<int64_t>(r);
    EXPECT_EQ(s, std::accumulate(evens.begin(), evens.end(), int64_t{0}));
  }
  // split: color by parity, key reversed.
  auto h = world().split(r % 2, -r, "parity");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->world_ranks().front(), r % 2 == 0 ? evens.front() : (n % 2 == 0 ? n - 1 : n - 2));
  EXPECT_EQ(h->all_reduce_value<int64_t>(1), (n + 1 - r % 2) / 2);

  EXPECT_THROW(world().new_group({0, n}, "bad"), Error);
  EXPECT_THROW(world().new_group({0, 0}, "dup"), Error);
  EXPECT_THROW(world().new_group({}, "empty"), Error);
}

TEST(MpiGroups, MeshSubGroupCollectives) {
  const int r = world().rank(), n = world().size();
  ParallelSizes s;
  s.tensor_model_parallel_size = 2;  // n = 2: tp 2 x dp 1; n = 4: tp 2 x dp 2
  RankMesh mesh(n, s);
  MeshGroups groups = build_groups(mesh, world());
  for (MeshDim d : kAllMeshDims) {
    ProcessGroup& g = groups.get(d);
    auto members = mesh.group_ranks(d, r);
    EXPECT_EQ(g.name(), mesh_dim_name(d));
    EXPECT_EQ(g.world_ranks(), members) << g.describe();
    EXPECT_EQ(g.size(), mesh.size(d));
    // Sum and gather of the global ranks: the right members, in mesh order.
    EXPECT_EQ(g.all_reduce_value<int64_t>(r),
              std::accumulate(members.begin(), members.end(), int64_t{0}))
        << g.describe();
    std::vector<int64_t> all(members.size());
    int64_t mine = r;
    g.all_gather(&mine, all.data(), 1, CommType::I64);
    EXPECT_EQ(all, std::vector<int64_t>(members.begin(), members.end())) << g.describe();
  }
  if (n == 4) {
    // 2x2: tp groups {0,1},{2,3}; dp groups {0,2},{1,3}.
    const std::vector<int> tp = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    const std::vector<int> dp = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    EXPECT_EQ(groups.tp->world_ranks(), tp);
    EXPECT_EQ(groups.dp->world_ranks(), dp);
    EXPECT_EQ(groups.tp->rank(), r % 2);
    EXPECT_EQ(groups.dp->rank(), r / 2);
    // A reduce-scatter in the tp group, then an all-gather of the halves in the dp group: dp
    // member j (world rank 2j + tp rank) holds the half of tp group {2j, 2j+1}, sum 4j + 1.
    Tensor in = Tensor::empty({4});
    for (int k = 0; k < 4; ++k) in.data<float>()[k] = static_cast<float>(r * 10 + k);
    Tensor half = Tensor::empty({2});
    groups.tp->reduce_scatter(in, half);
    const int t0 = tp[0], t1 = tp[1];
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(half.data<float>()[k], (t0 + t1) * 10.f + 2 * (2 * groups.tp->rank() + k));
    Tensor both = Tensor::empty({4});
    groups.dp->all_gather(half, both);
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 2; ++k)
        EXPECT_EQ(both.data<float>()[2 * j + k], (4 * j + 1) * 10.f + 2 * (2 * (r % 2) + k))
            << "dp member " << j;
    // Broadcast inside each dp group from its second member.
    double v = groups.dp->rank() == 1 ? 1000.0 + r : 0.0;
    groups.dp->broadcast(&v, 1, CommType::F64, 1);
    EXPECT_EQ(v, 1000.0 + dp[1]);
  }
  // A layout that needs more ranks than the world has fails on every rank before any split.
  ParallelSizes big;
  big.tensor_model_parallel_size = 2 * n;
  RankMesh too_big(2 * n, big);
  EXPECT_THROW(build_groups(too_big, world()), Error);
}

TEST(MpiErrors, LocalMismatchesThrowBeforeCommunicating) {
  const int n = world().size();
  auto expect_error = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Tensor in = Tensor::zeros({n * 3});
  Tensor wrong = Tensor::zeros({4});
  expect_error([&] { world().reduce_scatter(in, wrong); }, "must be");
  expect_error([&] { world().all_gather(wrong, in); }, "world group (world ranks 0,");
  expect_error([&] { world().all_to_all(in, wrong); }, "all_to_all");
  Tensor odd = Tensor::zeros({n * 3 + 1});
  Tensor odd2 = Tensor::zeros({n * 3 + 1});
  expect_error([&] { world().all_to_all(odd, odd2); }, "equal chunks");
  Tensor d = Tensor::zeros({n * 3}, DType::F64);
  Tensor small = Tensor::zeros({3});
  expect_error([&] { world().all_gather(small, d); }, "input is fp32 but output is fp64");
  expect_error([&] { world().broadcast(in, n); }, "root " + std::to_string(n) + " is out of range");
  expect_error([&] { world().isend(in, -1); }, "destination rank -1 is out of range");
  expect_error([&] { world().irecv(in, n + 5); }, "source rank");
  Tensor m = Tensor::zeros({4, 4});
  Tensor col = m.slice(1, 0, 2);
  expect_error([&] { world().all_reduce(col); }, "not contiguous");
  Tensor h = Tensor::zeros({4}, DType::F16);
  expect_error([&] { world().all_reduce(h); }, "cannot reduce fp16");
  // The checks threw on every rank, so the world is still in step.
  EXPECT_EQ(world().all_reduce_value<int64_t>(1), n);
}

// bf16 reductions (tensor-parallel activations in bf16 mixed precision): fp32 arithmetic with one
// rounding per combination, as NCCL does.
TEST(MpiCollectives, ReducesBf16) {
  const int r = world().rank(), n = world().size();
  Tensor t = Tensor::empty({3}, DType::BF16);
  bf16* p = t.data<bf16>();
  p[0] = bf16::from_float(0.5f * float(r + 1));   // sums to n(n+1)/4: exact in bf16
  p[1] = bf16::from_float(float(r) - 1.0f);       // max r-1 over ranks
  p[2] = bf16::from_float(-float(r) * 0.25f);
  world().all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(p[0].to_float(), 0.25f * float(n * (n + 1)));
  Tensor m = Tensor::empty({1}, DType::BF16);
  m.data<bf16>()[0] = bf16::from_float(float(r) - 1.0f);
  world().all_reduce(m, ReduceOp::Max);
  EXPECT_EQ(m.data<bf16>()[0].to_float(), float(n) - 2.0f);
  world().all_reduce(m, ReduceOp::Min);
  EXPECT_EQ(m.data<bf16>()[0].to_float(), float(n) - 2.0f);
  // reduce-scatter: chunk i of every rank summed into rank i.
  Tensor in = Tensor::empty({n * 2}, DType::BF16), out = Tensor::empty({2}, DType::BF16);
  for (int i = 0; i < n * 2; ++i) in.data<bf16>()[i] = bf16::from_float(float(i + r));
  world().reduce_scatter(in, out);
  for (int j = 0; j < 2; ++j) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += float(r * 2 + j + q);
    EXPECT_EQ(out.data<bf16>()[j].to_float(), bf16::from_float(want).to_float());
  }
}

TEST(MpiErrors, MessageSizeMismatchIsAnErrorNotAHang) {
  const int r = world().rank(), n = world().size();
  // Rank 0 sends 8 then 2 elements to rank 1, which posts receives for 4 and 4: the first is
  // truncated (MPI error), the second is shorter than expected. Both are primus::Error.
  if (r == 0) {
    std::vector<float> big(8, 1.f), little(2, 2.f);
    auto a = world().isend(big.data(), 8, CommType::F32, 1, 11);
    auto b = world().isend(little.data(), 2, CommType::F32, 1, 12);
    a->wait();
    b->wait();
  } else if (r == 1) {
    std::vector<float> buf(4), buf2(4);
    auto a = world().irecv(buf.data(), 4, CommType::F32, 0, 11);
    auto b = world().irecv(buf2.data(), 4, CommType::F32, 0, 12);
    EXPECT_THROW(a->wait(), Error);
    try {
      b->wait();
      ADD_FAILURE() << "short message not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("received 2 elements but 4 were expected"),
                std::string::npos)
          << e.what();
    }
  }
  world().barrier();
  (void)n;
}

TEST(MpiErrors, UnmatchedReceiveIsCancelledOnDrop) {
  // A receive nobody sends to must not block the rank that drops it.
  const int n = world().size();
  {
    std::vector<double> buf(4);
    auto w = world().irecv(buf.data(), 4, CommType::F64, (world().rank() + 1) % n, 99);
    EXPECT_FALSE(w->test());
  }
  world().barrier();
}
