// The pipeline executor on real ranks: run under `mpirun -np N` (N = 2 or 4). Every rank runs every
// case in the same order. A toy model in double precision (stage s: y = tanh(x W_s) on a [4, 8]
// message; the first stage makes its input from the microbatch index; the last stage's loss is
// sum(y^2)/2) runs under every schedule of the registry, and the weight gradients and losses,
// gathered from all ranks, must equal a one-process sequential run to 1e-12 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/mpi_process_group.h"
#include "pipeline/executor.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/validator.h"

using namespace primus;
using namespace primus::pipeline;
using parallel::ProcessGroup;

namespace {

constexpr int kRows = 4, kHidden = 8, kW = kHidden * kHidden;

parallel::MpiProcessGroup& world() { return parallel::mpi_world(); }

// ---- the toy model: deterministic weights and inputs, explicit passes ----
double weight(int stage, int j, int k) {
  return 0.35 * std::sin(1.0 + 0.7 * stage + 0.13 * j + 0.29 * k * (j + 1));
}
double input_value(int mb, int r, int j) { return std::sin(0.5 + 0.31 * mb + 0.17 * r - 0.23 * j); }

// y[r][k] = tanh(sum_j x[r][j] W[j][k])
void stage_forward(int stage, const double* x, double* y) {
  for (int r = 0; r < kRows; ++r)
    for (int k = 0; k < kHidden; ++k) {
      double z = 0;
      for (int j = 0; j < kHidden; ++j) z += x[r * kHidden + j] * weight(stage, j, k);
      y[r * kHidden + k] = std::tanh(z);
    }
}
// dz = dy * (1 - y^2); dx = dz W^T (when dx is given)
void stage_backward_input(int stage, const double* y, const double* dy, double* dz, double* dx) {
  for (int i = 0; i < kRows * kHidden; ++i) dz[i] = dy[i] * (1 - y[i] * y[i]);
  if (!dx) return;
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < kHidden; ++j) {
      double s = 0;
      for (int k = 0; k < kHidden; ++k) s += dz[r * kHidden + k] * weight(stage, j, k);
      dx[r * kHidden + j] = s;
    }
}
// dW += x^T dz
void stage_backward_weight(const double* x, const double* dz, double* dw) {
  for (int j = 0; j < kHidden; ++j)
    for (int k = 0; k < kHidden; ++k) {
      double s = 0;
      for (int r = 0; r < kRows; ++r) s += x[r * kHidden + j] * dz[r * kHidden + k];
      dw[j * kHidden + k] += s;
    }
}
double half_sum_squares(const double* y) {
  double s = 0;
  for (int i = 0; i < kRows * kHidden; ++i) s += y[i] * y[i];
  return s / 2;
}

struct Result {
  std::vector<double> grads;   // [stage][kW]
  std::vector<double> losses;  // [microbatch]
};

// One process, one stage after the other, microbatch by microbatch.
Result sequential(int stages, int microbatches) {
  Result res{std::vector<double>(stages * kW, 0.0), std::vector<double>(microbatches, 0.0)};
  const int n = kRows * kHidden;
  for (int mb = 0; mb < microbatches; ++mb) {
    std::vector<std::vector<double>> xs(stages + 1, std::vector<double>(n));
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kHidden; ++j) xs[0][r * kHidden + j] = input_value(mb, r, j);
    for (int s = 0; s < stages; ++s) stage_forward(s, xs[s].data(), xs[s + 1].data());
    res.losses[mb] = half_sum_squares(xs[stages].data());
    std::vector<double> dy = xs[stages], dz(n), dx(n);
    for (int s = stages - 1; s >= 0; --s) {
      stage_backward_input(s, xs[s + 1].data(), dy.data(), dz.data(), dx.data());
      stage_backward_weight(xs[s].data(), dz.data(), &res.grads[s * kW]);
      dy = dx;
    }
  }
  return res;
}

// The model side of one rank: the chunks `schedule` places on `rank`. It also checks the order
// the executor calls it in (F before B before W, once each, inputs present exactly when needed).
class ToyRunner : public StageRunner {
 public:
  ToyRunner(const Schedule& s, int rank) : s_(s), rank_(rank), grads_(s.num_stages() * kW, 0.0) {}

  Shape message_shape() const override { return {kRows, kHidden}; }
  DType message_dtype() const override { return DType::F64; }

  Tensor forward(int mb, int chunk, const Tensor& input) override {
    const int st = s_.stage_of(rank_, chunk);
    Ctx& c = ctx_[{mb, chunk}];
    EXPECT_FALSE(c.x.defined()) << "F twice for microbatch " << mb << " stage " << st;
    if (st == 0) {
      EXPECT_FALSE(input.defined()) << "first stage got an input";
      c.x = Tensor::empty({kRows, kHidden}, DType::F64);
      for (int r = 0; r < kRows; ++r)
        for (int j = 0; j < kHidden; ++j) c.x.data<double>()[r * kHidden + j] = input_value(mb, r, j);
    } else {
      if (!input.defined() || input.shape() != Shape{kRows, kHidden}) {
        ADD_FAILURE() << "stage " << st << " got no or a wrong-shaped input";
        throw Error("bad input");
      }
      c.x = input;
    }
    c.y = Tensor::empty({kRows, kHidden}, DType::F64);
    stage_forward(st, c.x.data<double>(), c.y.data<double>());
    if (st == s_.num_stages() - 1) {
      losses_[mb] = half_sum_squares(c.y.data<double>());
      return Tensor();
    }
    return c.y;
  }

  Tensor backward_input(int mb, int chunk, const Tensor& grad) override {
    const int st = s_.stage_of(rank_, chunk);
    auto it = ctx_.find({mb, chunk});
    if (it == ctx_.end() || !it->second.y.defined() || it->second.dz.defined()) {
      ADD_FAILURE() << "B of microbatch " << mb << " stage " << st << " out of order";
      throw Error("bad order");
    }
    Ctx& c = it->second;
    const bool last = st == s_.num_stages() - 1;
    EXPECT_EQ(grad.defined(), !last) << "stage " << st;
    const double* dy = last ? c.y.data<double>() : grad.data<double>();  // d(sum y^2 / 2)/dy = y
    c.dz = Tensor::empty({kRows, kHidden}, DType::F64);
    Tensor dx;
    if (st > 0) dx = Tensor::empty({kRows, kHidden}, DType::F64);
    stage_backward_input(st, c.y.data<double>(), dy, c.dz.data<double>(),
                         st > 0 ? dx.data<double>() : nullptr);
    return dx;
  }

  void backward_weight(int mb, int chunk) override {
    const int st = s_.stage_of(rank_, chunk);
    auto it = ctx_.find({mb, chunk});
    if (it == ctx_.end() || !it->second.dz.defined()) {
      ADD_FAILURE() << "W of microbatch " << mb << " stage " << st << " before its B";
      throw Error("bad order");
    }
    stage_backward_weight(it->second.x.data<double>(), it->second.dz.data<double>(),
                          &grads_[st * kW]);
    ctx_.erase(it);
  }

  // The default F&B (one pass after the other), counted: the executor must hand every
  // overlapped pair of the schedule to it.
  Overlapped overlapped_forward_backward(int f_mb, int f_chunk, const Tensor& input, int b_mb, int b_chunk,
                                         const Tensor& grad, bool with_weight) override {
    ++overlapped_;
    EXPECT_NE(f_chunk, b_chunk) << "a pair overlaps two chunks";
    return StageRunner::overlapped_forward_backward(f_mb, f_chunk, input, b_mb, b_chunk, grad, with_weight);
  }
  int overlapped() const { return overlapped_; }

  size_t live_contexts() const { return ctx_.size(); }
  const std::vector<double>& grads() const { return grads_; }
  const std::map<int, double>& losses() const { return losses_; }

 private:
  struct Ctx {
    Tensor x, y, dz;
  };
  const Schedule& s_;
  int rank_;
  std::map<std::pair<int, int>, Ctx> ctx_;
  std::vector<double> grads_;
  std::map<int, double> losses_;
  int overlapped_ = 0;
};

double max_abs(const double* v, int n) {
  double m = 0;
  for (int i = 0; i < n; ++i) m = std::max(m, std::abs(v[i]));
  return m;
}

// Runs `s` on group `g` and compares what all ranks computed with the sequential run.
ExecutorStats run_and_compare(const Schedule& s, ProcessGroup& g, ExecutorOptions opt = {}) {
  SCOPED_TRACE(s.algorithm + " pp " + std::to_string(s.pp) + " vpp " + std::to_string(s.vpp));
  const int S = s.num_stages(), m = s.microbatches, me = g.rank();
  ToyRunner runner(s, me);
  opt.record_timeline = true;
  ExecutorStats stats = run_schedule(s, runner, g, opt);
  EXPECT_EQ(runner.live_contexts(), 0u) << "a microbatch's W never ran";

  // Gather: each stage's gradient comes from the one rank that holds it; each loss from the rank
  // with the last stage.
  std::vector<double> grads = runner.grads(), losses(m, 0.0);
  std::vector<int64_t> owners(S, 0), loss_count(m, 0);
  for (int c = 0; c < s.vpp; ++c) owners[s.stage_of(me, c)] = 1;
  for (auto& [mb, l] : runner.losses()) losses[mb] = l, loss_count[mb] = 1;
  g.all_reduce(grads);
  g.all_reduce(losses);
  g.all_reduce(owners);
  g.all_reduce(loss_count);

  const Result ref = sequential(S, m);
  for (int st = 0; st < S; ++st) {
    EXPECT_EQ(owners[st], 1) << "stage " << st;
    const double scale = max_abs(&ref.grads[st * kW], kW);
    EXPECT_GT(scale, 1e-6) << "stage " << st << " has no gradient to compare";
    int bad = 0;  // report the first few mismatches, not all 64
    for (int i = 0; i < kW && bad < 3; ++i)
      if (std::abs(grads[st * kW + i] - ref.grads[st * kW + i]) > 1e-12 * scale) {
        ++bad;
        ADD_FAILURE() << "stage " << st << " weight " << i << ": " << grads[st * kW + i]
                      << " vs one-process " << ref.grads[st * kW + i];
      }
  }
  for (int mb = 0; mb < m; ++mb) {
    EXPECT_EQ(loss_count[mb], 1) << "microbatch " << mb;
    EXPECT_NEAR(losses[mb], ref.losses[mb], 1e-12 * std::abs(ref.losses[mb])) << "mb " << mb;
  }

  // The stats add up to what this rank's op list says.
  const auto& ops = s.ranks[me];
  int64_t recvs = 0, sends = 0;
  for (const Op& op : ops) recvs += op.recv.has_value(), sends += op.send.has_value();
  EXPECT_EQ(stats.ops, static_cast<int64_t>(ops.size()));
  EXPECT_EQ(stats.messages_received, recvs);
  EXPECT_EQ(stats.messages_sent, sends);
  EXPECT_GT(stats.compute_s, 0.0);
  EXPECT_GE(stats.wall_s, stats.compute_s);
  EXPECT_NEAR(stats.wait_s, stats.wall_s - stats.compute_s, 1e-12);
  EXPECT_LE(stats.recv_wait_s, stats.wait_s + 1e-9);
  EXPECT_GT(stats.mean_f_s, 0.0);
  EXPECT_GT(stats.mean_b_s, 0.0);
  EXPECT_GT(stats.mean_w_s, 0.0);
  EXPECT_EQ(stats.timeline.size(), ops.size());
  int64_t pairs = 0;
  for (size_t i = 0; i < stats.timeline.size(); ++i) {
    const OpRecord& r = stats.timeline[i];
    EXPECT_EQ(r.type, ops[i].type);
    EXPECT_EQ(r.microbatch, ops[i].microbatch);
    EXPECT_LE(r.start_s, r.compute_start_s);
    EXPECT_LE(r.compute_start_s, r.end_s);
    if (i > 0 && ops[i - 1].overlap_next) {  // the second op of a pair: the pair's interval
      ++pairs;
      EXPECT_EQ(stats.timeline[i - 1].compute_start_s, r.compute_start_s);
      EXPECT_EQ(stats.timeline[i - 1].end_s, r.end_s);
    } else if (i > 0) {
      EXPECT_LE(stats.timeline[i - 1].end_s, r.start_s);
    }
  }
  EXPECT_EQ(stats.pairs, pairs);
  EXPECT_EQ(runner.overlapped(), pairs);
  if (s.algorithm == "dualpipev") EXPECT_GT(pairs, 0) << "DualPipeV runs overlapped F&B pairs";
  EXPECT_EQ(stats.mean_pair_s > 0, pairs > 0);
  return stats;
}

Schedule make(const std::string& algorithm, int pp, int m = 8) {
  ScheduleRequest req;
  req.pp = pp;
  req.microbatches = m;
  return generate(algorithm, req);
}

// Each rank alone in a group: for local-only runs and errors only one rank can see.
std::unique_ptr<ProcessGroup> self_group() { return world().split(world().rank(), 0, "self"); }
// Pairs of ranks (0,1), (2,3), ...
std::unique_ptr<ProcessGroup> pair_group() { return world().split(world().rank() / 2, 0, "pp-pair"); }

// A hand-made pp = 1 schedule with two chunks: every hop between stages is a local hand-over.
Schedule local_two_chunks(Placement placement, int m) {
  Schedule s = make_empty("local-test", 1, 2, m, placement);
  auto add = [&](OpType t, int chunk) {
    for (int mb = 0; mb < m; ++mb) {
      Op op;
      op.type = t, op.microbatch = mb, op.chunk = chunk;
      s.ranks[0].push_back(op);
    }
  };
  add(OpType::F, 0);
  add(OpType::F, 1);
  add(OpType::B, 1);
  add(OpType::BW, 0);
  add(OpType::W, 1);
  attach_p2p(s);
  return s;
}

}  // namespace

// Every algorithm of the registry over all ranks (pp 2 under -np 2, pp 4 under -np 4).
TEST(PipelineExecutor, EveryScheduleMatchesOneProcess) {
  const int pp = world().size();
  for (const std::string& name : algorithm_names()) {
    Schedule s = make(name, pp);
    run_and_compare(s, world());
  }
}

// Rank 0 runs microbatch 1 before 0, rank 1 the other way round: receives posted early must
// still match by tag (microbatch, stage, direction), not by arrival order.
TEST(PipelineExecutor, MicrobatchesInDifferentOrderPerRank) {
  auto g = pair_group();
  if (g->size() < 2) GTEST_SKIP() << "odd rank out";
  Schedule s = make_empty("crossed", 2, 1, 2, Placement::Looped);
  auto add = [&](int rank, OpType t, int mb) {
    Op op;
    op.type = t, op.microbatch = mb;
    s.ranks[rank].push_back(op);
  };
  add(0, OpType::F, 1), add(0, OpType::F, 0), add(0, OpType::BW, 0), add(0, OpType::BW, 1);
  add(1, OpType::F, 0), add(1, OpType::BW, 0), add(1, OpType::F, 1), add(1, OpType::BW, 1);
  attach_p2p(s);
  validate(s);
  ExecutorOptions opt;
  opt.recv_ahead = 2;
  run_and_compare(s, *g, opt);
}

// Under -np 4 also two independent pp-2 pipelines side by side (their tags must not mix).
TEST(PipelineExecutor, TwoPipelinesSideBySide) {
  if (world().size() < 4) GTEST_SKIP() << "needs 4 ranks";
  auto g = pair_group();
  for (const char* name : {"1f1b", "interleaved-1f1b", "zbv", "dualpipev"}) run_and_compare(make(name, 2), *g);
}

// The receive window does not change the result: one posted receive at a time, or all at once.
TEST(PipelineExecutor, ReceiveWindowSizes) {
  const int pp = world().size();
  for (int ahead : {1, 2, 1000}) {
    ExecutorOptions opt;
    opt.recv_ahead = ahead;
    run_and_compare(make("zb-h2", pp), world(), opt);
    run_and_compare(make("zbv", pp), world(), opt);
  }
}

// pp = 1 with two chunks (looped and V): no transfers, every activation and gradient handed over
// in memory.
TEST(PipelineExecutor, LocalHandOverOnOneRank) {
  auto g = self_group();
  for (Placement p : {Placement::Looped, Placement::VShape}) {
    Schedule s = local_two_chunks(p, 3);
    ExecutorStats st = run_and_compare(s, *g);
    EXPECT_EQ(st.messages_sent + st.messages_received, 0);
  }
  // Registry schedules on one rank, where they allow it.
  run_and_compare(make("1f1b", 1, 4), *g);
  run_and_compare(make("gpipe", 1, 4), *g);
}

TEST(PipelineExecutorErrors, ScheduleForAnotherPipelineSize) {
  Schedule s = make("1f1b", world().size() + 1);
  ToyRunner runner(s, 0);
  try {
    run_schedule(s, runner, world());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline_model_parallel_size " + std::to_string(s.pp)),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(world().size()) + " ranks"),
              std::string::npos)
        << e.what();
  }
}

TEST(PipelineExecutorErrors, TagsBeyondMpiLimit) {
  // 2 * 9000 microbatches * pp stages exceeds 32767 for any pp >= 2.
  Schedule s = make_empty("gpipe", world().size(), 1, 9000, Placement::Looped);
  ToyRunner runner(s, world().rank());
  try {
    run_schedule(s, runner, world());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("32767"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("9000 microbatches"), std::string::npos) << e.what();
  }
}

TEST(PipelineExecutorErrors, RanksDisagreeOnMessageShape) {
  struct Wider : ToyRunner {
    using ToyRunner::ToyRunner;
    Shape message_shape() const override { return {kRows, kHidden + 1}; }
  };
  Schedule s = make("1f1b", world().size());
  ToyRunner plain(s, world().rank());
  Wider wider(s, world().rank());
  StageRunner& r = world().rank() == 1 ? static_cast<StageRunner&>(wider) : plain;
  try {
    run_schedule(s, r, world());
    FAIL() << "expected an error";
  } catch (const Error& e) {  // every rank, before any transfer
    const std::string what = e.what();
    EXPECT_NE(what.find("disagree on the message"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 sends [4, 9] fp64"), std::string::npos) << what;
  }
  // The group is still usable afterwards.
  run_and_compare(s, world());
}

TEST(PipelineExecutorErrors, RanksGivenDifferentSchedules) {
  Schedule s = make("1f1b", world().size(), world().rank() == 0 ? 8 : 6);
  ToyRunner runner(s, world().rank());
  try {
    run_schedule(s, runner, world());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different schedules"), std::string::npos) << e.what();
  }
}

TEST(PipelineExecutorErrors, RunnerReturnsWrongShape) {
  struct Bad : ToyRunner {
    using ToyRunner::ToyRunner;
    Tensor forward(int mb, int chunk, const Tensor& in) override {
      ToyRunner::forward(mb, chunk, in);
      return Tensor::zeros({kRows, kHidden + 1}, DType::F64);
    }
  };
  auto g = self_group();
  Schedule s = local_two_chunks(Placement::Looped, 1);
  Bad runner(s, 0);
  try {
    run_schedule(s, runner, *g);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("returned [4, 9] fp64, but messages between stages are "
                                         "[4, 8] fp64"),
              std::string::npos)
        << e.what();
  }
  ExecutorOptions opt;
  opt.recv_ahead = 0;
  EXPECT_THROW(run_schedule(s, runner, *g, opt), Error);
}

// A group that drops the last element of everything it sends: the receiver must fail with a
// clear error instead of using a short message.
class ShortSends final : public ProcessGroup {
 public:
  explicit ShortSends(ProcessGroup& inner) : in_(inner) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  const std::string& name() const override { return in_.name(); }
  std::string backend() const override { return in_.backend(); }
  Device device() const override { return in_.device(); }
  const std::vector<int>& world_ranks() const override { return in_.world_ranks(); }
  using ProcessGroup::all_gather;
  using ProcessGroup::all_reduce;
  using ProcessGroup::all_to_all;
  using ProcessGroup::broadcast;
  using ProcessGroup::iall_gather;
  using ProcessGroup::iall_reduce;
  using ProcessGroup::ireduce_scatter;
  using ProcessGroup::irecv;
  using ProcessGroup::isend;
  using ProcessGroup::reduce_scatter;
  void all_reduce(void* b, int64_t n, parallel::CommType t, parallel::ReduceOp op) override {
    in_.all_reduce(b, n, t, op);
  }
  void reduce_scatter(const void* s, void* r, int64_t n, parallel::CommType t,
                      parallel::ReduceOp op) override {
    in_.reduce_scatter(s, r, n, t, op);
  }
  void all_gather(const void* s, void* r, int64_t n, parallel::CommType t) override {
    in_.all_gather(s, r, n, t);
  }
  void broadcast(void* b, int64_t n, parallel::CommType t, int root) override {
    in_.broadcast(b, n, t, root);
  }
  void all_to_all(const void* s, void* r, int64_t n, parallel::CommType t) override {
    in_.all_to_all(s, r, n, t);
  }
  void barrier() override { in_.barrier(); }
  parallel::WorkPtr iall_reduce(void* b, int64_t n, parallel::CommType t,
                                parallel::ReduceOp op) override {
    return in_.iall_reduce(b, n, t, op);
  }
  parallel::WorkPtr ireduce_scatter(const void* s, void* r, int64_t n, parallel::CommType t,
                                    parallel::ReduceOp op) override {
    return in_.ireduce_scatter(s, r, n, t, op);
  }
  parallel::WorkPtr iall_gather(const void* s, void* r, int64_t n, parallel::CommType t) override {
    return in_.iall_gather(s, r, n, t);
  }
  parallel::WorkPtr isend(const void* b, int64_t n, parallel::CommType t, int dst,
                          int tag) override {
    return in_.isend(b, n - 1, t, dst, tag);
  }
  parallel::WorkPtr irecv(void* b, int64_t n, parallel::CommType t, int src, int tag) override {
    return in_.irecv(b, n, t, src, tag);
  }
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& r, const std::string& n) override {
    return in_.new_group(r, n);
  }
  std::unique_ptr<ProcessGroup> split(int c, int k, const std::string& n) override {
    return in_.split(c, k, n);
  }

 private:
  ProcessGroup& in_;
};

TEST(PipelineExecutorErrors, ShortMessageIsAnError) {
  // In each pair, rank 1 (the last stage) sends its gradient one element short; rank 0 must
  // fail on receiving it, rank 1 finishes (its short send is delivered).
  auto g = pair_group();
  if (g->size() < 2) GTEST_SKIP() << "odd rank out";
  Schedule s = make("gpipe", 2, 1);
  ToyRunner runner(s, g->rank());
  if (g->rank() == 1) {
    ShortSends shorter(*g);
    EXPECT_NO_THROW(run_schedule(s, runner, shorter));
    return;
  }
  try {
    run_schedule(s, runner, *g);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("receiving the gradient of microbatch 0 for stage 0 from rank 1"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("received 31 elements but 32 were expected"), std::string::npos) << what;
  }
}
