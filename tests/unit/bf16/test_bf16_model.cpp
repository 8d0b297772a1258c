// The one Llama model in bf16 mixed precision on the CPU bf16 backend: its loss and gradients
// follow the fp32 model and the reference backend's bf16 run, its passes agree exactly (B + W =
// fused backward, recompute = none: the backend is deterministic), the chunked head follows the
// stored one, 20 AdamW steps track the fp32 run, and KV-cache decoding gives the full forward's
// logits. Skipped, with the reason, on a CPU without AVX512-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"
#include "model/generation.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "skip_without_bf16.h"
#include "support/relative_error.h"

using namespace primus;
using primus::test::relative_l2_error;

namespace {

// head_dim 16 with GQA, or head_dim 64.
ModelSpec spec_of(bool wide_heads, bool tied) {
  ModelSpec s;
  s.name = "test-bf16";
  s.num_layers = 2;
  s.hidden_size = wide_heads ? 128 : 64;
  s.ffn_hidden_size = 96;
  s.num_attention_heads = wide_heads ? 2 : 4;
  s.num_query_groups = wide_heads ? 2 : 2;
  s.vocab_size = 61;
  s.max_position_embeddings = 40;
  s.untie_embeddings_and_output_weights = !tied;
  s.add_qkv_bias = !tied;
  s.init_method_std = 0.1;
  return s;
}

struct Batch {
  int64_t b = 2, s = 33;
  std::vector<int32_t> tokens, targets;
};
Batch make_batch(int64_t vocab, uint64_t seed) {
  Batch x;
  Rng rng(seed);
  x.tokens.resize(size_t(x.b * x.s));
  x.targets.resize(size_t(x.b * x.s));
  for (auto& t : x.tokens) t = int32_t(rng.next_u64() % uint64_t(vocab));
  for (auto& t : x.targets) t = int32_t(rng.next_u64() % uint64_t(vocab));
  x.targets[3] = -1;  // masked tokens
  x.targets[40] = -1;
  return x;
}

std::vector<float> host(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

class Bf16Model : public ::testing::TestWithParam<std::pair<bool, bool>> {};

}  // namespace

TEST_P(Bf16Model, LossAndGradientsFollowTheFp32ModelAndTheReference) {
  SKIP_WITHOUT_BF16();
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  cpu::Bf16Backend fast;
  cpu::ReferenceBackend ref;
  LlamaModel a(spec, fast, Precision::Bf16), r(spec, ref, Precision::Bf16), f(spec, cpu::cpu_backend(), Precision::Fp32);
  for (LlamaModel* m : {&a, &r, &f}) m->init_weights(11);
  const Batch x = make_batch(spec.vocab_size, 3);
  LlamaContext ca, cr, cf;
  const double la = a.forward(ca, x.tokens.data(), x.targets.data(), x.b, x.s);
  const double lr = r.forward(cr, x.tokens.data(), x.targets.data(), x.b, x.s);
  const double lf = f.forward(cf, x.tokens.data(), x.targets.data(), x.b, x.s);
  EXPECT_NEAR(la, lf, 3e-3 * lf) << "bf16 activations move the loss by rounding only";
  EXPECT_NEAR(la, lr, 2e-3 * lr);
  a.backward(ca, 0.5);
  r.backward(cr, 0.5);
  f.backward(cf, 0.5);
  const auto ga = host(a.params().grads()), gr = host(r.params().grads()), gf = host(f.params().grads());
  EXPECT_LT(relative_l2_error(ga, gf), 0.03) << "gradients differ from fp32 beyond bf16 rounding";
  EXPECT_LT(relative_l2_error(ga, gr), 0.03) << "gradients differ from the reference backend's";
  for (const auto& p : f.params().infos()) {  // every tensor: a wrong pass would leave one off
    std::vector<float> u(ga.begin() + p.offset, ga.begin() + p.offset + p.numel),
        v(gf.begin() + p.offset, gf.begin() + p.offset + p.numel);
    double norm = 0;
    for (float w : v) norm += double(w) * w;
    if (norm == 0) continue;
    EXPECT_LT(relative_l2_error(u, v), 0.06) << p.name;
  }
}

TEST_P(Bf16Model, BThenWEqualsTheFusedBackwardAndRecomputeEqualsNone) {
  SKIP_WITHOUT_BF16();
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  const Batch x = make_batch(spec.vocab_size, 4);
  auto grads = [&](Recompute rc, bool split) {
    cpu::Bf16Backend be;
    LlamaOptions o;
    o.recompute = rc;
    LlamaModel m(spec, be, Precision::Bf16, o);
    m.init_weights(2);
    LlamaContext c;
    m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
    if (split) {
      m.backward_input(c, 1.0);
      m.backward_weight(c);
    } else {
      m.backward(c, 1.0);
    }
    return host(m.params().grads());
  };
  const auto base = grads(Recompute::None, false);
  EXPECT_EQ(grads(Recompute::None, true), base);
  EXPECT_EQ(grads(Recompute::Selective, false), base);
  EXPECT_EQ(grads(Recompute::Full, true), base);
}

TEST_P(Bf16Model, ChunkedHeadFollowsTheStoredHead) {
  SKIP_WITHOUT_BF16();
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  const Batch x = make_batch(spec.vocab_size, 6);
  auto run = [&](bool chunked, double* loss) {
    cpu::Bf16Backend be;
    LlamaOptions o;
    if (chunked) {
      o.logits_memory_budget = 0;
      o.vocab_chunk = 16;  // 61 = 16 + 16 + 16 + 13
    }
    LlamaModel m(spec, be, Precision::Bf16, o);
    EXPECT_EQ(m.head_stores_logits(x.b * x.s), !chunked);
    m.init_weights(9);
    LlamaContext c;
    *loss = m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
    m.backward(c, 1.0);
    return host(m.params().grads());
  };
  double l1 = 0, l2 = 0;
  const auto stored = run(false, &l1), chunked = run(true, &l2);
  EXPECT_NEAR(l1, l2, 1e-6 * l1);
  EXPECT_LT(relative_l2_error(chunked, stored), 1e-3);
}

TEST_P(Bf16Model, TwentyAdamWStepsTrackTheFp32Run) {
  SKIP_WITHOUT_BF16();
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  cpu::Bf16Backend be;
  LlamaModel mixed(spec, be, Precision::Bf16), fp32(spec, cpu::cpu_backend(), Precision::Fp32);
  mixed.init_weights(21);
  fp32.init_weights(21);
  const std::vector<ParamSegment> segs = segments_of(fp32.params());
  const AdamWOptions ao{0.9, 0.95, 1e-8, 0.1};
  FlatAdamW flat(ao, segs, mixed.params().numel(), Device::CPU);
  AdamW adam(ao, fp32.params().numel());
  Batch x = make_batch(spec.vocab_size, 8);
  const Batch more = make_batch(spec.vocab_size, 9);  // twice the tokens: learnt, not memorised, in 20 steps
  x.b *= 2;
  x.tokens.insert(x.tokens.end(), more.tokens.begin(), more.tokens.end());
  x.targets.insert(x.targets.end(), more.targets.begin(), more.targets.end());
  std::vector<double> lm, lf;
  for (int it = 0; it < 20; ++it) {
    mixed.params().zero_grad();
    fp32.params().zero_grad();
    LlamaContext mc, fc;
    lm.push_back(mixed.forward(mc, x.tokens.data(), x.targets.data(), x.b, x.s));
    lf.push_back(fp32.forward(fc, x.tokens.data(), x.targets.data(), x.b, x.s));
    mixed.backward(mc, 1.0);
    fp32.backward(fc, 1.0);
    flat.step(mixed.params().values(), mixed.params().grads(), &mixed.working_weights(), 3e-3);
    adam.step(fp32.params().values().data<float>(), fp32.params().grads().data<float>(), segs, 3e-3);
  }
  EXPECT_LT(lf.back(), 0.7 * lf.front()) << "the fp32 run must learn for the comparison to mean anything";
  for (int it = 0; it < 20; ++it) EXPECT_NEAR(lm[size_t(it)], lf[size_t(it)], 0.03 * lf[size_t(it)]) << "iteration " << it + 1;
}

TEST_P(Bf16Model, KvCacheDecodingGivesTheFullForwardsLogits) {
  SKIP_WITHOUT_BF16();
  const ModelSpec spec = spec_of(GetParam().first, GetParam().second);
  cpu::Bf16Backend be;
  LlamaModel m(spec, be, Precision::Bf16);
  m.init_weights(3);
  Rng rng(5);
  std::vector<int32_t> seq(20);
  for (auto& t : seq) t = int32_t(rng.next_u64() % uint64_t(spec.vocab_size));
  KVCacheDecoder dec(m, 24);
  for (size_t n = 1; n <= seq.size(); ++n) {
    const std::vector<float> cached = dec.step(seq[n - 1]);
    LlamaContext ctx;
    m.forward(ctx, seq.data(), nullptr, 1, int64_t(n));
    const Tensor full = m.last_logits(ctx);
    std::vector<float> want(full.data<float>(), full.data<float>() + spec.vocab_size);
    // The cache's rows went through the same ops; attention over them runs in another kernel.
    EXPECT_LT(relative_l2_error(cached, want), 2e-2) << "position " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Bf16Model,
                         ::testing::Values(std::make_pair(false, false), std::make_pair(true, true)),
                         [](const auto& info) {
                           return std::string(info.param.first ? "HeadDim64" : "HeadDim16Gqa") +
                                  (info.param.second ? "Tied" : "UntiedQkvBias");
                         });
