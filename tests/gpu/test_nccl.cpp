// The NCCL process group on one GPU: a world of one rank, bootstrapped without MPI through a
// SelfProcessGroup. Every collective and the point-to-point path (to self) run for real on the
// device; across ranks: mpi/test_nccl_ranks.cpp.
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "gpu_test_util.h"
#include "parallel/nccl_process_group.h"
#include "parallel/self_process_group.h"

namespace primus::parallel {
namespace {

using namespace primus::gputest;

std::unique_ptr<NcclProcessGroup> make_world() {
  SelfProcessGroup boot("world");
  return NcclProcessGroup::create(boot, "world");
}

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(NcclProcessGroup, CreatesAWorldOfOne) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->backend(), "nccl");
  EXPECT_EQ(g->device(), Device::CUDA);
  EXPECT_EQ(g->world_ranks(), (std::vector<int>{0}));
  EXPECT_EQ(g->describe(), "world group (world ranks 0)");
  EXPECT_NE(g->comm_stream(), nullptr);
}

TEST(NcclProcessGroup, CollectivesOnDeviceBuffers) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  const auto x = iota_floats(1000, -3.f);

  DeviceArray<float> a(x);
  g->all_reduce(a.get(), 1000, CommType::F32, ReduceOp::Sum);
  EXPECT_EQ(a.host(), x);
  g->all_reduce(a.get(), 1000, CommType::F32, ReduceOp::Max);
  g->all_reduce(a.get(), 1000, CommType::F32, ReduceOp::Min);
  EXPECT_EQ(a.host(), x);

  DeviceArray<uint16_t> h(to_bf16_bits(x));  // bf16 reduces on NCCL
  g->all_reduce(h.get(), 1000, CommType::BF16, ReduceOp::Sum);
  EXPECT_EQ(h.host(), to_bf16_bits(x));

  DeviceArray<float> rs(size_t{1000});
  g->reduce_scatter(a.get(), rs.get(), 1000, CommType::F32, ReduceOp::Sum);
  EXPECT_EQ(rs.host(), x);

  DeviceArray<float> ag(size_t{1000});
  g->all_gather(a.get(), ag.get(), 1000, CommType::F32);
  EXPECT_EQ(ag.host(), x);

  DeviceArray<float> bc(x);
  g->broadcast(bc.get(), 1000, CommType::F32, 0);
  EXPECT_EQ(bc.host(), x);

  DeviceArray<float> at(size_t{1000});
  g->all_to_all(a.get(), at.get(), 1000, CommType::F32);
  EXPECT_EQ(at.host(), x);

  std::vector<int64_t> xi(17);
  std::iota(xi.begin(), xi.end(), int64_t(1) << 40);
  DeviceArray<int64_t> ai(xi);
  g->all_reduce(ai.get(), 17, CommType::I64, ReduceOp::Sum);
  EXPECT_EQ(ai.host(), xi);

  g->barrier();
}

TEST(NcclProcessGroup, OrderedAfterComputeStreamWork) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  // Queued on the compute stream just before: the collective must see the new values, and the
  // copy queued after wait() must see the collective's result.
  DeviceArray<float> a(size_t(1 << 20));
  std::vector<float> ones(size_t(1) << 20, 1.f);
  PRIMUS_CUDA_CHECK(
      cudaMemcpyAsync(a.get(), ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice, cuda::stream()));
  auto w = g->iall_reduce(a.get(), int64_t(ones.size()), CommType::F32, ReduceOp::Sum);
  w->wait();
  EXPECT_EQ(a.host(), ones);
  // test() polls until the op is done.
  auto w2 = g->iall_reduce(a.get(), int64_t(ones.size()), CommType::F32, ReduceOp::Max);
  while (!w2->test()) {
  }
  w2->wait();
  EXPECT_EQ(a.host(), ones);
}

TEST(NcclProcessGroup, TensorOverloads) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  const auto x = iota_floats(64, 0.f);
  Tensor host = Tensor::empty({8, 8});
  std::memcpy(host.data<float>(), x.data(), x.size() * sizeof(float));
  Tensor t = host.to(Device::CUDA);
  g->all_reduce(t);
  Tensor out = Tensor::empty({8, 8}, DType::F32, Device::CUDA);
  auto w = g->iall_gather(t, out);
  w->wait();
  Tensor back = out.to(Device::CPU);
  EXPECT_EQ(std::vector<float>(back.data<float>(), back.data<float>() + 64), x);
  // A CPU tensor is refused by the base class's check.
  EXPECT_THROW(g->all_reduce(host), Error);
}

TEST(NcclProcessGroup, SendAndReceiveToSelf) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  const auto x = iota_floats(333, 5.f);
  const auto y = iota_floats(77, -100.f);
  DeviceArray<float> s1(x), s2(y), r1(x.size()), r2(y.size());
  // Two messages to the same peer: matched in posting order (tags are ignored by NCCL).
  auto a = g->isend(s1.get(), int64_t(x.size()), CommType::F32, 0, 7);
  auto b = g->isend(s2.get(), int64_t(y.size()), CommType::F32, 0, 8);
  auto c = g->irecv(r1.get(), int64_t(x.size()), CommType::F32, 0, 7);
  auto d = g->irecv(r2.get(), int64_t(y.size()), CommType::F32, 0, 8);
  std::vector<WorkPtr> works;
  works.push_back(std::move(a));
  works.push_back(std::move(b));
  works.push_back(std::move(c));
  works.push_back(std::move(d));
  wait_all(works);
  EXPECT_EQ(r1.host(), x);
  EXPECT_EQ(r2.host(), y);

  // A queued pair goes out when another op comes: here a collective, then test().
  DeviceArray<float> r3(x.size());
  auto e = g->isend(s1.get(), int64_t(x.size()), CommType::F32, 0);
  auto f = g->irecv(r3.get(), int64_t(x.size()), CommType::F32, 0);
  DeviceArray<float> other(x);
  g->all_reduce(other.get(), int64_t(x.size()), CommType::F32, ReduceOp::Sum);
  while (!f->test()) {
  }
  e->wait();
  f->wait();
  EXPECT_EQ(r3.host(), x);

  // Dropped without wait(): completed in stream order by the destructor.
  DeviceArray<float> r4(x.size());
  {
    auto s = g->isend(s1.get(), int64_t(x.size()), CommType::F32, 0);
    auto r = g->irecv(r4.get(), int64_t(x.size()), CommType::F32, 0);
  }
  EXPECT_EQ(r4.host(), x);

  EXPECT_THROW(g->isend(s1.get(), 1, CommType::F32, 1), Error);   // no rank 1
  EXPECT_THROW(g->irecv(r1.get(), 1, CommType::F32, 0, -1), Error);  // negative tag
}

TEST(NcclProcessGroup, HostValueHelpersWork) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  EXPECT_EQ(g->all_reduce_value(3.5), 3.5);
  EXPECT_EQ(g->all_reduce_value(int64_t(42), ReduceOp::Max), 42);
  std::vector<float> v = {1.f, -2.f, 3.f};
  g->all_reduce(v);
  EXPECT_EQ(v, (std::vector<float>{1.f, -2.f, 3.f}));
  std::vector<int32_t> counts = {7, 8};
  g->all_reduce(counts, ReduceOp::Min);
  EXPECT_EQ(counts, (std::vector<int32_t>{7, 8}));
  // Too large a host buffer is refused rather than silently staged.
  std::vector<float> big(NcclProcessGroup::kMaxHostStagingBytes / sizeof(float) + 1, 1.f);
  EXPECT_THROW(g->all_reduce(big), Error);
}

TEST(NcclProcessGroup, HostPointerIsRefusedWithAClearError) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  std::vector<float> host(16, 1.f);
  DeviceArray<float> dev(size_t{16});
  auto expect_refused = [&](auto&& fn, const char* op) {
    try {
      fn();
      ADD_FAILURE() << op << " accepted a host pointer";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(op), std::string::npos) << msg;
      EXPECT_NE(msg.find("host memory"), std::string::npos) << msg;
      EXPECT_NE(msg.find("world group"), std::string::npos) << msg;
    }
  };
  expect_refused([&] { g->broadcast(host.data(), 16, CommType::F32, 0); }, "broadcast");
  expect_refused([&] { g->all_gather(host.data(), dev.get(), 16, CommType::F32); }, "all_gather");
  expect_refused([&] { g->all_gather(dev.get(), host.data(), 16, CommType::F32); }, "all_gather");
  expect_refused([&] { g->reduce_scatter(host.data(), dev.get(), 16, CommType::F32, ReduceOp::Sum); },
                 "reduce_scatter");
  expect_refused([&] { g->all_to_all(dev.get(), host.data(), 16, CommType::F32); }, "all_to_all");
  expect_refused([&] { g->iall_reduce(host.data(), 16, CommType::F32, ReduceOp::Sum); }, "iall_reduce");
  expect_refused([&] { g->isend(host.data(), 16, CommType::F32, 0); }, "isend");
  expect_refused([&] { g->irecv(host.data(), 16, CommType::F32, 0); }, "irecv");
  EXPECT_THROW(g->broadcast(dev.get(), 16, CommType::F32, 1), Error);  // root out of range
}

TEST(NcclProcessGroup, SplitAndNewGroup) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  EXPECT_EQ(g->split(-1, 0, "none"), nullptr);
  auto s = g->split(3, 0, "tp");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->size(), 1);
  EXPECT_EQ(s->rank(), 0);
  EXPECT_EQ(s->name(), "tp");
  EXPECT_EQ(s->backend(), "nccl");
  EXPECT_EQ(s->world_ranks(), (std::vector<int>{0}));
  const auto x = iota_floats(100, 1.f);
  DeviceArray<float> a(x);
  s->all_reduce(a.get(), 100, CommType::F32, ReduceOp::Sum);
  EXPECT_EQ(a.host(), x);
  EXPECT_EQ(s->all_reduce_value(2.0f), 2.0f);

  auto n = g->new_group({0}, "dp");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->describe(), "dp group (world ranks 0)");
  n->barrier();
  EXPECT_THROW(g->new_group({}, "empty"), Error);
  EXPECT_THROW(g->new_group({1}, "bad"), Error);
}

TEST(NcclProcessGroup, WorkOutlivesItsGroup) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  const auto x = iota_floats(256, 0.f);
  DeviceArray<float> a(x);
  auto w = g->iall_reduce(a.get(), 256, CommType::F32, ReduceOp::Sum);
  g.reset();  // the communicator stays until the Work is gone
  w->wait();  // (the compute stream waits; the host does not)
  cuda::synchronize();
  EXPECT_TRUE(w->test());
  w.reset();
  EXPECT_EQ(a.host(), x);
}

TEST(NcclProcessGroup, CreateNeedsACpuBootstrap) {
  PRIMUS_REQUIRE_GPU();
  auto g = make_world();
  EXPECT_THROW(NcclProcessGroup::create(*g, "nested"), Error);
}

}  // namespace
}  // namespace primus::parallel
