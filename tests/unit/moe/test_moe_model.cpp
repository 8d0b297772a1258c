// The MoE block inside LlamaModel: gradients of the whole objective (LM loss + router losses)
// against finite differences in double, the bf16 run against fp32, statistics, expert-bias
// updates, and learning.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "support/grad_check.h"
#include "core/rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"
#include "kernels/host_values.h"
#include "model/llama.h"

using namespace primus;

namespace {

ModelSpec tiny_moe(bool deepseek_style) {
  ModelSpec s;
  s.name = "tiny-moe";
  s.num_layers = 2;
  s.hidden_size = 8;
  s.ffn_hidden_size = 12;
  s.num_attention_heads = 2;
  s.vocab_size = 7;
  s.max_position_embeddings = 8;
  s.init_method_std = 0.4;
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 6;
  s.moe_router_topk = 2;
  s.moe_layer_pattern = {0, 1};  // a dense first layer
  s.moe_aux_loss_coeff = 0.1;
  s.moe_z_loss_coeff = 0.01;
  if (deepseek_style) {
    s.moe_shared_expert_intermediate_size = 6;
    s.moe_shared_expert_gate = true;
    s.moe_router_score_function = "sigmoid";
    s.moe_router_enable_expert_bias = true;
    s.moe_router_topk_scaling_factor = 1.5;
    s.moe_router_num_groups = 2;
    s.moe_router_group_topk = 1;
    s.moe_router_load_balancing_type = "seq_aux_loss";
    s.moe_expert_capacity_factor = 1.0;  // some choices dropped
  }
  return s;
}

struct Batch {
  int64_t b, s;
  std::vector<int32_t> tokens, targets;
};

Batch make_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch x{b, s, std::vector<int32_t>(size_t(b * s)), std::vector<int32_t>(size_t(b * s))};
  for (auto& t : x.tokens) t = int32_t(rng.next_u64() % uint64_t(vocab));
  for (auto& t : x.targets) t = int32_t(rng.next_u64() % uint64_t(vocab));
  return x;
}

// The objective the backward differentiates: LM loss plus every block's router losses.
double objective(LlamaModel& m, const Batch& x) {
  m.reset_moe_stats();
  LlamaContext c;
  double loss = m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
  for (const auto& s : m.moe_stats()) loss += s.aux_loss + s.z_loss;
  return loss;
}

void check_grads(const ModelSpec& spec) {
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp64);
  m.init_weights(5);
  const Batch x = make_batch(2, 4, spec.vocab_size, 9);
  m.params().zero_grad();
  LlamaContext ctx;
  m.forward(ctx, x.tokens.data(), x.targets.data(), x.b, x.s);
  m.backward(ctx, 1.0);
  const double* g = m.params().grads().data<double>();
  std::vector<double> analytic(g, g + m.params().numel());
  double* values = m.params().values().data<double>();
  int checked = 0;
  for (const auto& info : m.params().infos()) {
    if (info.name.find("expert_bias") != std::string::npos) {  // a buffer: no gradient
      for (int64_t i = 0; i < info.numel; ++i) EXPECT_EQ(analytic[size_t(info.offset + i)], 0.0);
      continue;
    }
    for (int64_t i = 0; i < info.numel; ++i) {
      const double num = test::numeric_grad(values + info.offset + i, [&] { return objective(m, x); });
      ASSERT_NEAR(analytic[size_t(info.offset + i)], num, 1e-8 + 1e-6 * std::fabs(num))
          << info.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace

TEST(MoeModel, MixtralStyleGradientsMatchFiniteDifferences) { check_grads(tiny_moe(false)); }

TEST(MoeModel, DeepSeekStyleGradientsMatchFiniteDifferences) {
  ModelSpec s = tiny_moe(true);
  LlamaModel probe(s, cpu::cpu_backend(), Precision::Fp64);
  probe.init_weights(5);
  const Batch x = make_batch(2, 4, s.vocab_size, 9);
  objective(probe, x);
  EXPECT_GT(probe.moe_stats()[0].dropped, 0);  // the capacity path is exercised
  check_grads(s);
}

// gpt-oss's biases (add_bias_linear): QKV, linear_proj, the dense MLP's fc1 and fc2, the router and
// each expert's fc1 and fc2, with its attention sinks and windows.
ModelSpec tiny_gpt_oss() {
  ModelSpec s = tiny_moe(false);
  s.add_bias_linear = true;
  s.softmax_type = "learnable";
  s.window_size = 2;
  s.window_attn_skip_freq = 2;
  return s;
}

TEST(MoeModel, GptOssBiasesGradientsMatchFiniteDifferences) { check_grads(tiny_gpt_oss()); }

// gpt-oss's clamped GLU in every MLP (dense and experts): quick_geglu, the +1 on the linear half,
// a clamp low enough that some of the tiny model's values are cut.
TEST(MoeModel, GptOssClampedGluGradientsMatchFiniteDifferences) {
  ModelSpec s = tiny_gpt_oss();
  s.quick_geglu = true;
  s.glu_linear_offset = 1.0;
  s.activation_func_clamp_value = 0.3;
  check_grads(s);
}

// The whole gpt-oss layer: sinks, windows, biases, the clamped GLU and YaRN on grouped-query
// attention (factor 4 over an original context of 4 positions, unrounded range: the head's pairs
// spread over the ramp); every gradient against finite differences in fp64, and YaRN changes the
// loss against plain rotary.
ModelSpec tiny_gpt_oss_yarn() {
  ModelSpec s = tiny_gpt_oss();
  s.quick_geglu = true;
  s.glu_linear_offset = 1.0;
  s.activation_func_clamp_value = 0.3;
  s.position_embedding_type = "yarn";
  s.rotary_scaling_factor = 4;
  s.yarn_original_max_position_embeddings = 4;
  s.yarn_beta_fast = 8;
  s.yarn_beta_slow = 0.5;
  s.yarn_correction_range_round_to_int = false;
  s.mscale_all_dim = 0;
  return s;
}

TEST(MoeModel, GptOssWithYarnGradientsMatchFiniteDifferences) { check_grads(tiny_gpt_oss_yarn()); }

TEST(MoeModel, GptOssYarnEntersTheForward) {
  ModelSpec rope = tiny_gpt_oss_yarn();
  rope.position_embedding_type = "rope";
  LlamaModel a(tiny_gpt_oss_yarn(), cpu::cpu_backend(), Precision::Fp64), b(rope, cpu::cpu_backend(), Precision::Fp64);
  a.init_weights(5);
  b.init_weights(5);
  const Batch x = make_batch(2, 4, 7, 9);
  EXPECT_NE(objective(a, x), objective(b, x));
}

// The biases change the function: with them non-zero the loss moves.
TEST(MoeModel, GptOssBiasesEnterTheForward) {
  LlamaModel m(tiny_gpt_oss(), cpu::cpu_backend(), Precision::Fp64);
  m.init_weights(5);
  const Batch x = make_batch(2, 4, 7, 9);
  const double before = objective(m, x);
  for (const char* name : {"decoder.layers.1.mlp.router.bias", "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.bias",
                           "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.bias",
                           "decoder.layers.0.mlp.linear_fc2.bias", "decoder.layers.0.self_attention.linear_proj.bias"}) {
    const int id = m.params().find(name);
    ASSERT_GE(id, 0) << name;
    const auto& info = m.params().infos()[size_t(id)];
    double* v = m.params().values().data<double>() + info.offset;
    v[0] += 0.5;
    m.sync_working_weights();
    EXPECT_NE(objective(m, x), before) << name;
    v[0] -= 0.5;
    m.sync_working_weights();
  }
}

TEST(MoeModel, LayoutMatchesTheSpecCount) {
  for (ModelSpec s : {tiny_moe(false), tiny_moe(true), tiny_gpt_oss()}) {
    LlamaModel m(s, cpu::cpu_backend(), Precision::Fp32);
    const auto layout = model_parameter_layout(s);
    ASSERT_EQ(m.params().infos().size(), layout.size());
    int64_t total = 0;
    for (size_t i = 0; i < layout.size(); ++i) {
      EXPECT_EQ(m.params().infos()[i].name, layout[i].name);
      EXPECT_EQ(m.params().infos()[i].numel, layout[i].numel);
      total += m.params().infos()[i].numel;
    }
    EXPECT_EQ(total, model_stats(s, 8).parameters);
  }
}

TEST(MoeModel, StatsCountEveryChoiceAndBiasMoves) {
  ModelSpec s = tiny_moe(true);
  s.moe_expert_capacity_factor = 0;  // dropless
  LlamaModel m(s, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(3);
  const Batch x = make_batch(2, 4, s.vocab_size, 1);
  objective(m, x);
  ASSERT_EQ(m.moe_stats().size(), 1u);
  const auto& st = m.moe_stats()[0];
  EXPECT_EQ(st.layer, 1);
  EXPECT_EQ(std::accumulate(st.tokens_per_expert.begin(), st.tokens_per_expert.end(), int64_t(0)), 8 * 2);
  EXPECT_EQ(st.dropped, 0);
  EXPECT_GT(st.aux_loss, 0);
  m.update_expert_biases({st.tokens_per_expert});
  const auto& info = m.params().infos()[size_t(m.params().find("decoder.layers.1.mlp.router.expert_bias"))];
  const float* bias = m.params().values().data<float>() + info.offset;
  const double mean = 16.0 / 4;
  for (int e = 0; e < 4; ++e) {
    const double want = st.tokens_per_expert[size_t(e)] < mean ? 1e-3 : st.tokens_per_expert[size_t(e)] > mean ? -1e-3 : 0;
    EXPECT_FLOAT_EQ(bias[e], float(want)) << e;
  }
}

// Grok 2's soft-capping (kernels/softcap.h), caps small enough to bend these tiny logits: the final
// logits' (fused into the cross-entropy) and the router's (on the host, z-loss included).
ModelSpec tiny_grok() {
  ModelSpec s = tiny_moe(false);
  s.final_logit_softcapping = 0.6;
  s.router_logit_softcapping = 0.3;
  return s;
}

TEST(MoeModel, GrokSoftcapsGradientsMatchFiniteDifferences) { check_grads(tiny_grok()); }

// Each cap changes the loss (so each is applied), and the final cap bounds what decoding samples from.
TEST(MoeModel, GrokSoftcapsEnterTheForward) {
  const Batch x = make_batch(2, 4, 7, 9);
  auto loss_of = [&](const ModelSpec& s) {
    LlamaModel m(s, cpu::cpu_backend(), Precision::Fp64);
    m.init_weights(5);
    return objective(m, x);
  };
  ModelSpec no_final = tiny_grok(), no_router = tiny_grok();
  no_final.final_logit_softcapping = 0;
  no_router.router_logit_softcapping = 0;
  const double both = loss_of(tiny_grok());
  EXPECT_GT(std::fabs(both - loss_of(no_final)), 1e-6);
  EXPECT_GT(std::fabs(both - loss_of(no_router)), 1e-6);
}

void check_bf16_against_fp32(ModelSpec s) {
  s.hidden_size = 32;
  s.num_attention_heads = 4;
  s.init_method_std = 0.02;
  s.vocab_size = 64;
  cpu::ReferenceBackend ref;
  LlamaModel a(s, cpu::cpu_backend(), Precision::Fp32), b(s, ref, Precision::Bf16);
  a.init_weights(4);
  b.init_weights(4);
  const Batch x = make_batch(2, 8, s.vocab_size, 2);
  LlamaContext ca, cb;
  const double la = a.forward(ca, x.tokens.data(), x.targets.data(), x.b, x.s);
  const double lb = b.forward(cb, x.tokens.data(), x.targets.data(), x.b, x.s);
  EXPECT_NEAR(la, lb, 0.01 * la);
  a.params().zero_grad();
  b.params().zero_grad();
  a.backward(ca, 1.0);
  b.backward(cb, 1.0);
  // Gradient direction agrees (cosine near 1).
  const float* ga = a.params().grads().data<float>();
  const float* gb = b.params().grads().data<float>();
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < a.params().numel(); ++i) {
    dot += double(ga[i]) * gb[i];
    na += double(ga[i]) * ga[i];
    nb += double(gb[i]) * gb[i];
  }
  EXPECT_GT(dot / std::sqrt(na * nb), 0.99);
}

// Llama 4 (docs/model_math.md, Llama 4): a chunked RoPE layer with the QK L2-norm (chunks of 3
// over 4 positions), then a NoPE layer with the queries' temperature (floor_scale 1: a new scale
// at every position), and top-1 sigmoid routing whose score scales the expert's input, with a
// shared expert; every gradient against finite differences in fp64.
ModelSpec tiny_llama4() {
  ModelSpec s = tiny_moe(false);
  s.num_query_groups = 1;
  s.no_rope_freq = 2;
  s.qk_l2_norm = true;
  s.attention_chunk_size = 3;
  s.attn_temperature_tuning = true;
  s.floor_scale = 1;
  s.attn_scale = 0.5;
  s.moe_layer_pattern = {1, 1};
  s.moe_router_topk = 1;
  s.moe_router_score_function = "sigmoid";
  s.moe_apply_probs_on_input = true;
  s.moe_shared_expert_intermediate_size = 6;
  return s;
}

TEST(MoeModel, Llama4GradientsMatchFiniteDifferences) { check_grads(tiny_llama4()); }

// Each of Llama 4's parts changes the loss: without it the model computes something else.
TEST(MoeModel, Llama4PartsEnterTheForward) {
  const ModelSpec base = tiny_llama4();
  const Batch x = make_batch(2, 4, base.vocab_size, 9);
  auto loss = [&](const ModelSpec& s) {
    LlamaModel m(s, cpu::cpu_backend(), Precision::Fp64);
    m.init_weights(5);
    return objective(m, x);
  };
  const double l = loss(base);
  ModelSpec v = base;
  v.no_rope_freq = 0;
  EXPECT_NE(l, loss(v)) << "no_rope_freq";
  v = base;
  v.qk_l2_norm = false;
  EXPECT_NE(l, loss(v)) << "qk_l2_norm";
  v = base;
  v.attention_chunk_size = 0;
  EXPECT_NE(l, loss(v)) << "attention_chunk_size";
  v = base;
  v.attn_temperature_tuning = false;
  EXPECT_NE(l, loss(v)) << "attn_temperature_tuning";
  v = base;
  v.moe_apply_probs_on_input = false;
  EXPECT_NE(l, loss(v)) << "moe_apply_probs_on_input";
}

// Chunked attention against a plain reference: with every layer on RoPE (relative positions) and
// chunks of 4, a sequence's second chunk computes what the chunk alone computes; the loss on its
// targets (the first chunk's masked) and every gradient equal those of the chunk run alone.
TEST(MoeModel, Llama4ChunkAttendsAsTheChunkAlone) {
  ModelSpec s = tiny_llama4();
  s.no_rope_freq = 0;
  s.attention_chunk_size = 4;
  auto run = [&](const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, std::vector<double>& g) {
    LlamaModel m(s, cpu::cpu_backend(), Precision::Fp64);
    m.init_weights(5);
    m.params().zero_grad();
    LlamaContext c;
    const double loss = m.forward(c, tokens.data(), targets.data(), 1, int64_t(tokens.size()));
    m.backward(c, 1.0);
    const double* p = m.params().grads().data<double>();
    g.assign(p, p + m.params().numel());
    return loss;
  };
  s.moe_aux_loss_coeff = 0;  // the router's losses count every token, the masked ones too
  s.moe_z_loss_coeff = 0;
  const std::vector<int32_t> tokens = {1, 5, 2, 6, 3, 0, 4, 2}, targets = {-1, -1, -1, -1, 0, 4, 2, 5};
  std::vector<double> g_whole, g_chunk;
  const double whole = run(tokens, targets, g_whole);
  const double chunk = run({3, 0, 4, 2}, {0, 4, 2, 5}, g_chunk);
  EXPECT_NEAR(whole, chunk, 1e-12);
  ASSERT_EQ(g_whole.size(), g_chunk.size());
  for (size_t i = 0; i < g_whole.size(); ++i) ASSERT_NEAR(g_whole[i], g_chunk[i], 1e-12) << i;
  // Without chunks the first four tokens change the second chunk's loss.
  s.attention_chunk_size = 0;
  std::vector<double> unused;
  EXPECT_GT(std::fabs(run(tokens, targets, unused) - chunk), 1e-6);
}

TEST(MoeModel, Llama4LearnsARepeatingSequence) {
  ModelSpec s = tiny_llama4();
  s.hidden_size = 16;
  s.init_method_std = 0.1;
  LlamaModel m(s, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(1);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 1, 2}, targets = {2, 3, 4, 5, 6, 1, 2, 3};
  float* v = m.params().values().data<float>();
  const float* g = m.params().grads().data<float>();
  double first = 0, last = 0;
  for (int it = 0; it < 150; ++it) {
    m.params().zero_grad();
    m.reset_moe_stats();
    LlamaContext c;
    const double loss = m.forward(c, tokens.data(), targets.data(), 1, 8);
    if (it == 0) first = loss;
    last = loss;
    m.backward(c, 1.0);
    for (int64_t i = 0; i < m.params().numel(); ++i) v[i] -= 0.3f * g[i];
  }
  EXPECT_LT(last, 0.2 * first) << first << " -> " << last;
}

TEST(MoeModel, Bf16MatchesFp32AtBf16Resolution) { check_bf16_against_fp32(tiny_moe(false)); }

TEST(MoeModel, Llama4Bf16MatchesFp32AtBf16Resolution) { check_bf16_against_fp32(tiny_llama4()); }

TEST(MoeModel, GrokSoftcapsBf16MatchesFp32AtBf16Resolution) {
  ModelSpec s = tiny_grok();
  s.final_logit_softcapping = 0.05;  // the logits of init_method_std 0.02, bent by the cap
  s.router_logit_softcapping = 0.02;
  check_bf16_against_fp32(s);
}

TEST(MoeModel, LearnsARepeatingSequence) {
  ModelSpec s = tiny_moe(true);
  s.hidden_size = 16;
  s.init_method_std = 0.1;
  s.moe_expert_capacity_factor = 0;
  LlamaModel m(s, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(1);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 1, 2}, targets = {2, 3, 4, 5, 6, 1, 2, 3};
  float* v = m.params().values().data<float>();
  const float* g = m.params().grads().data<float>();
  double first = 0, last = 0;
  for (int it = 0; it < 150; ++it) {
    m.params().zero_grad();
    m.reset_moe_stats();
    LlamaContext c;
    const double loss = m.forward(c, tokens.data(), targets.data(), 1, 8);
    if (it == 0) first = loss;
    last = loss;
    m.backward(c, 1.0);
    for (int64_t i = 0; i < m.params().numel(); ++i) v[i] -= 0.3f * g[i];
    std::vector<std::vector<int64_t>> counts;
    for (const auto& st : m.moe_stats()) counts.push_back(st.tokens_per_expert);
    m.update_expert_biases(counts);
  }
  EXPECT_LT(last, 0.2 * first) << first << " -> " << last;
}

// Recompute with MoE blocks: the block keeps its own saves while the rest of the layer reruns, so
// selective and full recompute give the gradients of a run without recompute.
TEST(MoeModel, RecomputeGivesTheSameGradients) {
  const ModelSpec s = tiny_moe(true);
  const Batch x = make_batch(2, 4, s.vocab_size, 4);
  LlamaModel ref(s, cpu::cpu_backend(), Precision::Fp64);
  ref.init_weights(6);
  ref.params().zero_grad();
  LlamaContext cr;
  const double want = ref.forward(cr, x.tokens.data(), x.targets.data(), x.b, x.s);
  ref.backward(cr, 0.25);
  const std::vector<double> gr = ops::host_values(ref.params().grads());
  for (Recompute r : {Recompute::Selective, Recompute::Full}) {
    LlamaOptions o;
    o.recompute = r;
    LlamaModel m(s, cpu::cpu_backend(), Precision::Fp64, o);
    m.init_weights(6);
    m.params().zero_grad();
    LlamaContext c;
    EXPECT_EQ(m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s), want);
    m.backward(c, 0.25);
    const std::vector<double> g = ops::host_values(m.params().grads());
    ASSERT_EQ(g.size(), gr.size());
    double worst = 0, big = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      worst = std::max(worst, std::fabs(g[i] - gr[i]));
      big = std::max(big, std::fabs(gr[i]));
    }
    EXPECT_GT(big, 0.0);
    EXPECT_LE(worst, 1e-12 * big) << "recompute " << int(r);
  }
}

// The fused backward and the B/W passes give the same gradients, with the router losses scaled
// by the microbatch's dloss in both.
TEST(MoeModel, FusedBackwardEqualsSplitPassesWithLossScale) {
  ModelSpec s = tiny_moe(true);
  LlamaModel a(s, cpu::cpu_backend(), Precision::Fp64), b(s, cpu::cpu_backend(), Precision::Fp64);
  a.init_weights(6);
  b.init_weights(6);
  const Batch x = make_batch(2, 4, s.vocab_size, 4);
  LlamaContext ca, cb;
  a.params().zero_grad();
  b.params().zero_grad();
  a.forward(ca, x.tokens.data(), x.targets.data(), x.b, x.s);
  b.forward(cb, x.tokens.data(), x.targets.data(), x.b, x.s);
  a.backward(ca, 0.25);
  b.backward_input(cb, 0.25);
  b.backward_weight(cb);
  const double* ga = a.params().grads().data<double>();
  const double* gb = b.params().grads().data<double>();
  for (int64_t i = 0; i < a.params().numel(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-12) << i;
  // And 0.25 of the dloss-1 gradient: everything in the objective scales together.
  LlamaContext cc;
  b.params().zero_grad();
  b.forward(cc, x.tokens.data(), x.targets.data(), x.b, x.s);
  b.backward(cc, 1.0);
  for (int64_t i = 0; i < a.params().numel(); ++i) ASSERT_NEAR(ga[i], 0.25 * gb[i], 1e-12) << i;
}
