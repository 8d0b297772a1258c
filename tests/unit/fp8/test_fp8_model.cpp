// FP8 linear layers (model/linears.h): the three GEMMs of a linear against the same GEMMs of
// operands quantized by hand, the layers FP8 covers, delayed scaling's state across steps, and a
// tiny Llama that learns a batch in every recipe about as well as in fp32 (docs/fp8.md).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/linears.h"
#include "model/llama.h"
#include "optim/flat_adamw.h"
#include "support/tiny_spec.h"

using namespace primus;

namespace {

Tensor random(const Shape& s, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(s);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * float(rng.normal());
  return t;
}

// x quantized as the recipe's GEMM wants it, by kernels/fp8.h directly; returns 1 / scale.
float by_hand(const Tensor& x, fp8::Format f, fp8::Granularity g, bool reduce_cols, Tensor& out) {
  out = Tensor::empty(x.shape());
  float scale = 1.0f;
  if (g == fp8::Granularity::Tensor)
    scale = fp8::scale_from_amax(fp8::amax(x.data<float>(), x.numel()), fp8::max_finite(f), false);
  fp8::quantize(x.data<float>(), x.size(0), x.size(1), f, g, reduce_cols, scale, out.data<float>());
  return 1.0f / scale;
}

Tensor gemm(cpu::CpuBackend& be, bool ta, bool tb, float alpha, const Tensor& A, const Tensor& B, int64_t m,
            int64_t n) {
  Tensor D = Tensor::zeros({m, n});
  be.gemm(ta, tb, alpha, A, B, 0.0f, Tensor(), D, Tensor());
  return D;
}

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
}

struct RecipeCase {
  Fp8Recipe recipe;
  fp8::Granularity x, w;
};

class Fp8Linear : public ::testing::TestWithParam<RecipeCase> {};

// Current scaling (tensorwise), blockwise and MXFP8 need no state: each GEMM is the plain GEMM of
// the operands quantized by hand along its reduction dimension, times the scales.
TEST_P(Fp8Linear, GemmsAreTheGemmsOfTheQuantizedOperands) {
  const RecipeCase rc = GetParam();
  cpu::CpuBackend be;
  Fp8Options o;
  o.enabled = true;
  o.recipe = rc.recipe;
  Linears lin(be, DType::F32, o, 1);
  lin.declare(7, "w", 0);
  ASSERT_TRUE(lin.fp8(7));
  const int64_t N = 6, in = 160, out = 140;  // ragged blocks on every dimension
  const Tensor x = random({N, in}, 1, 1.0f), W = random({out, in}, 2, 0.05f), dy = random({N, out}, 3, 1e-3f);
  const fp8::Format e4 = fp8::Format::E4M3, e5 = fp8::Format::E5M2;
  Tensor xq, wq, dq, want, y = Tensor::empty({N, out});
  // forward: reduction over `in` (x's and W's columns)
  float s = by_hand(x, e4, rc.x, true, xq) * by_hand(W, e4, rc.w, true, wq);
  lin.forward(1.0f, x, W, 7, 0.0f, Tensor(), y, Tensor());
  expect_same(y, gemm(be, false, true, s, xq, wq, N, out));
  // input gradient: reduction over `out` (dy's columns, W's rows)
  Tensor dx = Tensor::empty({N, in});
  s = by_hand(dy, e5, rc.x, true, dq) * by_hand(W, e4, rc.w, false, wq);
  lin.input_grad(1.0f, dy, W, 7, 0.0f, Tensor(), dx);
  expect_same(dx, gemm(be, false, false, s, dq, wq, N, in));
  // weight gradient: reduction over the rows (dy's and x's rows)
  Tensor gW = Tensor::zeros({out, in});
  s = by_hand(dy, e5, rc.x, false, dq) * by_hand(x, e4, rc.x, false, xq);
  lin.weight_grad(1.0f, dy, x, 7, gW);
  expect_same(gW, gemm(be, true, false, s, dq, xq, out, in));
  // and it is not the unquantized GEMM
  const Tensor plain = gemm(be, false, true, 1.0f, x, W, N, out);
  double diff = 0;
  for (int64_t i = 0; i < y.numel(); ++i) diff += std::fabs(y.data<float>()[i] - plain.data<float>()[i]);
  EXPECT_GT(diff, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8Linear,
                         ::testing::Values(RecipeCase{Fp8Recipe::Tensorwise, fp8::Granularity::Tensor,
                                                      fp8::Granularity::Tensor},
                                           RecipeCase{Fp8Recipe::Blockwise, fp8::Granularity::Tile1x128,
                                                      fp8::Granularity::Block128},
                                           RecipeCase{Fp8Recipe::Mxfp8, fp8::Granularity::Mx32,
                                                      fp8::Granularity::Mx32}));

// The experts' grouped GEMMs: each problem equals its own linear's GEMM, each with its own scales
// (an expert outside FP8 beside them runs as it is).
TEST_P(Fp8Linear, GroupedGemmsAreEachProblemsOwn) {
  cpu::CpuBackend be;
  Fp8Options o;
  o.enabled = true;
  o.recipe = GetParam().recipe;
  Linears lin(be, DType::F32, o, 2);
  lin.declare(0, "e0", 0);
  lin.declare(1, "e1", 0);
  lin.declare(2, "e2", 1);
  o.enabled = false;
  const int64_t in = 40, out = 24;
  const std::vector<int64_t> rows = {5, 9, 3};
  const std::vector<int> ids = {0, 1, 7};  // weight 7 is not an FP8 linear
  std::vector<Tensor> X, W, DY;
  for (int e = 0; e < 3; ++e) {
    X.push_back(random({rows[size_t(e)], in}, 10 + e, 1.0f + float(e)));
    W.push_back(random({out, in}, 20 + e, 0.05f * float(e + 1)));
    DY.push_back(random({rows[size_t(e)], out}, 30 + e, 1e-3f));
  }
  auto same = [&](Linears::Gemm kind) {
    std::vector<Tensor> got, want;
    for (int e = 0; e < 3; ++e) {
      const bool wg = kind == Linears::Gemm::WeightGrad;
      const Shape s = wg ? Shape{out, in} : kind == Linears::Gemm::Forward ? Shape{rows[size_t(e)], out}
                                                                           : Shape{rows[size_t(e)], in};
      got.push_back(Tensor::zeros(s));
      want.push_back(Tensor::zeros(s));
      if (kind == Linears::Gemm::Forward) lin.forward(1.0f, X[size_t(e)], W[size_t(e)], ids[size_t(e)], 0.0f, Tensor(), want.back(), Tensor());
      if (kind == Linears::Gemm::InputGrad) lin.input_grad(1.0f, DY[size_t(e)], W[size_t(e)], ids[size_t(e)], 0.0f, Tensor(), want.back());
      if (wg) lin.weight_grad(1.0f, DY[size_t(e)], X[size_t(e)], ids[size_t(e)], want.back());
    }
    const std::vector<Tensor>& A = kind == Linears::Gemm::Forward ? X : DY;
    const std::vector<Tensor>& B = kind == Linears::Gemm::WeightGrad ? X : W;
    lin.grouped(kind, A, B, ids, got);
    for (int e = 0; e < 3; ++e) expect_same(got[size_t(e)], want[size_t(e)]);
  };
  same(Linears::Gemm::Forward);
  same(Linears::Gemm::InputGrad);
  same(Linears::Gemm::WeightGrad);
}

TEST(Fp8Linears, FirstAndLastLayersStayInBf16AndWgradCanStayInHighPrecision) {
  cpu::CpuBackend be;
  Fp8Options o;
  o.enabled = true;
  o.recipe = Fp8Recipe::Tensorwise;
  o.bf16_layers_at_start = 1;
  o.bf16_layers_at_end = 2;
  Linears lin(be, DType::F32, o, 5);
  for (int l = 0; l < 5; ++l) lin.declare(l, "w", l);
  EXPECT_EQ(std::vector<bool>({lin.fp8(0), lin.fp8(1), lin.fp8(2), lin.fp8(3), lin.fp8(4)}),
            std::vector<bool>({false, true, true, false, false}));
  // The start-up log's line (Trainer) says what is covered and what is kept out.
  EXPECT_EQ(lin.describe_fp8(),
            "FP8 hybrid (E4M3 forward, E5M2 gradients): tensorwise (current scaling, one scale per tensor); 2 of this "
            "rank's 5 linears in FP8, the first 1 and last 2 decoder layers' kept out, the output layer's kept out; "
            "weight gradients in FP8 too");
  EXPECT_EQ(Linears(be, DType::F32, Fp8Options{}, 5).describe_fp8(), "");
  lin.declare(5, "mtp", 5);  // a multi-token-prediction depth (layer num_layers + k): never kept out
  EXPECT_TRUE(lin.fp8(5));
  o.wgrad = false;
  Linears hp(be, DType::F32, o, 5);
  hp.declare(1, "w", 1);
  const Tensor x = random({4, 8}, 4, 1.0f), dy = random({4, 6}, 5, 1.0f);
  Tensor g = Tensor::zeros({6, 8});
  hp.weight_grad(1.0f, dy, x, 1, g);
  expect_same(g, gemm(be, true, false, 1.0f, dy, x, 6, 8));
}

// quantize_fp8 leaves the amax where ops::Fp8AmaxOut says (the host backends through
// Backend::deliver_amax): returned, folded into an accumulator's element (the larger; a NaN
// sticks) and not returned, or dropped.
TEST(Fp8Linears, QuantizeFoldsItsAmaxWhereAsked) {
  cpu::CpuBackend be;
  Tensor x = random({8, 40}, 3, 2.0f), half = random({8, 40}, 3, 1.0f), nan = random({8, 40}, 4, 1.0f);
  nan.data<float>()[17] = NAN;
  Tensor out = Tensor::empty(x.shape(), DType::F32), acc = Tensor::zeros({3}, DType::F32);
  const float a = be.quantize_fp8(x, fp8::Format::E4M3, fp8::Granularity::Tensor, true, 1.0f, out).amax;
  ASSERT_GT(a, 0.0f);
  const ops::Fp8AmaxOut slot1{acc, 1, true}, slot2{acc, 2, true}, none{Tensor(), 0, false};
  EXPECT_EQ(be.quantize_fp8(x, fp8::Format::E4M3, fp8::Granularity::Tensor, true, 1.0f, out, slot1).amax, 0.0f);
  be.quantize_fp8(half, fp8::Format::E5M2, fp8::Granularity::Mx32, false, 0.0f, out, slot1);  // smaller: kept
  be.quantize_fp8(nan, fp8::Format::E4M3, fp8::Granularity::Tile1x128, true, 0.0f, out, slot2);
  be.quantize_fp8(x, fp8::Format::E4M3, fp8::Granularity::Tensor, true, 1.0f, out, slot2);
  EXPECT_EQ(be.quantize_fp8(x, fp8::Format::E4M3, fp8::Granularity::Block128, true, 0.0f, out, none).amax, 0.0f);
  EXPECT_EQ(acc.data<float>()[0], 0.0f);
  EXPECT_EQ(acc.data<float>()[1], a);
  EXPECT_TRUE(std::isnan(acc.data<float>()[2]));
}

// Delayed scaling: the first step quantizes with scale 1; update_scales turns the recorded amaxes
// into max / amax; the next step's forward uses them.
TEST(Fp8Linears, DelayedScalingUsesTheLastStepsAmax) {
  cpu::CpuBackend be;
  Fp8Options o;
  o.enabled = true;
  o.amax_history_len = 4;
  Linears lin(be, DType::F32, o, 1);
  lin.declare(0, "decoder.layers.0.mlp.linear_fc1.weight", 0);
  const Tensor x = random({4, 8}, 6, 3.0f), W = random({5, 8}, 7, 0.1f);
  Tensor y = Tensor::empty({4, 5}), xq, wq;
  lin.forward(1.0f, x, W, 0, 0.0f, Tensor(), y, Tensor());
  const float ax = fp8::amax(x.data<float>(), x.numel()), aw = fp8::amax(W.data<float>(), W.numel());
  const std::vector<float> amaxes = lin.current_amaxes();
  EXPECT_EQ(amaxes, (std::vector<float>{ax, aw, 0.0f}));
  lin.update_scales(amaxes);  // (one rank: nothing to reduce)
  EXPECT_EQ(lin.current_amaxes(), (std::vector<float>{0, 0, 0}));
  lin.forward(1.0f, x, W, 0, 0.0f, Tensor(), y, Tensor());
  const float sx = 448.0f / ax, sw = 448.0f / aw;
  xq = Tensor::empty(x.shape());
  wq = Tensor::empty(W.shape());
  fp8::quantize(x.data<float>(), 4, 8, fp8::Format::E4M3, fp8::Granularity::Tensor, true, sx, xq.data<float>());
  fp8::quantize(W.data<float>(), 5, 8, fp8::Format::E4M3, fp8::Granularity::Tensor, true, sw, wq.data<float>());
  expect_same(y, gemm(be, false, true, (1.0f / sx) * (1.0f / sw), xq, wq, 4, 5));
  // The state round-trips (a checkpoint's): per linear, histories then the scale, per operand.
  const auto st = lin.state();
  const std::string name = "decoder.layers.0.mlp.linear_fc1.weight.fp8_scaling";
  ASSERT_EQ(st.size(), 1u);
  ASSERT_EQ(st.at(name).size(), 3u * 5u);
  EXPECT_EQ(st.at(name)[4], sx);
  EXPECT_EQ(lin.state_names(), std::vector<std::string>{name});
  Linears other(be, DType::F32, o, 1);
  other.declare(0, "decoder.layers.0.mlp.linear_fc1.weight", 0);
  EXPECT_TRUE(other.load_state(st).empty());
  EXPECT_EQ(other.state(), st);
  // Another history length, or a checkpoint without it: started fresh, and said so.
  o.amax_history_len = 8;
  Linears longer(be, DType::F32, o, 1);
  longer.declare(0, "decoder.layers.0.mlp.linear_fc1.weight", 0);
  EXPECT_EQ(longer.load_state(st), std::vector<std::string>{name});
  EXPECT_EQ(longer.load_state({}), std::vector<std::string>{name});
}

ModelSpec tiny() { return test::tiny_llama_spec("test-fp8", 61, 32, 0.05); }

// 40 AdamW steps on one batch: the loss falls in every recipe and ends near the fp32 run's.
double train(const Fp8Options& o, std::vector<double>* losses = nullptr) {
  cpu::CpuBackend be;
  LlamaOptions lo;
  lo.fp8 = o;
  LlamaModel m(tiny(), be, Precision::Fp32, lo);
  m.init_weights(11);
  FlatAdamW opt({0.9, 0.95, 1e-8, 0.0}, segments_of(m.params()), m.params().numel(), Device::CPU);
  const int64_t B = 2, S = 16;
  std::vector<int32_t> tok(B * S), tgt(B * S);
  Rng rng(5);
  for (auto& t : tok) t = int32_t(rng.next_u64() % 61);
  for (size_t i = 0; i < tok.size(); ++i) tgt[i] = tok[(i + 1) % tok.size()];
  double loss = 0;
  for (int step = 0; step < 40; ++step) {
    m.params().zero_grad();
    LlamaContext ctx;
    loss = m.forward(ctx, tok.data(), tgt.data(), B, S);
    m.backward(ctx, 1.0);
    opt.step(m.params().values(), m.params().grads(), nullptr, 3e-3);
    if (o.enabled && o.recipe == Fp8Recipe::Delayed) m.linears().update_scales(m.linears().current_amaxes());
    if (losses) losses->push_back(loss);
  }
  return loss;
}

// DeepSeek-V3's multi-token-prediction depths run in FP8 whenever FP8 is on, as in Megatron's
// global FP8 context: first_last_layers_bf16 keeps decoder layers out, not the depths.
TEST(Fp8Model, MtpDepthsRunInFp8WhateverTheLastLayersKeepOut) {
  cpu::CpuBackend be;
  ModelSpec spec = tiny();
  spec.mtp_num_layers = 1;
  LlamaOptions lo;
  lo.fp8.enabled = true;
  lo.fp8.bf16_layers_at_start = 1;
  lo.fp8.bf16_layers_at_end = 1;
  LlamaModel m(spec, be, Precision::Fp32, lo);
  int mtp = 0, decoder = 0;
  for (size_t id = 0; id < m.params().infos().size(); ++id) {
    const std::string& name = m.params().infos()[id].name;
    if (!m.linears().fp8(int(id))) continue;
    if (name.starts_with("mtp.layers.0."))
      ++mtp;
    else
      ++decoder;
  }
  EXPECT_EQ(mtp, 5);  // eh_proj, linear_qkv, linear_proj, linear_fc1, linear_fc2
  EXPECT_EQ(decoder, 4 * (spec.num_layers - 2));
}

TEST(Fp8Model, EveryRecipeLearnsABatchLikeFp32) {
  const double ref = train({});
  for (Fp8Recipe r : {Fp8Recipe::Delayed, Fp8Recipe::Tensorwise, Fp8Recipe::Blockwise, Fp8Recipe::Mxfp8}) {
    Fp8Options o;
    o.enabled = true;
    o.recipe = r;
    std::vector<double> losses;
    const double last = train(o, &losses);
    EXPECT_LT(last, 0.5 * losses.front()) << fp8_recipe_name(r);
    EXPECT_NEAR(last, ref, 0.05 * ref + 0.05) << fp8_recipe_name(r) << " against fp32's " << ref;
    EXPECT_NE(last, ref) << fp8_recipe_name(r) << ": FP8 must change the numbers";
  }
}

}  // namespace

// ---- the output layer in FP8 (fp8_output_layer, torchtitan's float8 without "output" in
// filter_fqns): its three GEMMs through the same Linears, against the GEMMs of operands quantized
// by hand and the backend's own cross-entropy kernels on the logits they give.

namespace fp8_head {

const int64_t B = 2, S = 16, V = 61;

ModelSpec spec() {
  ModelSpec s = tiny();
  s.untie_embeddings_and_output_weights = true;
  return s;
}

std::vector<int32_t> tokens(uint64_t seed) {
  std::vector<int32_t> t(B * S);
  Rng rng(seed);
  for (auto& v : t) v = int32_t(rng.next_u64() % uint64_t(V));
  return t;
}

Tensor grad_of(const LlamaModel& m, const std::string& name) {
  const StoredParam& p = m.params().infos()[size_t(m.params().find(name))];
  return m.params().grads().slice(0, p.offset, p.numel).view(p.shape).clone();
}

Tensor value_of(const LlamaModel& m, const std::string& name) {
  const StoredParam& p = m.params().infos()[size_t(m.params().find(name))];
  return m.params().values().slice(0, p.offset, p.numel).view(p.shape).clone();
}

struct Step {
  double loss;
  Tensor hn, x, rstd, targets, g_out, g_norm;
  std::vector<float> amaxes;
};

Step step(cpu::CpuBackend& be, const Fp8Options& o, size_t budget = size_t(512) << 20, int64_t chunk = 16384) {
  LlamaOptions lo;
  lo.fp8 = o;
  lo.logits_memory_budget = budget;
  lo.vocab_chunk = chunk;
  LlamaModel m(spec(), be, Precision::Fp32, lo);
  m.init_weights(3);
  m.params().zero_grad();
  const std::vector<int32_t> tok = tokens(1), tgt = tokens(2);
  LlamaContext ctx;
  Step r;
  r.loss = m.forward(ctx, tok.data(), tgt.data(), B, S);
  r.hn = ctx.head.hn, r.x = ctx.head.x, r.rstd = ctx.head.rstd, r.targets = ctx.targets_dev;
  m.backward(ctx, 1.0);
  r.g_out = grad_of(m, "output_layer.weight");
  r.g_norm = grad_of(m, "decoder.final_layernorm.weight");
  r.amaxes = m.linears().current_amaxes();
  return r;
}

Fp8Options output_fp8(Fp8Recipe r) {
  Fp8Options o;
  o.enabled = true;
  o.recipe = r;
  o.output_layer = true;
  return o;
}

}  // namespace fp8_head

// Tensorwise (current scaling, torchtitan's float8): the loss, the output layer's gradient and the
// final norm's gradient (from the input gradient dhn) are bit for bit those of the hand-quantized
// GEMMs: logits = (hn_q Wq^T) / (s_h s_w); dhn = g (dlogits_q Wq) / (s_d s_w), dlogits along the
// vocabulary; gW = g (dlogits_q^T hn_q) / (s_d s_h) along the tokens; dlogits in E5M2 (hybrid).
TEST(Fp8OutputLayer, ThreeGemmsAreTheGemmsOfTheQuantizedOperands) {
  using namespace fp8_head;
  cpu::CpuBackend be;
  const Fp8Options o = output_fp8(Fp8Recipe::Tensorwise);
  const Step got = step(be, o);
  LlamaOptions lo;
  lo.fp8 = o;
  LlamaModel init(spec(), be, Precision::Fp32, lo);  // the same weights as step()'s
  init.init_weights(3);
  const Tensor W = value_of(init, "output_layer.weight");
  const int64_t N = B * S, C = W.size(1);
  const fp8::Format e4 = fp8::Format::E4M3, e5 = fp8::Format::E5M2;
  Tensor hq, wq, dq;
  // forward and the loss, by the backend's cross-entropy kernels
  float s = by_hand(got.hn, e4, fp8::Granularity::Tensor, true, hq) * by_hand(W, e4, fp8::Granularity::Tensor, true, wq);
  const Tensor z = gemm(be, false, true, s, hq, wq, N, V);
  Tensor mx = Tensor::empty({N}), sm = Tensor::empty({N}), zt = Tensor::empty({N}), lse = Tensor::empty({N});
  be.ce_init(mx, sm, zt);
  be.ce_chunk_forward(z, got.targets, 0, 0.0, mx, sm, zt);
  const double loss = be.ce_finish(mx, sm, zt, got.targets, lse) / double(N);
  EXPECT_EQ(got.loss, loss);
  Tensor d = Tensor::empty({N, V});
  be.ce_chunk_backward(z, lse, got.targets, 0, 0.0, d);
  const float g = 1.0f / float(N);
  // input gradient, seen through the final norm's weight gradient
  s = by_hand(d, e5, fp8::Granularity::Tensor, true, dq) * by_hand(W, e4, fp8::Granularity::Tensor, false, wq);
  const Tensor dhn = gemm(be, false, false, g * s, dq, wq, N, C);
  Tensor gn = Tensor::zeros({C});
  be.rmsnorm_backward_weight(dhn, got.x, got.rstd, gn);
  expect_same(got.g_norm, gn);
  // weight gradient
  s = by_hand(d, e5, fp8::Granularity::Tensor, false, dq) * by_hand(got.hn, e4, fp8::Granularity::Tensor, false, hq);
  expect_same(got.g_out, gemm(be, true, false, g * s, dq, hq, V, C));
  // and the default (Megatron's: the output layer in high precision) is another number
  Fp8Options off = o;
  off.output_layer = false;
  EXPECT_NE(step(be, off).loss, got.loss);
}

// In vocabulary chunks (the head's memory bound) the FP8 output layer computes what it computes
// whole: delayed scaling scales by its history and records the whole tensor's amax, MXFP8's and
// blockwise's blocks stay whole when a chunk is a multiple of the block; current scaling, and
// chunks that would split blocks, keep the whole logits instead.
TEST(Fp8OutputLayer, VocabularyChunksChangeNothing) {
  using namespace fp8_head;
  cpu::CpuBackend be;
  for (Fp8Recipe r : {Fp8Recipe::Delayed, Fp8Recipe::Mxfp8}) {
    const Step whole = step(be, output_fp8(r)), chunked = step(be, output_fp8(r), 0, 32);
    EXPECT_NEAR(whole.loss, chunked.loss, 1e-6) << fp8_recipe_name(r);  // the online log-sum-exp's order
    expect_same(whole.g_out, chunked.g_out);
    expect_same(whole.g_norm, chunked.g_norm);
    EXPECT_EQ(whole.amaxes, chunked.amaxes) << fp8_recipe_name(r);
  }
  LlamaOptions lo;
  lo.logits_memory_budget = 0;
  lo.vocab_chunk = 256;
  EXPECT_FALSE(head_keeps_logits(lo, Precision::Bf16, 1024, 4096));
  lo.fp8 = output_fp8(Fp8Recipe::Blockwise);
  EXPECT_FALSE(head_keeps_logits(lo, Precision::Bf16, 1024, 4096));
  lo.vocab_chunk = 200;
  EXPECT_TRUE(head_keeps_logits(lo, Precision::Bf16, 1024, 4096));
  lo.fp8 = output_fp8(Fp8Recipe::Tensorwise);
  lo.vocab_chunk = 256;
  EXPECT_TRUE(head_keeps_logits(lo, Precision::Bf16, 1024, 4096));
  lo.fp8.output_layer = false;
  EXPECT_FALSE(head_keeps_logits(lo, Precision::Bf16, 1024, 4096));
}

// Delayed scaling keeps the output layer's histories like any linear's, last in the state.
TEST(Fp8OutputLayer, DelayedStateIsTheOutputLayers) {
  using namespace fp8_head;
  cpu::CpuBackend be;
  LlamaOptions lo;
  lo.fp8 = output_fp8(Fp8Recipe::Delayed);
  LlamaModel m(spec(), be, Precision::Fp32, lo);
  const std::vector<std::string> names = m.linears().state_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.back(), "output_layer.weight.fp8_scaling");
  lo.fp8.output_layer = false;
  LlamaModel bf(spec(), be, Precision::Fp32, lo);
  EXPECT_EQ(bf.linears().state_names().size() + 1, names.size());
}
