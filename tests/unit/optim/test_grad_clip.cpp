#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "optim/grad_clip.h"

using namespace primus;

TEST(GradClip, NormAndClip) {
  std::vector<float> g = {3.f, 4.f, 0.f, 12.f};  // norm 13
  EXPECT_DOUBLE_EQ(grad_sq_sum(g.data(), 4), 169.0);
  EXPECT_DOUBLE_EQ(global_grad_norm(g.data(), 4), 13.0);
  double before = clip_grad_norm(g.data(), 4, 6.5);
  EXPECT_DOUBLE_EQ(before, 13.0);
  // Megatron's coefficient: max_norm / (norm + 1e-6).
  const double c = 6.5 / (13.0 + 1e-6);
  EXPECT_FLOAT_EQ(g[0], float(3 * c));
  EXPECT_FLOAT_EQ(g[3], float(12 * c));
  EXPECT_NEAR(global_grad_norm(g.data(), 4), 6.5, 1e-5);
}

TEST(GradClip, BelowThresholdOrDisabledLeavesGradients) {
  std::vector<float> g = {3.f, 4.f};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 10.0), 5.0);
  EXPECT_EQ(g, (std::vector<float>{3.f, 4.f}));
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), 2, 0.0), 5.0);  // max_norm 0: clipping off
  EXPECT_EQ(g, (std::vector<float>{3.f, 4.f}));
}

TEST(GradClip, NonFiniteNormIsReportedNotSpread) {
  std::vector<float> g = {1.f, std::numeric_limits<float>::infinity(), 2.f};
  double n = clip_grad_norm(g.data(), 3, 1.0);
  EXPECT_TRUE(std::isinf(n));
  EXPECT_EQ(g[0], 1.f);  // untouched, so the caller can inspect and skip the step
  EXPECT_EQ(g[2], 2.f);
}

TEST(GradClip, SplitFormSumsShards) {
  // What a distributed clip does: sum the shards' squared norms, then one coefficient for all.
  std::vector<float> g(100001);
  for (size_t i = 0; i < g.size(); ++i) g[i] = float(std::sin(double(i)));
  double whole = global_grad_norm(g.data(), int64_t(g.size()));
  double sq = grad_sq_sum(g.data(), 40000) + grad_sq_sum(g.data() + 40000, int64_t(g.size()) - 40000);
  EXPECT_NEAR(std::sqrt(sq), whole, 1e-9 * whole);
  double ref = 0;
  for (float x : g) ref += double(x) * x;
  EXPECT_NEAR(whole, std::sqrt(ref), 1e-9 * whole);
  double c = clip_coefficient(whole, 1.0);
  scale_grads(g.data(), int64_t(g.size()), c);
  EXPECT_NEAR(global_grad_norm(g.data(), int64_t(g.size())), 1.0, 1e-5);
}
