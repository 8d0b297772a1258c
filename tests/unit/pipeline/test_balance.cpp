// Pipeline balancing: the split from per-layer costs with the embedding and the output layer,
// and the trainer's plan with pipeline_balance auto (plan/parallel_layout.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/experiment.h"
#include "core/error.h"
#include "model/model_spec.h"
#include "pipeline/balance.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/simulator.h"
#include "plan/parallel_layout.h"
#include "split_checks.h"

using namespace primus;
using namespace primus::pipeline;

namespace {

Schedule make(const std::string& name, int p, int m) {
  ScheduleRequest r;
  r.pp = p, r.microbatches = m;
  return generate(name, r);
}

// `n` layers of one unit each (F, B, W a third), a head of `head` units, an embedding of `embed`.
ModelCosts uniform(int n, double head, double embed = 0.0) {
  ModelCosts c;
  c.layers.assign(n, StageCost{1.0 / 3, 1.0 / 3, 1.0 / 3});
  c.head = {head / 3, head / 3, head / 3};
  c.embedding = {embed / 2, 0.0, embed / 2};
  return c;
}

using test::counts;

double largest(const std::vector<StageCost>& c) {
  double m = 0;
  for (auto& s : c) m = std::max(m, s.forward + s.backward + s.weight);
  return m;
}

}  // namespace

TEST(PipelineBalance, HeavyOutputLayerGetsFewerLayers) {
  // 16 layers and a head worth 10 of them over 4 stages: the last stage keeps one layer (11
  // units), the others 5 (Megatron's decoder_last_pipeline_num_layers 1); evenly it would be 14.
  const Schedule s = make("1f1b", 4, 8);
  const BalanceResult b = balance_layers(s, uniform(16, 10), Costs{});
  EXPECT_EQ(counts(b.split), (std::vector<int64_t>{5, 5, 5, 1}));
  EXPECT_EQ(b.first_rank_layers, 0);
  EXPECT_EQ(b.last_rank_layers, 1);
  EXPECT_NEAR(largest(b.stage_costs), 11, 1e-9);
  ASSERT_TRUE(b.even_valid);
  EXPECT_EQ(counts(b.even_split), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_NEAR(largest(b.even_stage_costs), 14, 1e-9);
  EXPECT_LT(b.step, b.even_step);
  // The reported step is the simulator's for that split.
  Costs c;
  c.stages = b.stage_costs;
  EXPECT_DOUBLE_EQ(simulate(s, c).makespan, b.step);
}

TEST(PipelineBalance, EvenWhenNothingIsExtra) {
  const BalanceResult b = balance_layers(make("zb-h1", 4, 8), uniform(8, 0), Costs{});
  EXPECT_EQ(counts(b.split), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(b.first_rank_layers, 0);
  EXPECT_EQ(b.last_rank_layers, 0);
  EXPECT_DOUBLE_EQ(b.step, b.even_step);
}

TEST(PipelineBalance, NeverWorseThanAnyMegatronSplit) {
  // Both ends heavy, layers that do not divide evenly, looped and V-shape placements.
  for (const char* name : {"1f1b", "zb-h1", "interleaved-1f1b", "zbv", "dualpipev"})
    for (int layers : {13, 16, 22}) {
      SCOPED_TRACE(std::string(name) + " " + std::to_string(layers) + " layers");
      const Schedule s = make(name, 4, 8);
      const ModelCosts costs = uniform(layers, 3.5, 1.5);
      const BalanceResult b = balance_layers(s, costs, Costs{});
      test::expect_contiguous(b.split, layers);
      EXPECT_EQ(b.stage_costs, stage_costs(b.split, costs));
      for (int64_t first = 0; first <= layers; first += s.vpp)
        for (int64_t last = 0; last <= layers; last += s.vpp) {
          std::vector<LayerRange> split;
          try {
            split = split_layers(s, layers, first, last);
          } catch (const primus::Error&) {
            continue;
          }
          Costs c;
          c.stages = stage_costs(split, costs);
          EXPECT_LE(b.step, simulate(s, c).makespan * (1 + 1e-9)) << "first " << first << " last " << last;
        }
    }
}

TEST(PipelineBalance, TooFewLayers) {
  EXPECT_THROW(balance_layers(make("1f1b", 4, 8), uniform(3, 1), Costs{}), primus::Error);
}

// The costs come from the model's own passes walked on the shape-only backend (plan/model_walk.h).
TEST(PipelineBalance, LayerCostsFromTheWalk) {
  ModelSpec spec = load_model_spec("tiny_llama");
  spec.num_layers = 16;
  spec.vocab_size = 32000;
  config::TrainingArgs a;
  a.micro_batch_size = 4;
  a.global_batch_size = 4;
  a.seq_length = 128;
  const plan::ParallelLayout L = plan::plan_layout(a, spec, 1);
  const ModelCosts c = plan::layer_costs(spec, a, L);
  ASSERT_EQ(c.layers.size(), 16u);
  // W is the weight GEMMs only; B has the attention's backward too.
  EXPECT_LT(c.layers[0].weight, c.layers[0].forward);
  EXPECT_GT(c.layers[0].backward, c.layers[0].forward);
  // The three GEMMs of the 32000 x 256 output layer: about ten decoder layers' work.
  const double layer = c.layers[0].forward + c.layers[0].backward + c.layers[0].weight;
  const double head = c.head.forward + c.head.backward + c.head.weight;
  EXPECT_GT(head / layer, 9.0);
  EXPECT_LT(head / layer, 11.0);
  // model_stats counts 6 FLOPs per weight and token plus attention; the walk has the norms',
  // SwiGLU's and rotary embedding's few FLOPs per element on top (under 2% here).
  const ModelStats st = model_stats(spec, 128);
  EXPECT_GT(layer * 1e9 / (4 * 128), st.layers[1].flops_per_token);
  EXPECT_NEAR(layer * 1e9 / (4 * 128), st.layers[1].flops_per_token, 0.02 * st.layers[1].flops_per_token);
  // Tensor parallelism divides a layer's work.
  a.tensor_model_parallel_size = 2;
  const ModelCosts t = plan::layer_costs(spec, a, plan::plan_layout(a, spec, 2));
  EXPECT_NEAR(t.layers[0].forward, c.layers[0].forward / 2, 0.05 * c.layers[0].forward);
}

TEST(PipelineBalance, TrainerPlanWithBalanceAuto) {
  config::TrainingArgs a;
  a.pipeline_model_parallel_size = 4;
  a.micro_batch_size = 4;
  a.global_batch_size = 32;
  a.seq_length = 128;
  a.pipeline_schedule = "1f1b";
  a.pipeline_balance = config::PipelineBalance::Auto;
  ModelSpec spec = load_model_spec("tiny_llama");
  spec.num_layers = 16;
  spec.vocab_size = 32000;
  const plan::ParallelLayout L = plan::plan_layout(a, spec, 4);
  EXPECT_EQ(counts(L.stages), (std::vector<int64_t>{5, 5, 5, 1}));
  ASSERT_TRUE(L.balance.has_value());
  EXPECT_EQ(L.stage_costs.size(), 4u);
  const std::string d = L.describe();
  EXPECT_NE(d.find("layers per stage 5,5,5,1"), std::string::npos) << d;
  EXPECT_NE(d.find("decoder_last_pipeline_num_layers 1"), std::string::npos) << d;
  EXPECT_NE(d.find("even split 4,4,4,4"), std::string::npos) << d;
  EXPECT_NE(L.describe_balance(100).find(" ms"), std::string::npos);

  // zb-auto gets the split's stage times and zero_bubble_max_pending_backward as its limit.
  a.pipeline_schedule = "zb-auto";
  a.zero_bubble_max_pending_backward = 8;
  const plan::ParallelLayout Z = plan::plan_layout(a, spec, 4);
  Costs c;
  c.stages = Z.stage_costs;
  EXPECT_LE(simulate(*Z.schedule, c).peak_activations, 8 + 1e-9);
  EXPECT_NE(Z.describe().find("memory limit 8"), std::string::npos) << Z.describe();

  // Errors name the keys.
  a.decoder_last_pipeline_num_layers = 2;
  try {
    plan::plan_layout(a, spec, 4);
    FAIL() << "pipeline_balance auto with decoder_last_pipeline_num_layers accepted";
  } catch (const primus::Error& e) {
    EXPECT_NE(std::string(e.what()).find("decoder_last_pipeline_num_layers"), std::string::npos) << e.what();
  }
}

// pipeline_model_parallel_layout: its stages are the split, their count over pp the vpp, and
// Megatron's 1f1b with virtual stages is the interleaved schedule.
TEST(PipelineLayout, PlanTakesTheLayoutsStagesAndVpp) {
  config::TrainingArgs a;
  a.pipeline_model_parallel_size = 2;
  a.micro_batch_size = 1;
  a.global_batch_size = 4;
  a.seq_length = 32;
  a.pipeline_model_parallel_layout = "Et|t*3|(t*2|)*1,t*3L";
  ModelSpec spec = load_model_spec("tiny_llama");
  spec.num_layers = 9;
  const plan::ParallelLayout L = plan::plan_layout(a, spec, 2);
  EXPECT_EQ(counts(L.stages), (std::vector<int64_t>{1, 3, 2, 3}));
  EXPECT_EQ(L.vpp, 2);
  EXPECT_EQ(L.schedule->algorithm, "interleaved-1f1b");

  auto error_of = [&](config::TrainingArgs b, int world = 2) {
    try {
      plan::plan_layout(b, spec, world);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto b = a;
  b.virtual_pipeline_model_parallel_size = 4;
  EXPECT_NE(error_of(b).find("a vpp of 2, but virtual_pipeline_model_parallel_size is 4"), std::string::npos);
  b = a;
  b.decoder_first_pipeline_num_layers = 1;
  EXPECT_NE(error_of(b).find("unset decoder_first_pipeline_num_layers"), std::string::npos);
  b = a;
  b.pipeline_balance = config::PipelineBalance::Auto;
  EXPECT_NE(error_of(b).find("unset pipeline_balance auto"), std::string::npos);
  b = a;
  b.pipeline_schedule = "zbv";
  EXPECT_NE(error_of(b).find("placed v-shape"), std::string::npos) << error_of(b);
  b = a;
  b.pipeline_model_parallel_size = 3;
  EXPECT_NE(error_of(b, 3).find("4 stages, not a multiple of pipeline_model_parallel_size 3"), std::string::npos);
  b = a;
  b.pipeline_model_parallel_layout = "Et|t*3|t*2|t*2L";
  EXPECT_NE(error_of(b).find("places 8 transformer layers, the model has num_layers 9"), std::string::npos);
  b = a;
  b.pipeline_model_parallel_size = 1;
  b.pipeline_model_parallel_layout = "Et*9L";
  EXPECT_EQ(error_of(b, 1), "no error");
  b.pipeline_model_parallel_layout = "Et*4|t*5L";
  EXPECT_NE(error_of(b, 1).find("has 2 stages; with pipeline_model_parallel_size 1 it has one"), std::string::npos);
}
