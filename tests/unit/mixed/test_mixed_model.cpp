// The model in bf16 mixed precision on the CPU reference backend, beside the same model in fp32 on
// the CPU backend: its layout and initial weights are the fp32 run's, its losses and gradients
// follow them within bf16 rounding, its passes agree with each other exactly (B+W = fused
// backward, recompute = none), the chunked head matches the stored one, and 20 AdamW steps track
// the fp32 run. The GPU suite (tests/gpu) holds the CUDA backend to this same reference.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "support/relative_error.h"

using namespace primus;

namespace {

ModelSpec spec_of(bool tied, bool qkv_bias) {
  ModelSpec s;
  s.name = "test-mixed";
  s.num_layers = 2;
  s.hidden_size = 32;
  s.ffn_hidden_size = 48;
  s.num_attention_heads = 4;
  s.num_query_groups = 2;
  s.vocab_size = 37;
  s.max_position_embeddings = 16;
  s.untie_embeddings_and_output_weights = !tied;
  s.add_qkv_bias = qkv_bias;
  s.init_method_std = 0.1;
  return s;
}

struct Batch {
  int64_t b = 2, s = 8;
  std::vector<int32_t> tokens, targets;
};
Batch make_batch(int64_t vocab, uint64_t seed) {
  Batch x;
  Rng rng(seed);
  x.tokens.resize(x.b * x.s);
  x.targets.resize(x.b * x.s);
  for (auto& t : x.tokens) t = int32_t(rng.next_u64() % vocab);
  for (auto& t : x.targets) t = int32_t(rng.next_u64() % vocab);
  x.targets[3] = -1;  // a masked token
  return x;
}

std::vector<float> host(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

using primus::test::relative_l2_error;

// The model in bf16 on the reference backend and in fp32, with the same initial weights.
struct BothModels {
  cpu::ReferenceBackend be;
  LlamaModel mixed;
  LlamaModel fp32;
  BothModels(const ModelSpec& spec, uint64_t seed)
      : mixed(spec, be, Precision::Bf16), fp32(spec, cpu::cpu_backend(), Precision::Fp32) {
    mixed.init_weights(seed);
    fp32.init_weights(seed);
  }
};

class Mixed : public ::testing::TestWithParam<std::pair<bool, bool>> {};

}  // namespace

TEST_P(Mixed, SameLayoutAndInitialWeightsAsTheFp32Model) {
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  BothModels m(spec, 5);
  LlamaModel& mixed = m.mixed;
  LlamaModel& fp32 = m.fp32;
  ASSERT_EQ(mixed.params().infos().size(), fp32.params().infos().size());
  for (size_t i = 0; i < fp32.params().infos().size(); ++i) {
    EXPECT_EQ(mixed.params().infos()[i].name, fp32.params().infos()[i].name);
    EXPECT_EQ(mixed.params().infos()[i].shape, fp32.params().infos()[i].shape);
    EXPECT_EQ(mixed.params().infos()[i].offset, fp32.params().infos()[i].offset);
  }
  EXPECT_EQ(host(mixed.params().values()), host(fp32.params().values()));
  // The working copy is the master rounded to bf16.
  const bf16* w = mixed.working_weights().data<bf16>();
  const float* v = mixed.params().values().data<float>();
  for (int64_t i = 0; i < mixed.params().numel(); ++i) ASSERT_EQ(w[i].bits, bf16::from_float(v[i]).bits) << i;
}

TEST_P(Mixed, LossAndGradientsFollowTheFp32Model) {
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  BothModels m(spec, 11);
  LlamaModel& mixed = m.mixed;
  LlamaModel& fp32 = m.fp32;
  const Batch x = make_batch(spec.vocab_size, 3);
  LlamaContext mc;
  LlamaContext fc;
  const double lm = mixed.forward(mc, x.tokens.data(), x.targets.data(), x.b, x.s);
  const double lf = fp32.forward(fc, x.tokens.data(), x.targets.data(), x.b, x.s);
  EXPECT_NEAR(lm, lf, 3e-3 * lf) << "bf16 activations move the loss by rounding only";
  mixed.backward(mc, 0.5f);
  fp32.backward(fc, 0.5f);
  const auto gm = host(mixed.params().grads()), gf = host(fp32.params().grads());
  EXPECT_LT(relative_l2_error(gm, gf), 0.03) << "gradients differ beyond bf16 rounding";
  // Every tensor's gradient, not just the whole: a wrong pass would leave one tensor off.
  for (const auto& p : fp32.params().infos()) {
    std::vector<float> a(gm.begin() + p.offset, gm.begin() + p.offset + p.numel),
        b(gf.begin() + p.offset, gf.begin() + p.offset + p.numel);
    double norm = 0;
    for (float v : b) norm += double(v) * v;
    if (norm == 0) continue;  // e.g. a zero-initialised bias grad can be tiny but not exactly 0
    EXPECT_LT(relative_l2_error(a, b), 0.06) << p.name;
  }
}

TEST_P(Mixed, BThenWEqualsTheFusedBackwardAndRecomputeEqualsNone) {
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  const Batch x = make_batch(spec.vocab_size, 4);
  auto grads = [&](Recompute r, bool split) {
    cpu::ReferenceBackend be;
    LlamaOptions o;
    o.recompute = r;
    LlamaModel m(spec, be, Precision::Bf16, o);
    m.init_weights(2);
    LlamaContext c;
    m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
    if (split) {
      m.backward_input(c, 1.0f);
      m.backward_weight(c);
    } else {
      m.backward(c, 1.0f);
    }
    return host(m.params().grads());
  };
  const auto base = grads(Recompute::None, false);
  EXPECT_EQ(grads(Recompute::None, true), base);
  EXPECT_EQ(grads(Recompute::Selective, false), base);
  EXPECT_EQ(grads(Recompute::Full, true), base);
}

TEST_P(Mixed, ChunkedHeadMatchesTheStoredHead) {
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  const Batch x = make_batch(spec.vocab_size, 6);
  auto run = [&](bool chunked, float* loss) {
    cpu::ReferenceBackend be;
    LlamaOptions o;
    if (chunked) {
      o.logits_memory_budget = 0;
      o.vocab_chunk = 10;  // 37 = 10 + 10 + 10 + 7
    }
    LlamaModel m(spec, be, Precision::Bf16, o);
    EXPECT_EQ(m.head_stores_logits(x.b * x.s), !chunked);
    m.init_weights(9);
    LlamaContext c;
    *loss = (float)m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
    m.backward(c, 1.0f);
    return host(m.params().grads());
  };
  float l1 = 0, l2 = 0;
  const auto stored = run(false, &l1), chunked = run(true, &l2);
  EXPECT_NEAR(l1, l2, 1e-6 * l1);
  // Only the fp32 summation order of dhn over chunks differs (then one bf16 rounding).
  EXPECT_LT(relative_l2_error(chunked, stored), 1e-5);
}

TEST_P(Mixed, TwentyAdamWStepsTrackTheFp32Run) {
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  BothModels m(spec, 21);
  LlamaModel& mixed = m.mixed;
  LlamaModel& fp32 = m.fp32;
  const std::vector<ParamSegment> segs = segments_of(fp32.params());
  const AdamWOptions ao{0.9, 0.95, 1e-8, 0.1};
  FlatAdamW flat(ao, segs, mixed.params().numel(), Device::CPU);
  AdamW adam(ao, fp32.params().numel());
  const Batch x = make_batch(spec.vocab_size, 8);
  std::vector<float> lm, lf;
  for (int it = 0; it < 20; ++it) {
    mixed.params().zero_grad();
    fp32.params().zero_grad();
    LlamaContext mc;
    LlamaContext fc;
    lm.push_back((float)mixed.forward(mc, x.tokens.data(), x.targets.data(), x.b, x.s));
    lf.push_back((float)fp32.forward(fc, x.tokens.data(), x.targets.data(), x.b, x.s));
    mixed.backward(mc, 1.0f);
    fp32.backward(fc, 1.0f);
    flat.step(mixed.params().values(), mixed.params().grads(), &mixed.working_weights(), 1e-2);
    adam.step(fp32.params().values().data<float>(), fp32.params().grads().data<float>(), segs, 1e-2);
  }
  EXPECT_LT(lf.back(), 0.7 * lf.front()) << "the fp32 run must learn for the comparison to mean anything";
  for (int it = 0; it < 20; ++it) EXPECT_NEAR(lm[it], lf[it], 0.03 * lf[it]) << "iteration " << it + 1;
  // The working copy follows the master after every fused step.
  const bf16* w = mixed.working_weights().data<bf16>();
  const float* v = mixed.params().values().data<float>();
  for (int64_t i = 0; i < mixed.params().numel(); ++i) ASSERT_EQ(w[i].bits, bf16::from_float(v[i]).bits) << i;
}

INSTANTIATE_TEST_SUITE_P(Variants, Mixed,
                         ::testing::Values(std::make_pair(false, false), std::make_pair(true, false),
                                           std::make_pair(false, true)),
                         [](const auto& info) {
                           return std::string(info.param.first ? "Tied" : "Untied") +
                                  (info.param.second ? "QkvBias" : "");
                         });

TEST(Bf16Model, RejectsBadInput) {
  const ModelSpec spec = spec_of(false, false);
  cpu::ReferenceBackend be;
  LlamaModel m(spec, be, Precision::Bf16);
  m.init_weights(1);
  Batch x = make_batch(spec.vocab_size, 1);
  LlamaContext c;
  x.tokens[2] = int32_t(spec.vocab_size);
  EXPECT_THROW(m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s), Error);
  x.tokens[2] = 0;
  EXPECT_THROW(m.forward(c, x.tokens.data(), x.targets.data(), x.b, spec.max_position_embeddings + 1), Error);
  x.targets[5] = int32_t(spec.vocab_size);
  EXPECT_THROW(m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s), Error);
  // A backend that does not compute in the requested precision is refused by name.
  EXPECT_THROW(LlamaModel(spec, be, Precision::Fp32), Error);
  EXPECT_THROW(LlamaModel(spec, cpu::cpu_backend(), Precision::Bf16), Error);
}
