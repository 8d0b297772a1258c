// The profiler's decorators over the real CPU backend and a group of one: the model computes the
// same bits traced or not, and the trace holds every op with its pass, layer, shape and FLOPs,
// the collectives with their group and bytes, and compute regions that never cover an op.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "parallel/self_process_group.h"
#include "trace/analysis.h"
#include "trace/profiler.h"
#include "trace/traced_group.h"
#include "support/tiny_spec.h"

namespace fs = std::filesystem;

namespace primus::trace {
namespace {

ModelSpec small_model() { return test::tiny_llama_spec("test", 64, 32, ModelSpec{}.init_method_std, {.hidden = 32, .ffn = 64}); }

struct Batch {
  std::vector<int32_t> tokens, targets;
  Batch(int64_t n) : tokens(size_t(n)), targets(size_t(n)) {
    for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t(i * 7 % 64), targets[size_t(i)] = int32_t(i * 5 % 64);
  }
};

class Profiling : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("primus_trace_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  parallel::SelfProcessGroup world_;
};

TEST_F(Profiling, TracesEveryOpOfAStepWithoutChangingAResult) {
  const ModelSpec spec = small_model();
  const int64_t B = 2, S = 16, N = B * S;
  const Batch batch(N);
  // The untraced reference.
  LlamaModel plain(spec, cpu::cpu_backend(), Precision::Fp32);
  plain.init_weights(3);
  LlamaContext c0;
  const double loss0 = plain.forward(c0, batch.tokens.data(), batch.targets.data(), B, S);
  plain.backward(c0, 1.0);

  Profiler p({true, 0, 1, {0}, 1}, world_, dir_, host_clock());
  ops::Backend& be = p.wrap(cpu::cpu_backend());
  LlamaModel model(spec, be, Precision::Fp32);
  model.init_weights(3);
  p.set_parameters(model.params(), model.working_weights());
  TracedProcessGroup group(std::make_unique<parallel::SelfProcessGroup>("dp"), p);
  p.step_begin(1);
  ASSERT_TRUE(p.active());
  LlamaContext c1;
  double loss1 = 0;
  {
    PassSpan f(&p, Pass::F, 0, -1);
    loss1 = model.forward(c1, batch.tokens.data(), batch.targets.data(), B, S);
  }
  {
    PassSpan bw(&p, Pass::B, 0, -1, true);
    model.backward(c1, 1.0);
  }
  {
    Region opt(&p, "optimizer_step");
    std::vector<float> v(100, 1.0f);
    group.all_reduce(v);
    Tensor src = Tensor::zeros({64}), dst = Tensor::empty({64});
    be.cast(src, dst);
  }
  const fs::path file = p.step_end(1);
  EXPECT_FALSE(p.active());
  ASSERT_TRUE(fs::exists(file)) << file;
  EXPECT_EQ(file, dir_ / "rank-0.json");

  // Same bits as untraced.
  EXPECT_EQ(loss0, loss1);
  const int64_t n = plain.params().numel();
  EXPECT_EQ(0, std::memcmp(plain.params().grads().data<float>(), model.params().grads().data<float>(), size_t(n) * 4));

  nlohmann::json j;
  std::ifstream(file) >> j;
  const RankTrace t = parse_trace(j, file.string());
  std::map<std::string, int> gemms_by_pass;
  bool saw_qkv = false, saw_layer1 = false, saw_comm = false;
  for (const TraceEvent& e : t.events) {
    if (e.op == "gemm") {
      gemms_by_pass[e.pass] += 1;
      EXPECT_DOUBLE_EQ(e.flops, 2.0 * double(e.M) * double(e.N) * double(e.K));
      if (e.module == "linear_qkv" && e.pass == "F") {
        saw_qkv = true;
        EXPECT_EQ(e.M, N);
        EXPECT_EQ(e.N, spec.qkv_size());
        EXPECT_EQ(e.K, spec.hidden_size);
      }
      if (e.layer == 1) saw_layer1 = true;
    }
    if (e.cat == "communication") {
      saw_comm = true;
      EXPECT_EQ(e.group, "dp");
      EXPECT_DOUBLE_EQ(e.bytes, 400.0);
      EXPECT_GE(e.seq, 0);
    }
  }
  // Per layer 4 GEMMs a pass (qkv, proj, fc1, fc2), and the output layer's one.
  EXPECT_EQ(gemms_by_pass["F"], 9);
  EXPECT_EQ(gemms_by_pass["B"], 9);
  EXPECT_EQ(gemms_by_pass["W"], 9);
  EXPECT_TRUE(saw_qkv);
  EXPECT_TRUE(saw_layer1);
  EXPECT_TRUE(saw_comm);

  // The optimizer region and what ran inside it never overlap, and add up to the region's span.
  std::vector<const TraceEvent*> inside;
  for (const TraceEvent& e : t.events)
    if (e.op == "optimizer_step" || (e.cat != "annotation" && e.op == "cast")) inside.push_back(&e);
  ASSERT_GE(inside.size(), 2u);
  std::sort(inside.begin(), inside.end(), [](auto* a, auto* b) { return a->ts < b->ts; });
  for (size_t i = 1; i < inside.size(); ++i) EXPECT_LE(inside[i - 1]->end, inside[i]->ts + 1e-6);

  // Layer spans of each pass.
  std::map<std::string, int> spans;
  for (const TraceEvent& e : t.events)
    if (e.cat == "annotation") spans[e.name] += 1;
  EXPECT_EQ(spans["F layer 0"], 1);
  EXPECT_EQ(spans["BW layer 1"], 1);
  EXPECT_EQ(spans["F head"], 1);
  EXPECT_EQ(spans["step 1"], 1);
  EXPECT_EQ(j["otherData"]["clock"], "host steady clock");

  // The analysis of it: the timeline's parts add up, the op percentages to 100.
  const TraceReport r = analyze({t});
  const Timeline& tl = r.mean;
  EXPECT_NEAR(tl.computation_ms + tl.exposed_comm_ms + tl.exposed_memcpy_ms + tl.idle_ms, tl.total_ms, 1e-9);
  double sum = 0;
  for (const auto& o : r.ops) sum += o.percent;
  EXPECT_NEAR(sum, 100.0, 1e-9);
}

TEST_F(Profiling, NothingIsRecordedOutsideTheWindow) {
  Profiler p({true, 1, 2, {0}, 5}, world_, dir_, host_clock());
  ops::Backend& be = p.wrap(cpu::cpu_backend());
  p.step_begin(1);  // the first step: before the window
  EXPECT_FALSE(p.active());
  Tensor a = Tensor::zeros({4, 4}), b = Tensor::zeros({4, 4});
  be.add(a, b, a);
  EXPECT_TRUE(p.step_end(1).empty());
  p.step_begin(2);
  EXPECT_TRUE(p.active());
  be.add(a, b, a);
  const fs::path f = p.step_end(2);
  ASSERT_FALSE(f.empty());
  nlohmann::json j;
  std::ifstream(f) >> j;
  int adds = 0;
  for (const auto& e : j["traceEvents"]) adds += e.value("name", "") == "add";
  EXPECT_EQ(adds, 1);
  p.step_begin(3);
  EXPECT_FALSE(p.active());
}

TEST_F(Profiling, ARankOutsideTheRunIsAnError) {
  EXPECT_THROW(Profiler({true, 0, 1, {3}, 1}, world_, dir_, host_clock()), Error);
  EXPECT_THROW(Profiler({true, 2, 2, {0}, 1}, world_, dir_, host_clock()), Error);
  // Not listed: never records.
  parallel::SelfProcessGroup w;
  Profiler p({true, 0, 1, {}, 1}, w, dir_, host_clock());
  p.step_begin(1);
  EXPECT_FALSE(p.active());
}

}  // namespace
}  // namespace primus::trace
