// The plan built on the shape-only walk: the GEMM list covers every linear of the model (dense,
// MLA, MoE under expert and expert-tensor parallelism), and the walk of one rank of the big
// recipes takes seconds.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "config/experiment.h"
#include "plan/gemm_list.h"
#include "plan/memory_estimate.h"
#include "plan/model_walk.h"
#include "plan/parallel_layout.h"

namespace primus::plan {
namespace {

ModelSpec small_spec() {
  ModelSpec s = load_model_spec("tiny");
  s.num_layers = 2;
  s.vocab_size = 96;
  return s;
}

config::TrainingArgs args_of(int64_t mbs, int64_t seq) {
  config::TrainingArgs a;
  a.micro_batch_size = mbs;
  a.global_batch_size = mbs * 4;
  a.seq_length = seq;
  return a;
}

double flops(const std::vector<GemmEntry>& gemms, const std::string& part = "") {
  double f = 0;
  for (const auto& g : gemms)
    if (g.what.find(part) != std::string::npos) f += g.flops();
  return f;
}

// Every linear weight's three GEMMs (forward, input and weight gradient): 6 N FLOPs per
// parameter, the output layer's included; the head in vocabulary chunks covers the vocabulary.
TEST(GemmList, CoversEveryLinear) {
  const ModelSpec s = small_spec();
  const config::TrainingArgs a = args_of(2, 8);
  const int64_t N = 16;
  const GemmList list = model_gemms(s, plan_layout(a, s, 1), a);
  double linear = 0;
  for (const auto& p : model_parameter_layout(s))
    if (p.shape.size() == 2 && !p.name.starts_with("embedding.")) linear += double(p.numel);
  EXPECT_DOUBLE_EQ(flops(list.gemms), 6.0 * N * linear);
  EXPECT_EQ(list.microbatches, 4);
  LlamaOptions chunked;
  chunked.logits_memory_budget = 0;
  chunked.vocab_chunk = 10;
  int64_t columns = 0;
  for (const auto& g : model_gemms(s, plan_layout(a, s, 1), a, &chunked).gemms)
    if (g.what == "output_layer forward") columns += g.n * g.count;
  EXPECT_EQ(columns, 3 * s.vocab_size) << "the logits of each chunk in F, and again in B and W";
}

// MLA and MoE layers: every linear weight's three GEMMs over the rows that use it, the routed
// experts' rows balanced (each expert N x topk / E rows, so its FLOPs are topk / E of a dense
// weight's); the shared gate has no forward GEMM. Expert parallelism keeps a rank's expert FLOPs
// (half the experts, twice the rows); split experts (etp = tp) halve them, and so do whole
// experts under sequence parallelism (N / tp rows).
TEST(GemmList, CoversMlaAndMoeLayers) {
  ModelSpec s = small_spec();
  s.num_layers = 4;
  s.multi_latent_attention = true;
  s.q_lora_rank = 12;
  s.kv_lora_rank = 8;
  s.qk_head_dim = 8;
  s.qk_pos_emb_head_dim = 4;
  s.v_head_dim = 8;
  s.num_query_groups = 4;
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 16;
  s.moe_router_topk = 2;
  s.moe_layer_pattern = {0, 1, 0, 1};
  s.moe_shared_expert_intermediate_size = 16;
  s.moe_shared_expert_gate = true;
  s.validate();
  const int64_t N = 16;
  double want = 0, experts = 0;
  for (const auto& p : model_parameter_layout(s)) {
    if (p.shape.size() != 2 || p.name.starts_with("embedding.")) continue;
    const double n = double(p.numel);
    if (p.expert >= 0)
      experts += 6.0 * N * n * double(s.moe_router_topk) / double(s.num_experts);
    else if (p.name.ends_with("gate_weight"))
      want += 4.0 * N * n;
    else
      want += 6.0 * N * n;
  }
  ASSERT_GT(experts, 0);
  config::TrainingArgs a = args_of(2, 8);
  const GemmList one = model_gemms(s, plan_layout(a, s, 1), a);
  EXPECT_DOUBLE_EQ(flops(one.gemms), want + experts);
  EXPECT_DOUBLE_EQ(flops(one.gemms, "(grouped)"), experts);
  for (const char* what : {"self_attention.linear_q_down_proj forward", "self_attention.linear_q_up_proj forward",
                           "self_attention.linear_kv_down_proj forward", "self_attention.linear_kv_up_proj forward"})
    EXPECT_TRUE(std::any_of(one.gemms.begin(), one.gemms.end(), [&](const GemmEntry& g) { return g.what == what; }))
        << what;
  EXPECT_FALSE(one.grouped.empty());
  a.expert_model_parallel_size = 2;
  const GemmList ep2 = model_gemms(s, plan_layout(a, s, 2), a);
  EXPECT_DOUBLE_EQ(flops(ep2.gemms, "(grouped)"), experts);
  for (const auto& g : one.gemms)
    if (g.what == "mlp.experts.linear_fc1 forward (grouped)")
      for (const auto& h : ep2.gemms)
        if (h.what == g.what) {
          EXPECT_EQ(h.m, 2 * g.m);
          EXPECT_EQ(h.count, g.count / 2);
        }
  a.expert_model_parallel_size = 1;
  a.tensor_model_parallel_size = 2;
  a.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(flops(model_gemms(s, plan_layout(a, s, 2), a).gemms, "(grouped)"), experts / 2);  // etp 2
  a.expert_tensor_parallel_size = 1;
  EXPECT_DOUBLE_EQ(flops(model_gemms(s, plan_layout(a, s, 2), a).gemms, "(grouped)"), experts / 2);  // N / tp rows
  a.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(flops(model_gemms(s, plan_layout(a, s, 2), a).gemms, "(grouped)"), experts);
}

// FP8 linears (model/linears.h) come into the walk as the trainer builds them (model_options):
// every pass quantizes its GEMMs' operands, and the GEMMs stay the same calls.
TEST(ModelWalk, Fp8LinearsQuantizeTheirOperandsInEveryPass) {
  const ModelSpec s = small_spec();
  config::TrainingArgs a = args_of(2, 32);
  a.bf16 = true;
  auto walk = [&](Fp8Mode mode, Fp8Recipe recipe) {
    a.fp8 = mode;
    a.fp8_recipe = recipe;
    const ParallelLayout L = plan_layout(a, s, 1);
    return walk_rank(s, rank_shape(s, L, a, Precision::Bf16, 0));
  };
  auto count = [](const PassRecord& p, const std::string& op) {
    size_t n = 0;
    for (const auto& c : p.ops) n += op == c.op;
    return n;
  };
  const RankRecord bf16 = walk(Fp8Mode::Off, Fp8Recipe::Delayed);
  const PassRecord& plain_f = bf16.chunks.front().f;
  EXPECT_EQ(count(plain_f, "quantize_fp8") + count(bf16.chunks.front().b, "quantize_fp8"), 0u);
  for (const Fp8Recipe recipe : {Fp8Recipe::Delayed, Fp8Recipe::Tensorwise, Fp8Recipe::Blockwise}) {
    SCOPED_TRACE(fp8_recipe_name(recipe));
    const RankRecord fp8 = walk(Fp8Mode::Hybrid, recipe);
    const ChunkRecord& c = fp8.chunks.front();
    EXPECT_GT(count(c.f, "quantize_fp8"), 0u);
    EXPECT_GT(count(c.b, "quantize_fp8"), 0u);  // the fused backward: input and weight gradients
    EXPECT_EQ(count(c.f, "gemm"), count(plain_f, "gemm"));
    EXPECT_GT(c.f.flops(), plain_f.flops());  // the quantizations' own
  }
}

// FP8 GEMMs in the list: the same problems as bf16's, each named by its parameter (the walk
// follows a quantized copy back to its weight), marked FP8 with the recipe's coarsest scaling;
// the output layer (bf16 by default) stays unmarked.
TEST(GemmList, Fp8GemmsKeepTheirNamesAndSayFp8) {
  const ModelSpec s = small_spec();
  config::TrainingArgs a = args_of(2, 32);
  a.bf16 = true;
  const GemmList bf16 = model_gemms(s, plan_layout(a, s, 1), a);
  a.fp8 = Fp8Mode::Hybrid;
  for (const Fp8Recipe recipe : {Fp8Recipe::Tensorwise, Fp8Recipe::Blockwise}) {
    SCOPED_TRACE(fp8_recipe_name(recipe));
    a.fp8_recipe = recipe;
    const GemmList fp8 = model_gemms(s, plan_layout(a, s, 1), a);
    ASSERT_EQ(fp8.gemms.size(), bf16.gemms.size());
    EXPECT_DOUBLE_EQ(flops(fp8.gemms), flops(bf16.gemms));
    int marked = 0;
    for (size_t i = 0; i < fp8.gemms.size(); ++i) {
      const GemmEntry& g = fp8.gemms[i];
      EXPECT_EQ(g.what, bf16.gemms[i].what);
      EXPECT_FALSE(bf16.gemms[i].fp8.has_value()) << g.what;
      EXPECT_FALSE(g.what.starts_with("gemm ")) << "an FP8 GEMM lost its parameter's name";
      if (g.what.starts_with("output_layer ")) {
        EXPECT_FALSE(g.fp8.has_value()) << g.what;
        continue;
      }
      ASSERT_TRUE(g.fp8.has_value()) << g.what;
      EXPECT_EQ(g.fp8->coarsest(),
                recipe == Fp8Recipe::Tensorwise ? fp8::Granularity::Tensor : fp8::Granularity::Tile1x128)
          << g.what;
      // hybrid: E4M3 activations and weights, E5M2 gradients (A of the input and weight gradients)
      const bool forward = g.what.ends_with(" forward");
      EXPECT_EQ(g.fp8->a.format, forward ? fp8::Format::E4M3 : fp8::Format::E5M2) << g.what;
      EXPECT_EQ(g.fp8->b.format, fp8::Format::E4M3) << g.what;
      EXPECT_EQ(fp8_operands_name(g).empty(), false) << g.what;
      ++marked;
    }
    EXPECT_EQ(marked, int(fp8.gemms.size()) - 3) << "every linear's three GEMMs but the output layer's";
  }
}

// The one label `benchmark gemm` and `bench_engine --profile` give a problem.
TEST(GemmList, LabelNamesFormShapeTypesAndExtras) {
  GemmEntry g;
  g.trans_b = true, g.m = 2048, g.n = 2304, g.k = 768, g.in = DType::BF16, g.out = DType::BF16, g.accumulate = true;
  EXPECT_EQ(gemm_label(g), "NT 2048x2304x768 bf16>bf16 +C");
  g.accumulate = false;
  EXPECT_EQ(gemm_label(g), "NT 2048x2304x768 bf16>bf16");
  g.trans_a = true, g.trans_b = false, g.out = DType::F32, g.bias = true, g.accumulate = true;
  g.fp8 = ops::OpCall::Fp8Operands{};
  EXPECT_EQ(gemm_label(g), "TN 2048x2304x768 fp8>fp32 +bias+C");
}

// The walk of one rank of the big recipes (docs/profiling.md): Llama 3.1 405B at tp 8 pp 8 vpp 2
// and DeepSeek-V3 at ep 64 over pp 16, on 1024 GPUs. Only the rank's partition is built, on the
// shape-only backend: seconds, not the terabytes the model would take.
TEST(ModelWalk, OneRankOfTheBigRecipesTakesSeconds) {
  for (const char* recipe : {"llama3.1_405B_tp_pp_vpp", "deepseek_v3_ep64"}) {
    const config::ExperimentConfig cfg = config::load_experiment(std::string(PRIMUS_SOURCE_DIR) +
                                                                 "/benchmarks/projection/recipes/" + recipe + ".yaml");
    auto t0 = std::chrono::steady_clock::now();
    const ParallelLayout L = plan_layout(cfg.train, cfg.model_spec, 1024);
    const double planned = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    const RankRecord rec = walk_rank(cfg.model_spec, rank_shape(cfg.model_spec, L, cfg.train, Precision::Bf16, 1));
    const double walked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t params = 0;
    size_t ops = 0;
    for (const auto& p : rec.params) params += p.numel;
    for (const auto& c : rec.chunks) ops += c.f.ops.size() + c.b.ops.size() + c.w.ops.size();
    const MemoryEstimate e = estimate_rank_memory(rec, L, cfg.train, L.sharding, 1);
    std::printf("%s: %s; pipeline rank 1 walked in %.2f s (the plan, with pipeline_balance auto's walk of every layer, "
                "%.2f s): %.2fB parameters, %zu ops, %.1f GiB\n",
                recipe, L.describe().c_str(), walked, planned, double(params) / 1e9, ops, e.total_bytes() / (1 << 30));
    EXPECT_GT(params, 1'000'000'000);
    EXPECT_GT(ops, 100u);
    EXPECT_LT(walked, 60.0) << "seconds, on a machine that others share";
  }
}

// gpt-oss's attention on the shape-only walk: each layer's attention ops carry its window, their
// FLOPs count the keys the window lets a query see, and the learned sinks' gradient is one op per
// layer in the backward.
TEST(ModelWalk, WindowedLayersAndSinksAreCounted) {
  ModelSpec s = small_spec();
  s.window_size = 8;
  s.window_attn_skip_freq = 2;  // layer 0 on the window, layer 1 full
  s.softmax_type = "learnable";
  const config::TrainingArgs a = args_of(2, 64);
  const RankRecord rec = walk_rank(s, rank_shape(s, plan_layout(a, s, 1), a, Precision::Fp32, 0));
  ASSERT_EQ(rec.chunks.size(), 1u);
  std::vector<ops::OpCall> forward;
  for (const auto& o : rec.chunks[0].f.ops)
    if (std::string(o.op) == "attention_forward") forward.push_back(o);
  ASSERT_EQ(forward.size(), 2u);
  const double S = 64, W = 8, heads = double(s.num_attention_heads), d = double(s.head_dim());
  EXPECT_EQ(forward[0].window, 8);
  EXPECT_EQ(forward[1].window, -1);
  EXPECT_DOUBLE_EQ(forward[0].flops, 4.0 * 2 * heads * d * (S * S / 2 - (S - W - 1) * (S - W) / 2));
  EXPECT_DOUBLE_EQ(forward[1].flops, 4.0 * 2 * heads * d * S * S / 2);
  int sink_grads = 0;
  for (const auto& o : rec.chunks[0].b.ops) sink_grads += std::string(o.op) == "attention_sink_backward";
  EXPECT_EQ(sink_grads, 2);
}

}  // namespace
}  // namespace primus::plan
