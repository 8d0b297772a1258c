#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generation.h"

using namespace primus;

static ModelSpec gen_spec() {
  ModelSpec s;
  s.name = "gen-test";
  s.num_layers = 2;
  s.hidden_size = 32;
  s.ffn_hidden_size = 48;
  s.num_attention_heads = 4;
  s.num_query_groups = 2;
  s.vocab_size = 41;
  s.max_position_embeddings = 24;
  s.add_qkv_bias = true;
  s.use_rope_scaling = true;
  s.rope_original_max_position_embeddings = 8;
  s.init_method_std = 0.2;
  return s;
}

static void expect_cached_equals_full(const ModelSpec& spec);

TEST(Generation, KVCacheLogitsEqualAFullForward) { expect_cached_equals_full(gen_spec()); }

// Qwen3's per-head q/k norms run in the decoder's steps too.
TEST(Generation, KVCacheLogitsEqualAFullForwardWithQkLayernorm) {
  ModelSpec s = gen_spec();
  s.add_qkv_bias = false;
  s.qk_layernorm = true;
  expect_cached_equals_full(s);
}

// MiniMax-M2.5's partial rotary (rotary_percent 0.5: 4 of each head's 8 channels) in the
// decoder's steps as in the forward.
TEST(Generation, KVCacheLogitsEqualAFullForwardWithPartialRotary) {
  ModelSpec s = gen_spec();
  s.rotary_percent = 0.5;
  s.qk_layernorm = true;
  expect_cached_equals_full(s);
}

// Llama 4's attention: chunks of 5 on the RoPE layer (layer 0: each step decodes over its chunk's
// rows of the cache alone), the QK L2-norm there, and the NoPE layer (layer 1) with the queries'
// temperature changing every 3 positions; the 20-token sequence spans four chunks.
TEST(Generation, KVCacheLogitsEqualAFullForwardWithLlama4Attention) {
  ModelSpec s = gen_spec();
  s.no_rope_freq = 2;
  s.qk_l2_norm = true;
  s.attention_chunk_size = 5;
  s.attn_temperature_tuning = true;
  s.floor_scale = 3;
  s.attn_scale = 0.5;
  expect_cached_equals_full(s);
}

// gpt-oss's attention: the decoder's steps see the same window (layer 0) and sinks as the forward;
// the 20-token sequence runs past the window of 5.
TEST(Generation, KVCacheLogitsEqualAFullForwardWithSinksAndWindows) {
  ModelSpec s = gen_spec();
  s.softmax_type = "learnable";
  s.window_size = 5;
  s.window_attn_skip_freq = 2;
  expect_cached_equals_full(s);
}

// MoE blocks (dropless): every new row is routed by itself, as in the full forward.
TEST(Generation, KVCacheLogitsEqualAFullForwardWithMoe) {
  ModelSpec s = gen_spec();
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 24;
  s.moe_router_topk = 2;
  s.moe_layer_freq = 2;  // layer 0 MoE, layer 1 dense
  s.moe_shared_expert_intermediate_size = 16;
  expect_cached_equals_full(s);
}

// DeepSeek's multi-latent attention (YaRN) with MoE blocks: the cache holds the packed heads.
TEST(Generation, KVCacheLogitsEqualAFullForwardWithMlaAndMoe) {
  ModelSpec s = gen_spec();
  s.add_qkv_bias = false;
  s.use_rope_scaling = false;
  s.num_query_groups = 0;
  s.multi_latent_attention = true;
  s.q_lora_rank = 12;
  s.kv_lora_rank = 10;
  s.qk_head_dim = 6;
  s.qk_pos_emb_head_dim = 4;
  s.v_head_dim = 8;
  s.qk_layernorm = true;
  s.rotary_scaling_factor = 4;
  s.original_max_position_embeddings = 8;
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 24;
  s.moe_router_topk = 2;
  s.moe_layer_freq = 2;
  expect_cached_equals_full(s);
}

// Grok 2's final_logit_softcapping: decoding and the full forward give the capped logits, those of
// the uncapped model passed through cap * tanh(x / cap), all inside (-cap, cap).
TEST(Generation, SoftcappedLogitsInDecodingAndTheFullForward) {
  ModelSpec s = gen_spec();
  s.init_method_std = 0.5;  // logits of several units against a cap of 2
  s.final_logit_softcapping = 2.0;
  expect_cached_equals_full(s);
  ModelSpec plain = s;
  plain.final_logit_softcapping = 0;
  LlamaModel capped(s, cpu::cpu_backend(), Precision::Fp32), uncapped(plain, cpu::cpu_backend(), Precision::Fp32);
  capped.init_weights(3);
  uncapped.init_weights(3);
  const std::vector<int32_t> prompt{4, 9, 1, 30};
  KVCacheDecoder a(capped, 24), b(uncapped, 24);
  std::vector<float> za, zb;
  for (const int32_t t : prompt) {
    za = a.step(t);
    zb = b.step(t);
  }
  float widest = 0;
  for (size_t v = 0; v < za.size(); ++v) {
    EXPECT_NEAR(za[v], 2.0f * std::tanh(zb[v] / 2.0f), 1e-6f) << v;
    EXPECT_LT(std::fabs(za[v]), 2.0f);
    widest = std::max(widest, std::fabs(zb[v]));
  }
  EXPECT_GT(widest, 2.0f);  // the cap did bend some logits
}

static void expect_cached_equals_full(const ModelSpec& spec) {
  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp32);
  model.init_weights(3);
  Rng rng(5);
  std::vector<int32_t> seq(20);
  for (auto& t : seq) t = int32_t(rng.next_u64() % 41);
  KVCacheDecoder dec(model, 24);
  for (size_t n = 1; n <= seq.size(); ++n) {
    const std::vector<float> cached = dec.step(seq[n - 1]);
    LlamaContext ctx;
    model.forward(ctx, seq.data(), nullptr, 1, int64_t(n));  // no targets: inference
    Tensor full = model.last_logits(ctx);
    for (int64_t v = 0; v < 41; ++v) ASSERT_NEAR(cached[v], full.data<float>()[v], 2e-5) << "position " << n;
  }
  EXPECT_THROW(
      {
        for (int i = 0; i < 10; ++i) dec.step(1);
      },
      Error);  // the cache holds 24 positions
}

TEST(Generation, SamplingRespectsTemperatureAndTopP) {
  std::vector<float> logits{0.0f, 3.0f, 1.0f, 2.9f};
  Rng rng(1);
  EXPECT_EQ(sample_token(logits, {0.0, 1.0, 0}, rng), 1);  // greedy
  // top_p small enough to keep only the best token.
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, {1.0, 0.1, 0}, rng), 1);
  // With top_p 1 and temperature 1 the frequencies follow the softmax.
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[sample_token(logits, {1.0, 1.0, 0}, rng)]++;
  const double z = 1 + std::exp(3.0) + std::exp(1.0) + std::exp(2.9);
  EXPECT_NEAR(counts[1] / double(n), std::exp(3.0) / z, 0.015);
  EXPECT_NEAR(counts[0] / double(n), 1 / z, 0.01);
}

TEST(Generation, StopsAtTheStopToken) {
  LlamaModel model(gen_spec(), cpu::cpu_backend(), Precision::Fp32);
  model.init_weights(4);
  KVCacheDecoder dec(model, 24);
  // Greedy decoding is deterministic; whatever it emits first becomes the stop token.
  KVCacheDecoder probe(model, 24);
  auto first = probe.generate({1, 2, 3}, 1, {0.0, 1.0, 0}, -1);
  auto out = dec.generate({1, 2, 3}, 10, {0.0, 1.0, 0}, first[0]);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], first[0]);
}
