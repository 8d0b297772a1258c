// LoRA adapters (model/linears.h): their gradients against finite differences in double, on a
// dense model and on an MoE model (routed and shared experts); the frozen tensors get no
// gradient; with B initialised to zero the model computes the base model's loss exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "support/grad_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
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

void check_adapter_grads(bool moe) {
  const ModelSpec spec = lora_spec(moe);
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp64, lora_options(LoraInit::Normal));
  m.init_weights(7);
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
