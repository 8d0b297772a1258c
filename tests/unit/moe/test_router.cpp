// The router (model/router.h) and the routing row ops: uniform aux loss, the bias sign rule,
// capacity dropping, group-limited choice (both group scores), dispatch+combine identity, and route_backward against
// finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "support/grad_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"
#include "kernels/host_values.h"
#include "model/router.h"

using namespace primus;

namespace {

ModelSpec router_spec(int64_t E, int64_t k) {
  ModelSpec s;
  s.name = "router";
  s.num_layers = 1;
  s.hidden_size = 8;
  s.ffn_hidden_size = 8;
  s.num_attention_heads = 2;
  s.vocab_size = 8;
  s.max_position_embeddings = 8;
  s.num_experts = E;
  s.moe_router_topk = k;
  return s;
}

}  // namespace

TEST(Router, AuxLossEqualsCoefficientUnderUniformRouting) {
  for (const char* type : {"aux_loss", "seq_aux_loss"}) {
    ModelSpec s = router_spec(4, 2);
    s.moe_aux_loss_coeff = 0.01;
    s.moe_router_load_balancing_type = type;
    // Equal logits: every probability is 1/E, and balanced choices (each expert k/E of them).
    std::vector<double> logits(size_t(8 * 4), 0.0);
    Routing r = route(s, logits, {}, 2, 4);
    EXPECT_NEAR(r.aux_loss, 0.01, 1e-15) << type;
    s.moe_router_force_load_balancing = true;  // noise logits: counts near uniform, loss near coeff
    Routing f = route(s, logits, {}, 2, 4);
    EXPECT_GT(f.aux_loss, 0.0);
  }
}

TEST(Router, ZLossIsMeanSquaredLogsumexp) {
  ModelSpec s = router_spec(2, 1);
  s.moe_z_loss_coeff = 0.5;
  Routing r = route(s, {0.0, 0.0, std::log(3.0), 0.0}, {}, 1, 2);
  const double a = std::log(2.0), b = std::log(4.0);
  EXPECT_NEAR(r.z_loss, 0.5 * (a * a + b * b) / 2, 1e-14);
}

TEST(Router, ExpertBiasFollowsTheSignRule) {
  std::vector<double> bias = {0.0, 0.0, 0.5, 0.0};
  update_expert_bias(bias, {5, 1, 3, 3}, 0.1, false);  // mean 3: overloaded down, underloaded up
  EXPECT_DOUBLE_EQ(bias[0], -0.1);
  EXPECT_DOUBLE_EQ(bias[1], 0.1);
  EXPECT_DOUBLE_EQ(bias[2], 0.5);
  EXPECT_DOUBLE_EQ(bias[3], 0.0);
  // The bias changes the choice, not the weights.
  ModelSpec s = router_spec(4, 1);
  s.moe_router_score_function = "sigmoid";
  s.moe_router_enable_expert_bias = true;
  Routing r = route(s, {1.0, 0.9, 0.0, 0.0}, {0.0, 0.2, 0.0, 0.0}, 1, 1);
  EXPECT_EQ(r.expert[0], 1);
  EXPECT_NEAR(r.weight[0], 1 / (1 + std::exp(-0.9)), 1e-15);
}

TEST(Router, CapacityDropsTheLowestProbabilityTokens) {
  ModelSpec s = router_spec(2, 1);
  s.moe_router_pre_softmax = true;  // weights are the softmax probabilities
  s.moe_expert_capacity_factor = 1.0;  // capacity ceil(4 * 1 / 2) = 2
  // Every token prefers expert 0, with probabilities rising with these gaps.
  std::vector<double> gaps = {0.5, 2.0, 0.1, 1.0};
  std::vector<double> logits;
  for (double g : gaps) logits.insert(logits.end(), {g, 0.0});
  Routing r = route(s, logits, {}, 1, 4);
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(std::vector<uint8_t>(r.kept.begin(), r.kept.end()), (std::vector<uint8_t>{0, 1, 0, 1}));
  EXPECT_EQ(r.weight[0], 0.0);
  EXPECT_EQ(r.kept_per_expert[0], 2);
  s.moe_token_drop_policy = "position";
  Routing p = route(s, logits, {}, 1, 4);
  EXPECT_EQ(std::vector<uint8_t>(p.kept.begin(), p.kept.end()), (std::vector<uint8_t>{1, 1, 0, 0}));
}

TEST(Router, PerSequenceCapacityKeepsEachSequencesEarliestTokens) {
  // MaxText's dropping: every token prefers expert 0; a capacity of ceil(4 x 1 / 2) = 2 per
  // sequence keeps the first two tokens of each of the two sequences, where the microbatch-wide
  // capacity (4) keeps the first sequence whole.
  ModelSpec s = router_spec(2, 1);
  s.moe_expert_capacity_factor = 1.0;
  s.moe_token_drop_policy = "position";
  std::vector<double> logits;
  for (int t = 0; t < 8; ++t) logits.insert(logits.end(), {1.0, 0.0});
  Routing whole = route(s, logits, {}, 2, 4);
  EXPECT_EQ(std::vector<uint8_t>(whole.kept.begin(), whole.kept.end()), (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  s.moe_expert_capacity_per_sequence = true;
  s.validate_moe();
  Routing per = route(s, logits, {}, 2, 4);
  EXPECT_EQ(std::vector<uint8_t>(per.kept.begin(), per.kept.end()), (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(per.dropped, 4);
  // The capacity rounds up before the factor and down after it: ceil(5 x 2 / 4) x 1.25 = 3.75 -> 3
  // (the microbatch rule: ceil(5 x 2 / 4 x 1.25) = 4); at least the factor itself.
  EXPECT_EQ(sequence_capacity(5, 2, 4, 1.25), 3);
  EXPECT_EQ(expert_capacity(5, 2, 4, 1.25), 4);
  EXPECT_EQ(sequence_capacity(1, 1, 64, 2.0), 2);
  s.moe_token_drop_policy = "probs";
  EXPECT_THROW(s.validate_moe(), Error);
}

TEST(Router, GroupLimitedChoosesWithinTheBestGroups) {
  ModelSpec s = router_spec(8, 2);
  s.moe_router_num_groups = 4;
  s.moe_router_group_topk = 1;
  // Best single logits are in different groups (0 and 6), but group 1 (experts 2, 3) has the
  // largest top-2 sum.
  std::vector<double> l = {3.0, -5.0, 2.0, 2.0, 0.0, 0.0, 2.9, -5.0};
  Routing r = route(s, l, {}, 1, 1);
  EXPECT_EQ(r.expert[0] / 2, 1);
  EXPECT_EQ(r.expert[1] / 2, 1);
}

// The two rules for a group's score (moe_router_group_score) on one hand-made token: 4 groups of 3
// experts, 2 groups kept, top-4. topk_sum (Megatron's) sums each group's top 4 / 2 = 2 and keeps
// groups 1 (7.9) and 3 (5.9); max (DeepSeek-V2's group_limited_greedy) keeps groups 0 (5.0) and 2
// (4.5). Without groups the top-4 would be experts 0, 6, 3, 4: neither.
TEST(Router, GroupScoreTopkSumAndMaxKeepDifferentGroups) {
  ModelSpec s = router_spec(12, 4);
  s.moe_router_num_groups = 4;
  s.moe_router_group_topk = 2;
  const std::vector<double> l = {5.0, 0.0, 0.1, 4.0, 3.9, 0.2, 4.5, 0.3, 0.0, 3.0, 2.9, 2.8};
  s.validate_moe();
  EXPECT_EQ(s.group_score_terms(), 2);
  EXPECT_EQ(route(s, l, {}, 1, 1).expert, (std::vector<int32_t>{3, 4, 9, 10}));
  s.moe_router_group_score = GroupScore::Max;
  s.validate_moe();
  EXPECT_EQ(s.group_score_terms(), 1);
  EXPECT_EQ(route(s, l, {}, 1, 1).expert, (std::vector<int32_t>{0, 6, 7, 2}));
}

TEST(Router, CenteredBiasUpdateShiftsEveryExpertAlike) {
  // torchtitan's update: the sign steps less their mean; the choice of a biased routing is the same.
  std::vector<double> plain = {0.0, 0.0, 0.5, 0.0}, centered = plain;
  update_expert_bias(plain, {5, 1, 2, 2}, 0.1, false);  // mean 2.5: steps -0.1, +0.1, +0.1, +0.1
  update_expert_bias(centered, {5, 1, 2, 2}, 0.1, true);
  double mean_step = 0;
  for (size_t e = 0; e < 4; ++e) mean_step += (plain[e] - (e == 2 ? 0.5 : 0.0)) / 4;
  EXPECT_NEAR(mean_step, 0.05, 1e-15);
  for (size_t e = 0; e < 4; ++e) EXPECT_NEAR(centered[e], plain[e] - 0.05, 1e-15) << e;
  ModelSpec s = router_spec(4, 2);
  s.moe_router_score_function = "sigmoid";
  s.moe_router_enable_expert_bias = true;
  std::vector<double> logits = test::random_vector(size_t(6 * 4), 5);
  EXPECT_EQ(route(s, logits, plain, 2, 3).expert, route(s, logits, centered, 2, 3).expert);
}

TEST(Router, PreSoftmaxWithNormalisedTopkAndExpertBias) {
  // torchtitan's softmax routing (Qwen3-MoE): softmax over all experts, the choice by score plus
  // bias, the chosen scores renormalised. Without a bias the weights are those of a softmax over
  // the chosen logits (Megatron's default routing).
  ModelSpec s = router_spec(5, 2);
  s.moe_router_pre_softmax = true;
  s.moe_router_norm_topk_prob = true;
  std::vector<double> logits = test::random_vector(size_t(6 * 5), 21);
  ModelSpec after = router_spec(5, 2);
  Routing a = route(s, logits, {}, 2, 3), b = route(after, logits, {}, 2, 3);
  EXPECT_EQ(a.expert, b.expert);
  for (size_t i = 0; i < a.weight.size(); ++i) EXPECT_NEAR(a.weight[i], b.weight[i], 1e-14) << i;
  s.moe_router_enable_expert_bias = true;
  s.validate_moe();
  // Logits (2, 1.9, 0, 0, 0): a bias of 0.5 on expert 2 beats expert 1's softmax score.
  Routing c = route(s, {2.0, 1.9, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.5, 0.0, 0.0}, 1, 1);
  EXPECT_EQ(std::vector<int32_t>(c.expert.begin(), c.expert.end()), (std::vector<int32_t>{2, 0}));  // by score + bias
  const double e0 = std::exp(2.0), e2 = 1.0;
  EXPECT_NEAR(c.weight[0], e2 / (e0 + e2), 1e-14);
  EXPECT_NEAR(c.weight[1], e0 / (e0 + e2), 1e-14);
  // Refused where it means nothing: norm without pre-softmax, bias on softmax after top-k.
  ModelSpec bad = router_spec(5, 2);
  bad.moe_router_norm_topk_prob = true;
  EXPECT_THROW(bad.validate_moe(), Error);
  ModelSpec bias_after = router_spec(5, 2);
  bias_after.moe_router_enable_expert_bias = true;
  EXPECT_THROW(bias_after.validate_moe(), Error);
}

// route_backward against finite differences of sum(dweight * weight) + scale * (aux + z).
static void check_router_grad(ModelSpec s, uint64_t seed) {
  const int64_t B = 2, S = 3, N = B * S, E = s.num_experts, k = s.moe_router_topk;
  std::vector<double> logits = test::random_vector(size_t(N * E), seed);
  std::vector<double> dweight = test::random_vector(size_t(N * k), seed + 1);
  const double scale = 0.7;
  auto objective = [&] {
    Routing r = route(s, logits, {}, B, S);
    return test::dot(r.weight, dweight) + scale * (r.aux_loss + r.z_loss);
  };
  Routing r = route(s, logits, {}, B, S);
  std::vector<double> dl = route_backward(s, r, dweight, scale);
  test::expect_grad_matches(s.moe_router_score_function.c_str(), logits.data(), dl.data(), logits.size(), objective,
                            1e-6, 1e-8);
}

TEST(Router, GradientsMatchFiniteDifferences) {
  ModelSpec a = router_spec(5, 2);  // softmax after top-k, aux + z losses
  a.moe_aux_loss_coeff = 0.1;
  a.moe_z_loss_coeff = 0.01;
  check_router_grad(a, 11);
  ModelSpec b = router_spec(6, 3);  // softmax before top-k, scaled, seq aux, groups
  b.moe_router_pre_softmax = true;
  b.moe_router_topk_scaling_factor = 2.5;
  b.moe_router_load_balancing_type = "seq_aux_loss";
  b.moe_aux_loss_coeff = 0.05;
  b.moe_router_num_groups = 3;
  b.moe_router_group_topk = 2;
  check_router_grad(b, 12);
  ModelSpec c = router_spec(4, 2);  // sigmoid, normalised top-k, aux loss over normalised scores
  c.moe_router_score_function = "sigmoid";
  c.moe_aux_loss_coeff = 0.1;
  check_router_grad(c, 13);
  ModelSpec n = router_spec(6, 3);  // softmax before top-k, the chosen scores renormalised, scaled
  n.moe_router_pre_softmax = true;
  n.moe_router_norm_topk_prob = true;
  n.moe_router_topk_scaling_factor = 1.5;
  check_router_grad(n, 15);
  ModelSpec d = router_spec(4, 1);  // sigmoid, top-1 (the raw score)
  d.moe_router_score_function = "sigmoid";
  check_router_grad(d, 14);
}

// Grok 2's router_logit_softcapping: the router decides from cap * tanh(logits / cap), its z-loss
// too, and the gradient goes through the cap. Logits of scale 3 against a cap of 1.5 (Grok 2's is 30).
TEST(Router, SoftcappedLogitsMatchFiniteDifferences) {
  ModelSpec a = router_spec(5, 2);
  a.router_logit_softcapping = 1.5;
  a.moe_aux_loss_coeff = 0.1;
  a.moe_z_loss_coeff = 0.01;
  const int64_t B = 2, S = 3, N = B * S, E = 5, k = 2;
  std::vector<double> logits = test::random_vector(size_t(N * E), 21, 3.0);
  std::vector<double> dweight = test::random_vector(size_t(N * k), 22);
  auto objective = [&] {
    Routing r = route(a, logits, {}, B, S);
    return test::dot(r.weight, dweight) + 0.7 * (r.aux_loss + r.z_loss);
  };
  Routing r = route(a, logits, {}, B, S);
  std::vector<double> dl = route_backward(a, r, dweight, 0.7);
  test::expect_grad_matches("softcapped router", logits.data(), dl.data(), logits.size(), objective, 1e-6, 1e-8);
  // The capped logits are what the uncapped router sees: the same routing, weights and losses.
  std::vector<double> capped(logits);
  for (double& x : capped) x = 1.5 * std::tanh(x / 1.5);
  ModelSpec plain = a;
  plain.router_logit_softcapping = 0;
  const Routing p = route(plain, capped, {}, B, S);
  EXPECT_EQ(r.expert, p.expert);
  for (size_t i = 0; i < r.weight.size(); ++i) EXPECT_DOUBLE_EQ(r.weight[i], p.weight[i]);
  EXPECT_DOUBLE_EQ(r.z_loss, p.z_loss);
  for (double x : r.logits) EXPECT_LT(std::fabs(x), 1.5);
  // and the uncapped logits route otherwise (some logits reach 3 x 3 = 9).
  const Routing u = route(plain, logits, {}, B, S);
  EXPECT_NE(u.z_loss, r.z_loss);
}

TEST(RowOps, DispatchThenCombineIsTheIdentity) {
  cpu::ReferenceBackend ref;
  for (ops::Backend* be : {static_cast<ops::Backend*>(&cpu::cpu_backend()), static_cast<ops::Backend*>(&ref)}) {
    const DType dt = be == &ref ? DType::BF16 : DType::F32;
    std::vector<double> xv = test::random_vector(5 * 3, 3);
    Tensor x = ops::tensor_from_values(xv, {5, 3}, dt, be->device());
    const std::vector<double> xr = ops::host_values(x);  // as rounded to the dtype
    std::vector<int32_t> perm = {3, 0, 4, 1, 2};
    Tensor p = be->empty({5, 3}, dt);
    be->gather_rows(x, perm, {}, p);
    Tensor back = be->zeros({5, 3}, dt);
    be->scatter_add_rows(p, perm, {}, back);
    EXPECT_EQ(ops::host_values(back), xr) << be->name();
    // Top-2 copies weighted by w and 1 - w combine to the row itself.
    std::vector<int32_t> twice = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4};
    std::vector<double> w = {0.25, 0.75, 0.5, 0.5, 1.0, 0.0, 0.125, 0.875, 0.375, 0.625};
    Tensor p2 = be->empty({10, 3}, dt);
    be->gather_rows(x, twice, {}, p2);
    Tensor comb = be->zeros({5, 3}, dt);
    be->scatter_add_rows(p2, twice, w, comb);
    EXPECT_EQ(ops::host_values(comb), xr) << be->name();
    // row_dots: <x[r], x[r]> of each row.
    std::vector<double> d = be->row_dots(x, perm, p);
    for (size_t i = 0; i < perm.size(); ++i) {
      double e = 0;
      for (int c = 0; c < 3; ++c) e += xr[size_t(perm[i]) * 3 + c] * xr[size_t(perm[i]) * 3 + c];
      EXPECT_NEAR(d[i], e, 1e-12);
    }
  }
}

// Sequence parallelism: two ranks each route half of the tokens with TokenShare (the counts summed
// between them); their aux and z losses add up to the whole microbatch's, and each half's
// d(logits) is the whole's rows (the losses' gradients included).
TEST(Router, SharedTokensGiveTheWholeMicrobatchsLossesAndGradients) {
  ModelSpec s = router_spec(4, 2);
  s.moe_aux_loss_coeff = 0.01;
  s.moe_z_loss_coeff = 0.001;
  const int64_t N = 8, E = 4, k = 2;
  std::vector<double> logits(size_t(N * E));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(1.7 * double(i) + 0.3);
  const Routing whole = route(s, logits, {}, 2, 4);
  std::vector<double> dweight(size_t(N * k));
  for (size_t i = 0; i < dweight.size(); ++i) dweight[i] = std::cos(0.9 * double(i));
  const std::vector<double> dwhole = route_backward(s, whole, dweight, 0.5);
  // The counts of both halves, as the tp all-reduce would sum them.
  std::vector<int64_t> total(size_t(E), 0);
  for (int h = 0; h < 2; ++h) {
    std::vector<double> part(logits.begin() + h * N / 2 * E, logits.begin() + (h + 1) * N / 2 * E);
    for (int32_t e : route(s, part, {}, 1, 4).expert) ++total[size_t(e)];
  }
  double aux = 0, z = 0;
  for (int h = 0; h < 2; ++h) {
    TokenShare share;
    share.ranks = 2;
    share.rank = h;
    share.sum = [&](std::vector<int64_t>& v) { v = total; };
    std::vector<double> part(logits.begin() + h * N / 2 * E, logits.begin() + (h + 1) * N / 2 * E);
    const Routing r = route(s, part, {}, 2, 4, share);
    EXPECT_EQ(r.tokens, N / 2);
    aux += r.aux_loss;
    z += r.z_loss;
    std::vector<double> dw(dweight.begin() + h * N / 2 * k, dweight.begin() + (h + 1) * N / 2 * k);
    const std::vector<double> d = route_backward(s, r, dw, 0.5);
    for (size_t i = 0; i < d.size(); ++i) EXPECT_NEAR(d[i], dwhole[size_t(h * N / 2 * E) + i], 1e-15) << h << " " << i;
  }
  EXPECT_NEAR(aux, whole.aux_loss, 1e-15);
  EXPECT_NEAR(z, whole.z_loss, 1e-15);
}
