// The whole model: gradients against finite differences (double), B+W against the fused
// backward, recompute against none, chunked cross-entropy against stored logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "support/grad_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "model/rope.h"

using namespace primus;

static ModelSpec tiny_spec(bool tied, bool qkv_bias) {
  ModelSpec s;
  s.name = "test-tiny";
  s.num_layers = 2;
  s.hidden_size = 16;
  s.ffn_hidden_size = 24;
  s.num_attention_heads = 4;
  s.num_query_groups = 2;
  s.vocab_size = 11;
  s.max_position_embeddings = 16;
  s.untie_embeddings_and_output_weights = !tied;
  s.add_qkv_bias = qkv_bias;
  s.init_method_std = 0.3;  // large enough that every nonlinearity matters
  return s;
}

struct Batch {
  int64_t b, s;
  std::vector<int32_t> tokens, targets;
};

static Batch make_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed, bool mask_one) {
  Rng rng(seed);
  Batch x{b, s, std::vector<int32_t>(b * s), std::vector<int32_t>(b * s)};
  for (auto& t : x.tokens) t = int32_t(rng.next_u64() % vocab);
  for (auto& t : x.targets) t = int32_t(rng.next_u64() % vocab);
  if (mask_one) x.targets[1] = -1;
  return x;
}

template <typename T>
static std::vector<T> grads_of(LlamaModel& m) {
  const T* g = m.params().grads().template data<T>();
  return std::vector<T>(g, g + m.params().numel());
}

static void check_model_grads(const ModelSpec& spec, LlamaOptions opt) {
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp64, opt);
  m.init_weights(7);
  auto batch = make_batch(2, 6, spec.vocab_size, 3, true);
  auto loss = [&] {
    LlamaContext c;
    return m.forward(c, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  };
  LlamaContext ctx;
  m.params().zero_grad();
  m.forward(ctx, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  m.backward(ctx, 1.0);
  auto analytic = grads_of<double>(m);
  double* values = m.params().values().data<double>();
  for (const auto& info : m.params().infos()) {
    for (int64_t i = 0; i < info.numel; ++i) {
      const double num = primus::test::numeric_grad(values + info.offset + i, loss);
      ASSERT_NEAR(analytic[info.offset + i], num, 1e-8 + 1e-6 * std::fabs(num)) << info.name << "[" << i << "]";
    }
  }
}

TEST(ModelGrads, UntiedWithQkvBiasMatchesFiniteDifferences) { check_model_grads(tiny_spec(false, true), {}); }

TEST(ModelGrads, TiedEmbeddingsMatchFiniteDifferences) { check_model_grads(tiny_spec(true, false), {}); }

TEST(ModelGrads, ChunkedCrossEntropyMatchesFiniteDifferences) {
  LlamaOptions opt;
  opt.logits_memory_budget = 0;  // force vocabulary chunks
  opt.vocab_chunk = 4;           // 11 = 4 + 4 + 3: a ragged last chunk
  check_model_grads(tiny_spec(false, false), opt);
}

// Grok 2's final_logit_softcapping, fused into the cross-entropy: stored logits and vocabulary
// chunks (the cap recomputed with each chunk's logits in the backward).
TEST(ModelGrads, FinalLogitSoftcapMatchesFiniteDifferences) {
  ModelSpec s = tiny_spec(false, false);
  s.final_logit_softcapping = 0.7;
  check_model_grads(s, {});
  LlamaOptions chunks;
  chunks.logits_memory_budget = 0;
  chunks.vocab_chunk = 4;
  check_model_grads(s, chunks);
}

// Megatron's rotary_scaling_factor scales YaRN, which only multi-latent attention uses here (as in
// Megatron, where the GQA models' rope reads rope_scaling_factor with use_rope_scaling): Grok 2's
// rotary_scaling_factor 16 leaves its plain RoPE as it is.
TEST(Model, RotaryScalingFactorLeavesPlainRopeAlone) {
  ModelSpec a = tiny_spec(false, false), b = a;
  b.rotary_scaling_factor = 16;
  LlamaModel ma(a, cpu::cpu_backend(), Precision::Fp64), mb(b, cpu::cpu_backend(), Precision::Fp64);
  ma.init_weights(7);
  mb.init_weights(7);
  const Batch x = make_batch(2, 6, a.vocab_size, 3, false);
  LlamaContext ca, cb;
  EXPECT_EQ(ma.forward(ca, x.tokens.data(), x.targets.data(), x.b, x.s),
            mb.forward(cb, x.tokens.data(), x.targets.data(), x.b, x.s));
}

TEST(ModelGrads, Llama31RopeScalingMatchesFiniteDifferences) {
  auto spec = tiny_spec(false, false);
  spec.use_rope_scaling = true;
  spec.rope_original_max_position_embeddings = 8;
  spec.rotary_base = 500000;
  check_model_grads(spec, {});
}

// Qwen3's per-head RMSNorm of q and k (one head_dim weight for all q heads, one for all k groups).
TEST(ModelGrads, QkLayernormMatchesFiniteDifferences) {
  auto spec = tiny_spec(false, false);
  spec.qk_layernorm = true;
  check_model_grads(spec, {});
}

// Megatron's rotary_percent (MiniMax-M2.5): rotary on the first half of each head (2 of 4
// channels), with the per-head QK-norm MiniMax's YAML sets.
TEST(ModelGrads, PartialRotaryMatchesFiniteDifferences) {
  auto spec = tiny_spec(false, false);
  spec.rotary_percent = 0.5;
  spec.qk_layernorm = true;
  check_model_grads(spec, {});
}

// The rule against a plain reference: in each of the first `heads` heads of hd columns, channels
// i and i + rd/2 (i < rd/2) turn by pos * base^(-2i/rd); the other channels, and the columns past
// the heads, stay; the inverse undoes it. Rows at given positions (packed documents) likewise.
TEST(Rope, PartialRotaryTurnsTheFirstChannelsOfEachHead) {
  const int64_t seq = 5, rows = 2 * seq, heads = 3, hd = 8, rd = 4, stride = heads * hd + 2, P = 16;
  const double base = 10000.0;
  ModelSpec s = tiny_spec(false, false);
  s.kv_channels = hd;
  s.rotary_percent = double(rd) / double(hd);
  s.max_position_embeddings = P;
  s.rotary_base = base;
  ASSERT_EQ(s.rotary_dim(), rd);
  ops::Backend& be = cpu::cpu_backend();
  Tensor cos = Tensor::empty({P, rd / 2}, DType::F64), sin = Tensor::empty({P, rd / 2}, DType::F64);
  rope_tables_of(s, P, cos.data<double>(), sin.data<double>());
  const Rotary rope(be, cos, sin, rd, 1, 0, hd);
  const auto x0 = primus::test::random_vector(size_t(rows * stride), 12);
  const std::vector<int32_t> restart = {0, 1, 2, 0, 1, 2, 3, 4, 5, 6};
  for (const std::vector<int32_t>* positions : {(const std::vector<int32_t>*)nullptr, &restart}) {
    Tensor x = Tensor::empty({rows, stride}, DType::F64);
    std::copy(x0.begin(), x0.end(), x.data<double>());
    const int64_t pos0 = 3;
    rope.apply(x, heads, seq, pos0, false, positions);
    const double* y = x.data<double>();
    for (int64_t r = 0; r < rows; ++r) {
      const double pos = positions ? (*positions)[size_t(r)] : double(pos0 + r % seq);
      for (int64_t c = 0; c < stride; ++c) {
        const int64_t h = c / hd, j = c % hd;
        double want = x0[size_t(r * stride + c)];
        if (h < heads && j < rd) {
          const int64_t i = j % (rd / 2);
          const double a = x0[size_t(r * stride + h * hd + i)], b = x0[size_t(r * stride + h * hd + i + rd / 2)];
          const double t = pos * std::pow(base, -2.0 * double(i) / double(rd));
          want = j < rd / 2 ? a * std::cos(t) - b * std::sin(t) : b * std::cos(t) + a * std::sin(t);
        }
        ASSERT_NEAR(y[r * stride + c], want, 1e-12) << "row " << r << " column " << c;
      }
    }
    rope.apply(x, heads, seq, pos0, true, positions);
    for (int64_t i = 0; i < rows * stride; ++i) ASSERT_NEAR(x.data<double>()[i], x0[size_t(i)], 1e-12);
  }
}

// DeepSeek's multi-latent attention: queries through their latent (with q_layernorm and
// kv_layernorm) or straight, a shared rotary key, a value head narrower or wider than the
// query/key head, YaRN.
static ModelSpec mla_spec(int64_t q_lora_rank, bool norms, double yarn) {
  ModelSpec s = tiny_spec(false, false);
  s.multi_latent_attention = true;
  s.num_query_groups = 0;
  s.q_lora_rank = q_lora_rank;
  s.kv_lora_rank = 6;
  s.qk_head_dim = 3;
  s.qk_pos_emb_head_dim = 4;
  s.v_head_dim = 5;
  s.qk_layernorm = norms;
  s.rotary_scaling_factor = yarn;
  s.original_max_position_embeddings = 4;
  s.mscale = 0.9;
  s.mscale_all_dim = 0.8;
  return s;
}

TEST(ModelGrads, MlaWithLatentQueriesMatchesFiniteDifferences) { check_model_grads(mla_spec(5, true, 1.0), {}); }

TEST(ModelGrads, MlaWithDirectQueriesAndYarnMatchesFiniteDifferences) {
  check_model_grads(mla_spec(0, false, 4.0), {});
}

TEST(ModelGrads, MlaWithWideValuesMatchesFiniteDifferences) {
  ModelSpec s = mla_spec(5, true, 2.0);
  s.v_head_dim = 9;  // wider than qk_head_dim + qk_pos_emb_head_dim: the packed heads pad q and k
  check_model_grads(s, {});
}

// YaRN (DeepSeek's formula): factor 1 is plain rotary; with a factor, the fastest pair keeps its
// frequency, the slowest is divided by the factor, and both tables carry mscale(f, mscale) /
// mscale(f, mscale_all_dim).
TEST(ModelGrads, MlaYarnTablesFollowTheFormula) {
  ModelSpec s = mla_spec(5, true, 1.0);
  s.qk_pos_emb_head_dim = 16;
  s.rotary_base = 10000;
  s.original_max_position_embeddings = 64;
  const int64_t P = 8, half = 8;
  std::vector<double> c(P * half), sn(P * half);
  mla_rope_tables(s, P, c.data(), sn.data());
  for (int64_t i = 0; i < half; ++i)
    EXPECT_NEAR(c[3 * half + i], std::cos(3.0 / std::pow(10000.0, 2.0 * double(i) / 16)), 1e-12) << i;
  s.rotary_scaling_factor = 40;
  mla_rope_tables(s, P, c.data(), sn.data());
  const double m = (0.1 * 0.9 * std::log(40.0) + 1) / (0.1 * 0.8 * std::log(40.0) + 1);
  EXPECT_NEAR(c[0], m, 1e-12);
  EXPECT_NEAR(std::atan2(sn[half], c[half]), 1.0, 1e-12);  // pair 0 at position 1: angle 1
  const double slow = 1.0 / std::pow(10000.0, 14.0 / 16) / 40;
  EXPECT_NEAR(std::atan2(sn[half + 7], c[half + 7]), slow, 1e-12);
  EXPECT_NEAR(std::hypot(sn[half + 7], c[half + 7]), m, 1e-12);
  EXPECT_DOUBLE_EQ(yarn_mscale(1.0, 0.7), 1.0);
}

// Tensor parallel splits MLA's heads (tests/integration/distributed: Distributed.MlaTp2*); heads
// that do not divide over tp are refused by key.
TEST(ModelGrads, MlaRefusesIndivisibleHeadsByName) {
  ModelPartition tp;
  tp.tp_size = 3;  // 4 heads
  try {
    LlamaModel m(mla_spec(5, true, 1.0), cpu::cpu_backend(), Precision::Fp32, {}, tp);
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("num_attention_heads (4)"), std::string::npos) << what;
    EXPECT_NE(what.find("tensor_model_parallel_size (3)"), std::string::npos) << what;
  }
}

// A float model a little larger than the FD one, for the pass-structure comparisons.
static ModelSpec float_spec() {
  ModelSpec s = tiny_spec(false, true);
  s.hidden_size = 32;
  s.ffn_hidden_size = 64;
  s.vocab_size = 97;
  s.max_position_embeddings = 80;
  s.init_method_std = 0.05;
  return s;
}

static std::vector<float> float_grads(const ModelSpec& spec, LlamaOptions opt, bool split, float* loss_out) {
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32, opt);
  m.init_weights(11);
  auto batch = make_batch(3, 70, spec.vocab_size, 5, true);
  LlamaContext ctx;
  m.params().zero_grad();
  *loss_out = (float)m.forward(ctx, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  if (split) {
    m.backward_input(ctx, 0.5f);
    m.backward_weight(ctx);
  } else {
    m.backward(ctx, 0.5f);
  }
  return grads_of<float>(m);
}

// The loss and gradients of `spec` are bit-identical fused, split into B and W, and split under
// selective and under full recompute; returns the loss.
static float expect_split_and_recompute_identical(const ModelSpec& spec) {
  float l0, l1, l2, l3;
  LlamaOptions sel, full;
  sel.recompute = Recompute::Selective;
  full.recompute = Recompute::Full;
  auto fused = float_grads(spec, {}, false, &l0);
  auto none = float_grads(spec, {}, true, &l1);
  auto s = float_grads(spec, sel, true, &l2);
  auto f = float_grads(spec, full, true, &l3);
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(l0, l2);
  EXPECT_EQ(l0, l3);
  EXPECT_EQ(0, std::memcmp(fused.data(), none.data(), none.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(none.data(), s.data(), none.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(none.data(), f.data(), none.size() * sizeof(float)));
  return l0;
}


static void expect_close(const std::vector<float>& a, const std::vector<float>& b, float rtol) {
  ASSERT_EQ(a.size(), b.size());
  double max_abs = 0;
  for (float v : a) max_abs = std::max(max_abs, double(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], rtol * max_abs) << "element " << i;
}

TEST(ModelPasses, InputThenWeightEqualsFusedBackward) {
  float l1, l2;
  auto fused = float_grads(float_spec(), {}, false, &l1);
  auto split = float_grads(float_spec(), {}, true, &l2);
  EXPECT_EQ(l1, l2);
  // The same GEMMs in the same order per tensor: equal bit for bit.
  EXPECT_EQ(0, std::memcmp(fused.data(), split.data(), fused.size() * sizeof(float)));
}

TEST(ModelPasses, ChunkedHeadSplitEqualsFused) {
  LlamaOptions opt;
  opt.logits_memory_budget = 0;
  opt.vocab_chunk = 40;
  float l1, l2, l3;
  auto fused = float_grads(float_spec(), opt, false, &l1);
  auto split = float_grads(float_spec(), opt, true, &l2);
  auto stored = float_grads(float_spec(), {}, false, &l3);
  EXPECT_EQ(0, std::memcmp(fused.data(), split.data(), fused.size() * sizeof(float)));
  EXPECT_NEAR(l1, l3, 1e-5 * l3);
  expect_close(fused, stored, 1e-5f);
}

TEST(ModelPasses, RecomputeGivesIdenticalGradients) {
  float l0, l1, l2;
  LlamaOptions sel, full;
  sel.recompute = Recompute::Selective;
  full.recompute = Recompute::Full;
  auto none = float_grads(float_spec(), {}, true, &l0);
  auto s = float_grads(float_spec(), sel, true, &l1);
  auto f = float_grads(float_spec(), full, true, &l2);
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(l0, l2);
  EXPECT_EQ(0, std::memcmp(none.data(), s.data(), none.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(none.data(), f.data(), none.size() * sizeof(float)));
}

// The QK norm's saves survive selective recompute and are rebuilt by full recompute; B then W
// equals the fused backward.
TEST(ModelPasses, QkLayernormSplitAndRecomputeGiveIdenticalGradients) {
  ModelSpec spec = float_spec();
  spec.qk_layernorm = true;
  expect_split_and_recompute_identical(spec);
}

// MLA's saves survive selective recompute and are rebuilt by full recompute; B then W equals
// the fused backward.
TEST(ModelPasses, MlaSplitAndRecomputeGiveIdenticalGradients) {
  ModelSpec spec = float_spec();
  spec.multi_latent_attention = true;
  spec.num_query_groups = 0;
  spec.q_lora_rank = 12;
  spec.kv_lora_rank = 10;
  spec.qk_head_dim = 6;
  spec.qk_pos_emb_head_dim = 4;
  spec.v_head_dim = 8;
  spec.qk_layernorm = true;
  spec.add_qkv_bias = false;
  expect_split_and_recompute_identical(spec);
}

TEST(Model, InitialLossIsLogVocab) {
  auto spec = float_spec();
  spec.init_method_std = 0.002;  // near-uniform logits
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(1);
  auto batch = make_batch(2, 16, spec.vocab_size, 9, false);
  LlamaContext ctx;
  float loss = (float)m.forward(ctx, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  EXPECT_NEAR(loss, std::log(float(spec.vocab_size)), 0.01);
}

TEST(Model, LearnsARepeatingSequence) {
  // Plain SGD on one fixed batch: the loss must fall far below log(vocab).
  auto spec = float_spec();
  spec.init_method_std = 0.02;
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(2);
  Batch b{2, 32, {}, {}};
  for (int64_t i = 0; i < b.b * b.s; ++i) b.tokens.push_back(int32_t((i * 7) % 13));
  for (int64_t i = 0; i < b.b * b.s; ++i) b.targets.push_back(int32_t(((i + 1) * 7) % 13));
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    LlamaContext ctx;
    m.params().zero_grad();
    last = (float)m.forward(ctx, b.tokens.data(), b.targets.data(), b.b, b.s);
    if (step == 0) first = last;
    m.backward(ctx, 1.0f);
    float* v = m.params().values().data<float>();
    const float* g = m.params().grads().data<float>();
    for (int64_t i = 0; i < m.params().numel(); ++i) v[i] -= 0.5f * g[i];
  }
  EXPECT_NEAR(first, std::log(97.f), 0.1);
  EXPECT_LT(last, 0.5f * first);
}

TEST(Model, RejectsBadInput) {
  auto spec = float_spec();
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(1);
  std::vector<int32_t> tok(100, 1), tgt(100, 1);
  LlamaContext ctx;
  EXPECT_THROW(m.forward(ctx, tok.data(), tgt.data(), 1, 100), Error);  // longer than max positions
  tok[3] = 97;
  EXPECT_THROW(m.forward(ctx, tok.data(), tgt.data(), 1, 10), Error);  // token outside vocab
  tok[3] = 1;
  tgt[2] = 500;
  EXPECT_THROW(m.forward(ctx, tok.data(), tgt.data(), 1, 10), Error);  // target outside vocab
}

TEST(Model, ParameterNamesFollowMegatron) {
  LlamaModel m(tiny_spec(false, true), cpu::cpu_backend(), Precision::Fp32);
  EXPECT_GE(m.params().find("embedding.word_embeddings.weight"), 0);
  EXPECT_GE(m.params().find("decoder.layers.1.self_attention.linear_qkv.bias"), 0);
  EXPECT_GE(m.params().find("decoder.layers.0.mlp.linear_fc1.weight"), 0);
  EXPECT_GE(m.params().find("output_layer.weight"), 0);
  LlamaModel tied(tiny_spec(true, false), cpu::cpu_backend(), Precision::Fp32);
  EXPECT_LT(tied.params().find("output_layer.weight"), 0);
  // qk_layernorm: the names and order of model_parameter_layout (checkpoints, analyze model).
  ModelSpec qk = tiny_spec(false, false);
  qk.qk_layernorm = true;
  LlamaModel withqk(qk, cpu::cpu_backend(), Precision::Fp32);
  const std::vector<ParamInfo> layout = model_parameter_layout(qk);
  ASSERT_EQ(withqk.params().infos().size(), layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(withqk.params().infos()[i].name, layout[i].name);
    EXPECT_EQ(withqk.params().infos()[i].numel, layout[i].numel) << layout[i].name;
  }
  EXPECT_GE(withqk.params().find("decoder.layers.1.self_attention.k_layernorm.weight"), 0);
}

// gpt-oss's attention (docs/model_math.md): a sliding window on alternate layers (Megatron's
// window_attn_skip_freq 2: layer 1 of 2 on the window, layer 2 full) and learned sinks.
static ModelSpec gpt_oss_attention(ModelSpec s, int64_t window, const char* softmax_type) {
  s.window_size = window;
  s.window_attn_skip_freq = 2;
  s.softmax_type = softmax_type;
  return s;
}

TEST(ModelGrads, GptOssAttentionWithLearnedSinksMatchesFiniteDifferences) {
  check_model_grads(gpt_oss_attention(tiny_spec(false, true), 2, "learnable"), {});
}

TEST(ModelGrads, GptOssAttentionWithOffByOneSoftmaxMatchesFiniteDifferences) {
  check_model_grads(gpt_oss_attention(tiny_spec(false, false), 3, "off-by-one"), {});
}

// The sinks' gradient goes from B to W through the part's context; selective and full recompute
// rebuild what the window and the sinks need.
TEST(ModelPasses, GptOssAttentionSplitAndRecomputeGiveIdenticalGradients) {
  const ModelSpec spec = gpt_oss_attention(float_spec(), 20, "learnable");
  const float l0 = expect_split_and_recompute_identical(spec);
  // The window changes the model: full attention on every layer gives another loss.
  float l_full;
  float_grads(gpt_oss_attention(float_spec(), -1, "learnable"), {}, false, &l_full);
  EXPECT_NE(l0, l_full);
}

// Llama 4's attention (chunks of 8 on the RoPE layer with the QK L2-norm, the NoPE layer with the
// queries' temperature) under split B/W passes and selective and full recompute: the saves the
// chunked documents, the norm without weights and the temperature need are rebuilt alike.
TEST(ModelPasses, Llama4AttentionSplitAndRecomputeGiveIdenticalGradients) {
  ModelSpec spec = float_spec();
  spec.no_rope_freq = 2;
  spec.qk_l2_norm = true;
  spec.attention_chunk_size = 8;
  spec.attn_temperature_tuning = true;
  spec.floor_scale = 4;
  expect_split_and_recompute_identical(spec);
}

// Hugging Face's attention temperature (Llama 4's NoPE layers): log1p(floor((t + 1) / floor_scale))
// * attn_scale + 1, 1 until position floor_scale - 1.
TEST(Rope, QueryTemperatureFollowsTheFormula) {
  const QueryTemperature t(cpu::cpu_backend(), 8192, 0.1);
  EXPECT_EQ(t.scale(0), 1.0);
  EXPECT_EQ(t.scale(8190), 1.0);
  EXPECT_DOUBLE_EQ(t.scale(8191), 1.0 + 0.1 * std::log(2.0));
  EXPECT_DOUBLE_EQ(t.scale(3 * 8192 - 1), 1.0 + 0.1 * std::log(4.0));
}
