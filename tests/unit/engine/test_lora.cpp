// LoRA adapters (model/linears.h): their gradients against finite differences in double, on a
// dense model and on an MoE model (routed and shared experts); the frozen tensors get no
// gradient; with B initialised to zero the model computes the base model's loss exactly (with FP8
// base linears too, whose adapters' gradients follow the fp32 model's). LoRA dropout: one linear's
// three GEMMs against the masked reference computed by hand, the model's gradients against finite
// differences of the same masked loss, and dropout 0 bit for bit today's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "support/grad_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dropout_mask.h"
#include "model/block_part.h"
#include "model/llama.h"
#include "model/param_store.h"
#include "support/tiny_spec.h"

using namespace primus;

namespace {

ModelSpec lora_spec(bool moe) {
  ModelSpec s = test::tiny_llama_spec("lora-tiny", 11, 16, 0.3, {.hidden = 16, .ffn = 24});
  s.untie_embeddings_and_output_weights = true;
  if (moe) {
    s.num_experts = 4;
    s.moe_router_topk = 2;
    s.moe_ffn_hidden_size = 8;
    s.moe_shared_expert_intermediate_size = 8;
  }
  return s;
}

LlamaOptions lora_options(LoraInit b_init) {
  LlamaOptions o;
  o.lora.enabled = true;
  o.lora.dim = 3;
  o.lora.alpha = 6;  // scale 2
  o.lora.b_init = b_init;
  return o;
}

struct Batch {
  int64_t b = 2, s = 6;
  std::vector<int32_t> tokens, targets;
};

Batch make_batch(int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch x;
  x.tokens.resize(size_t(x.b * x.s));
  x.targets.resize(size_t(x.b * x.s));
  for (auto& t : x.tokens) t = int32_t(rng.next_u64() % uint64_t(vocab));
  for (auto& t : x.targets) t = int32_t(rng.next_u64() % uint64_t(vocab));
  x.targets[1] = -1;
  return x;
}

bool is_norm_or_router(const std::string& name) {
  return name.find("layernorm") != std::string::npos || name.find("router") != std::string::npos;
}

void check_adapter_grads(bool moe, double dropout = 0.0,
                         LoraDropoutPosition position = LoraDropoutPosition::Pre) {
  const ModelSpec spec = lora_spec(moe);
  LlamaOptions o = lora_options(LoraInit::Normal);
  o.lora.dropout = dropout;
  o.lora.dropout_position = position;
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp64, o);
  m.init_weights(7);
  if (dropout > 0) m.set_dropout_key(lora_dropout_key(5, 0));  // every forward below: the same masks
  const Batch batch = make_batch(spec.vocab_size, 3);
  auto loss = [&] {
    LlamaContext c;
    return m.forward(c, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  };
  LlamaContext ctx;
  m.params().zero_grad();
  m.forward(ctx, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  m.backward(ctx, 1.0);
  const ParamStore& p = m.params();
  ASSERT_GT(m.first_trainable(), 0);
  int adapters = 0;
  for (size_t t = 0; t < p.infos().size(); ++t) {
    const StoredParam& info = p.infos()[t];
    const double* g = p.grad<double>(int(t));
    if (int(t) < m.first_trainable()) {
      // Frozen: the linears, the embedding and the output layer get no gradient (the norms' and
      // the router's come out of fused kernels and are left unused).
      if (is_norm_or_router(info.name)) continue;
      for (int64_t i = 0; i < info.numel; ++i) ASSERT_EQ(g[i], 0.0) << info.name << "[" << i << "]";
      continue;
    }
    ASSERT_NE(info.name.find(".adapter.linear_"), std::string::npos) << info.name;
    ++adapters;
    double* v = p.value<double>(int(t));
    double norm = 0;
    for (int64_t i = 0; i < info.numel; ++i) {
      norm += g[i] * g[i];
      const double num = primus::test::numeric_grad(v + i, loss);
      ASSERT_NEAR(g[i], num, 1e-8 + 1e-6 * std::fabs(num)) << info.name << "[" << i << "]";
    }
    EXPECT_GT(norm, 0.0) << info.name;
  }
  // qkv, proj, fc1 and fc2 per layer: dense 2 x 4 linears; MoE 2 x (2 + 4 experts x 2 + shared 2).
  EXPECT_EQ(adapters, 2 * (moe ? 2 * (2 + 4 * 2 + 2) : 2 * 4));
}

}  // namespace

TEST(Lora, AdapterGradientsMatchFiniteDifferences) { check_adapter_grads(false); }
TEST(Lora, MoeAdapterGradientsMatchFiniteDifferences) { check_adapter_grads(true); }

// B = 0 (Primus's default): the adapters add exact zeros, so the first step's loss is the base
// model's, bit for bit; the base tensors are the base model's (the adapters follow them).
TEST(Lora, ZeroBIsTheBaseModel) {
  const ModelSpec spec = lora_spec(false);
  LlamaModel base(spec, cpu::cpu_backend(), Precision::Fp32);
  LlamaModel lora(spec, cpu::cpu_backend(), Precision::Fp32, lora_options(LoraInit::Zero));
  base.init_weights(5);
  lora.init_weights(5);
  EXPECT_EQ(lora.trainable_begin() >= base.params().numel(), true);
  for (size_t t = 0; t < base.params().infos().size(); ++t) {
    const StoredParam& b = base.params().infos()[t];
    ASSERT_EQ(lora.params().infos()[t].name, b.name);
    ASSERT_EQ(std::memcmp(base.params().value<float>(int(t)), lora.params().value<float>(int(t)),
                          size_t(b.numel) * sizeof(float)),
              0)
        << b.name;
  }
  const Batch batch = make_batch(spec.vocab_size, 9);
  LlamaContext a, c;
  const double want = base.forward(a, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  const double got = lora.forward(c, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  EXPECT_EQ(got, want);
}

// Only the named linears get adapters; the adapters' shapes and Megatron-Bridge's names.
TEST(Lora, TargetModulesAndShapes) {
  const ModelSpec spec = lora_spec(false);
  LlamaOptions o = lora_options(LoraInit::Zero);
  o.lora.targets[uint8_t(LoraTarget::LinearQkv)] = false;
  o.lora.targets[uint8_t(LoraTarget::LinearFc1)] = false;
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32, o);
  const ParamStore& p = m.params();
  EXPECT_LT(p.find("decoder.layers.0.self_attention.linear_qkv.adapter.linear_in.weight"), 0);
  EXPECT_LT(p.find("decoder.layers.1.mlp.linear_fc1.adapter.linear_out.weight"), 0);
  const int a = p.find("decoder.layers.1.self_attention.linear_proj.adapter.linear_in.weight");
  const int b = p.find("decoder.layers.1.mlp.linear_fc2.adapter.linear_out.weight");
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_EQ(p.infos()[size_t(a)].shape, (Shape{3, 16}));  // [dim, in]: proj's in is heads x head dim
  EXPECT_EQ(p.infos()[size_t(b)].shape, (Shape{16, 3}));  // [out, dim]
  EXPECT_EQ(int(p.infos().size()) - m.first_trainable(), 2 * 2 * 2);
}

// ---- LoRA dropout ----

TEST(LoraDropout, GradientsMatchFiniteDifferencesPre) { check_adapter_grads(false, 0.3, LoraDropoutPosition::Pre); }
TEST(LoraDropout, GradientsMatchFiniteDifferencesPost) { check_adapter_grads(false, 0.3, LoraDropoutPosition::Post); }

namespace {

// One adapted linear, W [out, in] with A [r, in] and B [out, r] (fp64), run through Linears.
struct OneLinear : ParamAccess {
  static constexpr int64_t in = 6, out = 5, r = 2, rows = 7;
  ParamStore store{DType::F64};
  LoraOptions lora;
  std::unique_ptr<Linears> lin;
  int w = -1;
  const std::string name = "decoder.layers.0.mlp.linear_fc1.weight";
  explicit OneLinear(LoraDropoutPosition pos) {
    lora.enabled = true, lora.dim = r, lora.alpha = 3, lora.dropout = 0.4, lora.dropout_position = pos;
    lin = std::make_unique<Linears>(cpu::cpu_backend(), DType::F64, Fp8Options{}, 1, lora);
    w = store.add(name, {out, in}, ParamInit::Normal, true);
    lin->declare(w, name, 0);
    lin->add_adapters(store);
    store.allocate();
    store.init(3, 0.5, 0.5);
    lin->set_params(this);
  }
  Tensor weight(int id) const override { return store.value_tensor(id); }
  Tensor grad(int id) const override { return store.grad_tensor(id); }
  Tensor master(int id) const override { return store.value_tensor(id); }
  const Linears::Adapter& ad() const { return *lin->adapter(w); }
  // The mask the op set's dropout draws for this linear under `key` (kernels/dropout_mask.h).
  std::vector<double> mask(uint64_t key, int64_t n) const {
    const ops::DropoutMask m(lora.dropout, splitmix64(key ^ ad().salt));
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = m.keeps(uint64_t(i)) ? m.scale : 0.0;
    return v;
  }
};

Tensor host_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F64);
  const auto v = primus::test::random_vector(size_t(t.numel()), seed);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

// C [m, n] = op(X) op(Y) on the host (op: transpose when t).
std::vector<double> matmul(const std::vector<double>& X, bool tx, const std::vector<double>& Y, bool ty, int64_t m,
                           int64_t k, int64_t n) {
  std::vector<double> C(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l)
        C[size_t(i * n + j)] += X[size_t(tx ? l * m + i : i * k + l)] * Y[size_t(ty ? j * k + l : l * n + j)];
  return C;
}

std::vector<double> vec(const Tensor& t) { return {t.data<double>(), t.data<double>() + t.numel()}; }
std::vector<double> times(std::vector<double> a, const std::vector<double>& m) {
  for (size_t i = 0; i < a.size(); ++i) a[i] *= m[i];
  return a;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << what << "[" << i << "]";
}

// Megatron-Bridge's semantics (the top of model/linears.h), computed by hand from the mask.
void check_masked_reference(LoraDropoutPosition pos) {
  OneLinear L(pos);
  const int64_t in = OneLinear::in, out = OneLinear::out, r = OneLinear::r, rows = OneLinear::rows;
  const Tensor x = host_tensor({rows, in}, 11), dy = host_tensor({rows, out}, 12);
  const std::vector<double> W = vec(L.store.value_tensor(L.w)), A = vec(L.store.value_tensor(L.ad().a)),
                            B = vec(L.store.value_tensor(L.ad().b));
  // B starts at zero: give it values, so that every term is seen.
  const auto b = primus::test::random_vector(B.size(), 13);
  std::copy(b.begin(), b.end(), L.store.value<double>(L.ad().b));
  const std::vector<double> Bv = b, X = vec(x), DY = vec(dy);
  const double s = 3.0 / 2.0;
  const uint64_t key = 77;
  L.lin->set_dropout_key(key);
  Tensor D = Tensor::zeros({rows, out}, DType::F64), dX = Tensor::zeros({rows, in}, DType::F64);
  Tensor gW = Tensor::zeros({out, in}, DType::F64);
  L.lin->forward(1.0f, x, L.store.value_tensor(L.w), L.w, 0.0f, Tensor(), D, Tensor());
  L.lin->input_grad(1.0f, dy, L.store.value_tensor(L.w), L.w, 0.0f, Tensor(), dX);
  L.lin->weight_grad(1.0f, dy, x, L.w, gW);
  auto scaled = [&](std::vector<double> v) {
    for (double& e : v) e *= s;
    return v;
  };
  auto plus = [](std::vector<double> a, const std::vector<double>& b2) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b2[i];
    return a;
  };
  const std::vector<double> base = matmul(X, false, W, true, rows, in, out);
  const std::vector<double> base_dx = matmul(DY, false, W, false, rows, out, in);
  std::vector<double> want_D, want_dx, want_gA, want_gB;
  if (pos == LoraDropoutPosition::Pre) {
    const std::vector<double> xd = times(X, L.mask(key, rows * in));
    const std::vector<double> low = matmul(xd, false, A, true, rows, in, r);
    want_D = plus(base, scaled(matmul(low, false, Bv, true, rows, r, out)));
    const std::vector<double> dlow = matmul(DY, false, Bv, false, rows, out, r);
    want_dx = plus(base_dx, times(scaled(matmul(dlow, false, A, false, rows, r, in)), L.mask(key, rows * in)));
    want_gA = scaled(matmul(dlow, true, xd, false, r, rows, in));
    want_gB = scaled(matmul(DY, true, low, false, out, rows, r));
  } else {
    const std::vector<double> low = matmul(X, false, A, true, rows, in, r);
    want_D = plus(base, times(scaled(matmul(low, false, Bv, true, rows, r, out)), L.mask(key, rows * out)));
    const std::vector<double> dyd = times(DY, L.mask(key, rows * out));
    const std::vector<double> dlow = matmul(dyd, false, Bv, false, rows, out, r);
    want_dx = plus(base_dx, scaled(matmul(dlow, false, A, false, rows, r, in)));
    want_gA = scaled(matmul(dlow, true, X, false, r, rows, in));
    want_gB = scaled(matmul(dyd, true, low, false, out, rows, r));
  }
  expect_near(vec(D), want_D, "forward");
  expect_near(vec(dX), want_dx, "input gradient");
  expect_near(vec(L.store.grad_tensor(L.ad().a)), want_gA, "gA");
  expect_near(vec(L.store.grad_tensor(L.ad().b)), want_gB, "gB");
  for (double g : vec(gW)) ASSERT_EQ(g, 0.0);  // frozen
  // Some elements were dropped and some kept.
  const std::vector<double> m = L.mask(key, rows * in);
  EXPECT_GT(std::count(m.begin(), m.end(), 0.0), 0);
  EXPECT_LT(std::count(m.begin(), m.end(), 0.0), int64_t(m.size()));
}

// The loss and every gradient of one step on the fp32 dense model.
struct Step {
  double loss = 0;
  std::vector<float> grads;
};
Step lora_step(double dropout, std::optional<uint64_t> key) {
  const ModelSpec spec = lora_spec(false);
  LlamaOptions o = lora_options(LoraInit::Normal);
  o.lora.dropout = dropout;
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32, o);
  m.init_weights(4);
  m.set_dropout_key(key);
  const Batch batch = make_batch(spec.vocab_size, 6);
  LlamaContext c;
  Step s;
  m.params().zero_grad();
  s.loss = m.forward(c, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
  m.backward(c, 1.0);
  const float* g = m.params().grads().data<float>();
  s.grads.assign(g, g + m.params().numel());
  return s;
}

}  // namespace

TEST(LoraDropout, PreIsTheMaskedReference) { check_masked_reference(LoraDropoutPosition::Pre); }
TEST(LoraDropout, PostIsTheMaskedReference) { check_masked_reference(LoraDropoutPosition::Post); }

// Dropout 0 runs today's code bit for bit; p > 0 without a key (evaluation) is no dropout; with a
// key it changes the loss, and the same key gives the same bits.
TEST(LoraDropout, ZeroAndEvaluationAreTodaysBitsAndTheKeyDecides) {
  const Step today = lora_step(0.0, std::nullopt);
  const Step zero = lora_step(0.0, lora_dropout_key(1, 0));
  const Step eval = lora_step(0.2, std::nullopt);
  EXPECT_EQ(zero.loss, today.loss);
  EXPECT_EQ(zero.grads, today.grads);
  EXPECT_EQ(eval.loss, today.loss);
  EXPECT_EQ(eval.grads, today.grads);
  const Step a = lora_step(0.2, lora_dropout_key(1, 0)), a2 = lora_step(0.2, lora_dropout_key(1, 0));
  const Step b = lora_step(0.2, lora_dropout_key(1, 4));
  EXPECT_NE(a.loss, today.loss);
  EXPECT_EQ(a.loss, a2.loss);
  EXPECT_EQ(a.grads, a2.grads);
  EXPECT_NE(a.loss, b.loss);
}

// The op: kept elements are x / (1 - p) exactly, about p of them dropped, the same mask in every
// dtype, in place too.
TEST(LoraDropout, TheOpKeepsOneMinusPAndScales) {
  ops::Backend& be = cpu::cpu_backend();
  const int64_t n = 20000;
  const double p = 0.25;
  Tensor x = Tensor::empty({100, n / 100}, DType::F32), x64 = Tensor::empty({100, n / 100}, DType::F64);
  Tensor x16 = Tensor::empty({100, n / 100}, DType::BF16);
  for (int64_t i = 0; i < n; ++i) {
    x.data<float>()[i] = float(i % 17) - 8.5f;
    x64.data<double>()[i] = double(i % 17) - 8.5;
    x16.data<bf16>()[i] = bf16::from_float(float(i % 17) - 8.5f);
  }
  Tensor y = Tensor::empty(x.shape(), DType::F32), y64 = Tensor::empty(x.shape(), DType::F64);
  Tensor y16 = x16.clone();
  be.dropout(x, y, p, 99);
  be.dropout(x64, y64, p, 99);
  be.dropout(y16, y16, p, 99);  // in place
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = y.data<float>()[i];
    if (v == 0.0f) {
      ++dropped;
      EXPECT_EQ(y64.data<double>()[i], 0.0);
      EXPECT_EQ(y16.data<bf16>()[i].to_float(), 0.0f);
      continue;
    }
    ASSERT_EQ(v, x.data<float>()[i] * float(1.0 / (1.0 - p)));
    ASSERT_EQ(y64.data<double>()[i], x64.data<double>()[i] * (1.0 / (1.0 - p)));
    ASSERT_EQ(y16.data<bf16>()[i].to_float(), bf16::from_float(x16.data<bf16>()[i].to_float() * float(1.0 / (1.0 - p))).to_float());
  }
  EXPECT_NEAR(double(dropped) / double(n), p, 0.01);
  Tensor other = Tensor::empty(x.shape(), DType::F32);
  be.dropout(x, other, p, 100);
  EXPECT_NE(std::memcmp(other.data<float>(), y.data<float>(), size_t(n) * 4), 0);
}

// LoRA beside FP8 linears: the base's GEMMs in FP8 by the recipe, the adapters' in the activation
// dtype. B = 0: the loss is the FP8 base model's bit for bit. Normal-initialised B: the frozen base
// gets no gradient, the adapters do, and plain gradient steps on the adapters alone bring one
// batch's loss down. (Against the fp32 model the gradients of a model this small differ by 10-40%
// in FP8 even without LoRA, so they are not compared element by element.)
namespace {

void check_fp8_base_beside_adapters(bool moe) {
  const ModelSpec spec = lora_spec(moe);
  const Batch batch = make_batch(spec.vocab_size, 9);
  for (Fp8Recipe recipe : {Fp8Recipe::Tensorwise, Fp8Recipe::Delayed, Fp8Recipe::Blockwise}) {
    SCOPED_TRACE(fp8_recipe_name(recipe));
    LlamaOptions fp8_base;
    fp8_base.fp8.enabled = true;
    fp8_base.fp8.recipe = recipe;
    LlamaOptions fp8_lora = lora_options(LoraInit::Zero);
    fp8_lora.fp8 = fp8_base.fp8;
    LlamaModel base(spec, cpu::cpu_backend(), Precision::Fp32, fp8_base);
    LlamaModel lora(spec, cpu::cpu_backend(), Precision::Fp32, fp8_lora);
    base.init_weights(5);
    lora.init_weights(5);
    LlamaContext a, c;
    const double want = base.forward(a, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
    const double got = lora.forward(c, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
    EXPECT_EQ(got, want);
    LlamaModel exact(spec, cpu::cpu_backend(), Precision::Fp32);
    exact.init_weights(5);
    LlamaContext e;
    EXPECT_NE(exact.forward(e, batch.tokens.data(), batch.targets.data(), batch.b, batch.s), want) << "FP8 applied";

    LlamaOptions o = lora_options(LoraInit::Normal);
    o.fp8 = fp8_base.fp8;
    LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32, o);
    m.init_weights(7);
    ParamStore& p = m.params();
    double first = 0, last = 0;
    for (int step = 0; step < 8; ++step) {
      LlamaContext ctx;
      p.zero_grad();
      last = m.forward(ctx, batch.tokens.data(), batch.targets.data(), batch.b, batch.s);
      if (step == 0) first = last;
      m.backward(ctx, 1.0);
      for (size_t t = 0; t < p.infos().size(); ++t) {
        const StoredParam& info = p.infos()[t];
        const float* g = p.grad<float>(int(t));
        double norm = 0;
        for (int64_t i = 0; i < info.numel; ++i) norm += double(g[i]) * double(g[i]);
        if (int(t) < m.first_trainable()) {
          if (!is_norm_or_router(info.name)) ASSERT_EQ(norm, 0.0) << info.name << " is frozen";
          continue;
        }
        ASSERT_GT(norm, 0.0) << info.name;
        float* v = p.value<float>(int(t));
        for (int64_t i = 0; i < info.numel; ++i) v[i] -= 0.5f * g[i];
      }
      if (recipe == Fp8Recipe::Delayed) m.linears().update_scales(m.linears().current_amaxes());
    }
    EXPECT_LT(last, 0.9 * first) << "the adapters learn the batch with FP8 base linears";
  }
}

}  // namespace

TEST(Lora, Fp8BaseLinearsBesideTheAdapters) { check_fp8_base_beside_adapters(false); }
// The experts' FP8 grouped GEMMs beside their adapters (routed and shared experts).
TEST(Lora, Fp8MoeBaseLinearsBesideTheAdapters) { check_fp8_base_beside_adapters(true); }
