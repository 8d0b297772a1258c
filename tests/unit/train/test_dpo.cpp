// DPO's gradient (train/dpo.h): the pair step's backward (each side's mean-loss backward scaled by
// dL/dpi x -count) against central finite differences of the pair's loss, in fp64 on a tiny model,
// with label smoothing and a reference that puts the margin away from zero; and the scalar loss's
// own derivatives.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/grad_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "support/tiny_spec.h"
#include "train/dpo.h"

using namespace primus;

namespace {

constexpr int64_t kSeq = 10;

// One side: a prompt of 4 tokens (no loss on them) and a response; the two sides share the prompt.
data::Microbatch side(const std::vector<int32_t>& response) {
  data::Microbatch mb;
  mb.tokens = {1, 5, 3, 2};
  for (int32_t t : response) mb.tokens.push_back(t);
  mb.tokens.resize(kSeq + 1, 0);
  mb.targets.assign(mb.tokens.begin() + 1, mb.tokens.end());
  mb.tokens.pop_back();
  for (int i = 0; i < 3; ++i) mb.targets[size_t(i)] = -1;
  mb.targets.back() = -1;
  return mb;
}

TEST(DpoLoss, DerivativesOfTheScalarLoss) {
  const train::DpoLossOptions o{0.3, 0.1};
  const double ref_c = -7.0, ref_r = -6.5;
  for (double pc : {-9.0, -6.0}) {
    for (double pr : {-8.0, -5.0}) {
      const train::DpoPairLoss p = train::dpo_pair_loss(o, pc, pr, ref_c, ref_r);
      double x = pc;
      const double dc = test::numeric_grad(&x, [&] { return train::dpo_pair_loss(o, x, pr, ref_c, ref_r).loss; });
      double y = pr;
      const double dr = test::numeric_grad(&y, [&] { return train::dpo_pair_loss(o, pc, y, ref_c, ref_r).loss; });
      EXPECT_NEAR(p.dpi_chosen, dc, 1e-8);
      EXPECT_NEAR(p.dpi_rejected, dr, 1e-8);
      EXPECT_NEAR(p.reward_chosen, o.beta * (pc - ref_c), 1e-12);
      EXPECT_NEAR(p.reward_rejected, o.beta * (pr - ref_r), 1e-12);
    }
  }
}

TEST(DpoLoss, PairGradientsMatchFiniteDifferences) {
  ModelSpec spec = test::tiny_llama_spec("dpo-tiny", 13, kSeq, 0.3, {.hidden = 16, .ffn = 24});
  spec.untie_embeddings_and_output_weights = true;
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp64);
  m.init_weights(11);
  const data::Microbatch chosen = side({7, 8, 9, 4, 6}), rejected = side({7, 8, 10, 11, 12, 6});
  const train::DpoLossOptions o{0.5, 0.1};
  const double ref_c = -14.0, ref_r = -15.5;  // margin z away from 0
  auto loss = [&] {
    LlamaContext c, r;
    const double pc = train::sequence_logp(m, c, chosen, kSeq), pr = train::sequence_logp(m, r, rejected, kSeq);
    return train::dpo_pair_loss(o, pc, pr, ref_c, ref_r).loss;
  };
  m.params().zero_grad();
  const double weight = 0.75;  // the pair's share of the step
  train::dpo_pair_step(m, chosen, rejected, kSeq, ref_c, ref_r, o, weight);
  const ParamStore& p = m.params();
  int checked = 0;
  for (size_t t = 0; t < p.infos().size(); ++t) {
    const StoredParam& info = p.infos()[t];
    const double* g = p.grad<double>(int(t));
    double* v = p.value<double>(int(t));
    double norm = 0;
    for (int64_t i = 0; i < info.numel; ++i) norm += g[i] * g[i];
    EXPECT_GT(norm, 0.0) << info.name;
    // A few elements of each tensor, spread over it.
    for (int64_t i = 0; i < info.numel; i += std::max<int64_t>(1, info.numel / 5)) {
      const double num = weight * test::numeric_grad(v + i, loss);
      ASSERT_NEAR(g[i], num, 1e-9 + 1e-6 * std::fabs(num)) << info.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

}  // namespace
