// AdamW against steps worked out by hand, weight-decay segments, sharding and checkpoint state.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "optim/grad_clip.h"

using namespace primus;

// Two steps on three elements, every number written out.
// lr = 0.1, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.5 (large, to be visible).
// Elements 0 and 1 decay (segment "w"), element 2 does not (segment "b").
//
// step 1: g = (1, -2, 0.5), p = (1, 2, -1)
//   m = 0.1 g = (0.1, -0.2, 0.05);  v = 0.001 g^2 = (0.001, 0.004, 0.00025)
//   m_hat = m / 0.1 = g;  v_hat = v / 0.001 = g^2  =>  m_hat / (sqrt(v_hat) + eps) = sign(g) * |g|/(|g|+1e-8)
//   decay factor 1 - lr * wd = 0.95 on p0, p1
//   p0 = 1 * 0.95 - 0.1 * 1/(1+1e-8)           = 0.85 (+1e-9)
//   p1 = 2 * 0.95 - 0.1 * (-2)/(2+1e-8)        = 2.0  (-5e-10)
//   p2 = -1       - 0.1 * 0.5/(0.5+1e-8)       = -1.1 (+2e-9)
// step 2: g = (0.5, 1, -1)
//   m = 0.9 m + 0.1 g = (0.14, -0.08, -0.055)
//   v = 0.999 v + 0.001 g^2 = (0.001249, 0.004996, 0.00124975)
//   bc1 = 1 - 0.81 = 0.19;  bc2 = 1 - 0.998001 = 0.001999
//   m_hat = (0.736842105, -0.421052632, -0.289473684)
//   v_hat = (0.624812406, 2.499249625, 0.625187594);  sqrt = (0.790450761, 1.580901523, 0.790688051)
//   update = m_hat / sqrt(v_hat) = (0.932180, -0.266337, -0.366104)
//   p0 = 0.85 * 0.95 - 0.1 * 0.932180  = 0.8075 - 0.0932180 = 0.7142820
//   p1 = 2.0 * 0.95 + 0.1 * 0.266337  = 1.9 + 0.0266337    = 1.9266337
//   p2 = -1.1 + 0.1 * 0.366104         = -1.0633896
TEST(AdamW, TwoStepsByHand) {
  AdamW opt({0.9, 0.999, 1e-8, 0.5}, 3);
  std::vector<float> p = {1.f, 2.f, -1.f};
  std::vector<ParamSegment> segs = {{"w", 0, 2, true}, {"b", 2, 1, false}};

  std::vector<float> g1 = {1.f, -2.f, 0.5f};
  opt.step(p.data(), g1.data(), segs, 0.1);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_NEAR(p[0], 0.85, 1e-6);
  EXPECT_NEAR(p[1], 2.0, 1e-6);
  EXPECT_NEAR(p[2], -1.1, 1e-6);
  EXPECT_NEAR(opt.exp_avg()[1], -0.2, 1e-7);
  EXPECT_NEAR(opt.exp_avg_sq()[1], 0.004, 1e-9);

  std::vector<float> g2 = {0.5f, 1.f, -1.f};
  opt.step(p.data(), g2.data(), segs, 0.1);
  EXPECT_EQ(opt.step_count(), 2);
  EXPECT_NEAR(opt.exp_avg()[0], 0.14, 1e-7);
  EXPECT_NEAR(opt.exp_avg()[2], -0.055, 1e-7);
  EXPECT_NEAR(opt.exp_avg_sq()[0], 0.001249, 1e-9);
  EXPECT_NEAR(opt.exp_avg_sq()[1], 0.004996, 1e-9);
  EXPECT_NEAR(p[0], 0.7142820, 2e-6);
  EXPECT_NEAR(p[1], 1.9266337, 2e-6);
  EXPECT_NEAR(p[2], -1.0633896, 2e-6);
}

// The same arithmetic in double, element by element, over many steps and random-ish values:
// guards the vectorised loop against the reference formula.
TEST(AdamW, MatchesReferenceOverManySteps) {
  const int n = 1000, steps = 20;
  AdamWOptions o{0.8, 0.95, 1e-6, 0.1};
  AdamW opt(o, n);
  std::vector<float> p(n), g(n);
  std::vector<double> rp(n), rm(n, 0), rv(n, 0);
  for (int i = 0; i < n; ++i) rp[i] = p[i] = std::sin(0.37 * i);
  std::vector<ParamSegment> segs = {{"a", 0, 600, true}, {"b", 600, 400, false}};
  for (int t = 1; t <= steps; ++t) {
    const double lr = 0.01 * t;
    for (int i = 0; i < n; ++i) g[i] = float(std::cos(0.11 * i * t) * (1 + i % 7));
    opt.step(p.data(), g.data(), segs, lr);
    for (int i = 0; i < n; ++i) {
      if (i < 600) rp[i] *= 1 - lr * o.weight_decay;
      rm[i] = o.beta1 * rm[i] + (1 - o.beta1) * g[i];
      rv[i] = o.beta2 * rv[i] + (1 - o.beta2) * double(g[i]) * g[i];
      double mh = rm[i] / (1 - std::pow(o.beta1, t)), vh = rv[i] / (1 - std::pow(o.beta2, t));
      rp[i] -= lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  for (int i = 0; i < n; ++i) ASSERT_NEAR(p[i], rp[i], 2e-5) << i;
}

TEST(AdamW, NoDecaySegmentsAndGapsAreRespected) {
  // Zero gradient: only weight decay can move a parameter.
  AdamW opt({0.9, 0.999, 1e-8, 0.1}, 6);
  std::vector<float> p = {1, 1, 1, 1, 1, 1}, g(6, 0.f);
  std::vector<ParamSegment> segs = {{"decayed", 0, 2, true}, {"norm", 2, 2, false}};  // 4..5: padding
  opt.step(p.data(), g.data(), segs, 0.5);
  EXPECT_FLOAT_EQ(p[0], 0.95f);  // 1 - 0.5 * 0.1
  EXPECT_FLOAT_EQ(p[1], 0.95f);
  EXPECT_FLOAT_EQ(p[2], 1.f);
  EXPECT_FLOAT_EQ(p[3], 1.f);
  EXPECT_FLOAT_EQ(p[4], 1.f);
  EXPECT_FLOAT_EQ(p[5], 1.f);
}

// decay_norms_and_biases (torchtitan's and MaxText's AdamW): the no-decay segments decay too; the
// padding outside every segment stays; FlatAdamW on the CPU does the same.
TEST(AdamW, DecayNormsAndBiasesDecaysEverySegment) {
  AdamWOptions o{0.9, 0.999, 1e-8, 0.1};
  o.decay_norms_and_biases = true;
  AdamW opt(o, 6);
  std::vector<float> p = {1, 1, 1, 1, 1, 1}, g(6, 0.f);
  std::vector<ParamSegment> segs = {{"decayed", 0, 2, true}, {"norm", 2, 2, false}};
  opt.step(p.data(), g.data(), segs, 0.5);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(p[i], 0.95f) << i;
  EXPECT_FLOAT_EQ(p[4], 1.f);
  FlatAdamW flat(o, segs, 6, Device::CPU);
  std::vector<float> q = {1, 1, 1, 1, 1, 1};
  flat.step(q.data(), g.data(), nullptr, 0.5);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(q[i], 0.95f) << i;
  EXPECT_FLOAT_EQ(q[5], 1.f);
}

// bf16 mixed precision's working copy, written in the update's own pass: every updated parameter
// of every segment rounded as bf16::from_float rounds it (a segment large enough for the
// parallel loop among them), nothing between the segments; and the clipping factor applied in
// that pass too.
TEST(AdamW, FlatAdamWWritesTheWorkingCopyOfEverySegmentOnly) {
  const int64_t n = 70000;
  std::vector<ParamSegment> segs = {{"big", 0, 50000, true},
                                    {"small", 50010, 9990, false},
                                    {"last", 60000, 10000, true}};
  std::vector<float> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    p[size_t(i)] = 0.01f * float(i % 977) - 3.f;
    g[size_t(i)] = 0.001f * float(i % 101) - 0.05f;
  }
  std::vector<bf16> working(static_cast<size_t>(n), bf16{0x1234});
  FlatAdamW flat(AdamWOptions{0.9, 0.95, 1e-8, 0.1}, segs, n, Device::CPU);
  for (int step = 0; step < 2; ++step) flat.step(p.data(), g.data(), working.data(), 1e-2);
  for (int64_t i = 0; i < n; ++i) {
    const bool in = i < 50000 || i >= 50010;
    ASSERT_EQ(working[size_t(i)].bits, in ? bf16::from_float(p[size_t(i)]).bits : uint16_t(0x1234)) << i;
  }
  // The clipping factor in the same pass: the bits of scaling the gradients first, then stepping.
  std::vector<float> p2 = p, g1 = g, g2 = g;
  std::vector<bf16> w2 = working;
  FlatAdamW a1(AdamWOptions{0.9, 0.95, 1e-8, 0.1}, segs, n, Device::CPU), a2(a1.options(), segs, n, Device::CPU);
  scale_grads(g1.data(), n, 0.37);
  a1.step(p.data(), g1.data(), working.data(), 1e-2);
  a2.step(p2.data(), g2.data(), w2.data(), 1e-2, 0.37);
  for (int64_t i = 0; i < n; ++i) {
    if (i >= 50000 && i < 50010) continue;  // between segments: not scaled, not stepped
    ASSERT_EQ(p[size_t(i)], p2[size_t(i)]) << i;
    ASSERT_EQ(g1[size_t(i)], g2[size_t(i)]) << i;
    ASSERT_EQ(working[size_t(i)].bits, w2[size_t(i)].bits) << i;
  }
}

TEST(AdamW, ShardsGiveTheSameResultAsTheWhole) {
  const int n = 10;
  std::vector<ParamSegment> segs = {{"a", 0, 3, true}, {"b", 3, 4, false}, {"c", 7, 3, true}};
  std::vector<float> g(n), whole(n), sharded(n);
  for (int i = 0; i < n; ++i) g[i] = 0.1f * (i - 4), whole[i] = sharded[i] = 1.f + 0.01f * i;
  AdamW full({}, n);
  full.step(whole.data(), g.data(), segs, 0.01);
  // Two ranks own [0, 5) and [5, 10): segment "b" is split between them.
  auto s0 = shard_segments(segs, 0, 5), s1 = shard_segments(segs, 5, 10);
  ASSERT_EQ(s0.size(), 2u);
  EXPECT_EQ(s0[1].name, "b");
  EXPECT_EQ(s0[1].numel, 2);
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s1[0].offset, 0);
  EXPECT_EQ(s1[0].numel, 2);
  EXPECT_EQ(s1[1].offset, 2);
  AdamW r0({}, 5), r1({}, 5);
  r0.step(sharded.data(), g.data(), s0, 0.01);
  r1.step(sharded.data() + 5, g.data() + 5, s1, 0.01);
  for (int i = 0; i < n; ++i) EXPECT_EQ(whole[i], sharded[i]) << i;
}

TEST(AdamW, StateRoundTrip) {
  std::vector<ParamSegment> segs = {{"w", 0, 4, true}};
  std::vector<float> g = {0.3f, -0.1f, 0.2f, 1.f};
  std::vector<float> a = {1, 2, 3, 4}, b;
  AdamW one({}, 4);
  one.step(a.data(), g.data(), segs, 0.01);
  // Resume a fresh optimizer from the first one's state: the next step must agree exactly.
  AdamW two({}, 4);
  two.set_state(one.step_count(), one.exp_avg(), one.exp_avg_sq());
  b = a;
  one.step(a.data(), g.data(), segs, 0.01);
  two.step(b.data(), g.data(), segs, 0.01);
  EXPECT_EQ(two.step_count(), 2);
  EXPECT_EQ(a, b);
}

TEST(AdamW, RejectsBadInput) {
  EXPECT_THROW(AdamW({1.0, 0.999, 1e-8, 0}, 4), Error);
  EXPECT_THROW(AdamW({0.9, -0.1, 1e-8, 0}, 4), Error);
  EXPECT_THROW(AdamW({0.9, 0.999, 0, 0}, 4), Error);
  EXPECT_THROW(AdamW({0.9, 0.999, 1e-8, -1}, 4), Error);
  AdamW opt({}, 4);
  std::vector<float> p(4, 1.f), g(4, 1.f);
  EXPECT_THROW(opt.step(p.data(), g.data(), {{"x", 2, 3, true}}, 0.1), Error);  // past the end
  EXPECT_THROW(opt.step(p.data(), g.data(), {{"x", 0, 3, true}, {"y", 2, 2, true}}, 0.1), Error);
  EXPECT_THROW(opt.step(p.data(), g.data(), {{"x", 0, 4, true}}, std::nan("")), Error);
  // A rejected step changes nothing.
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_EQ(p, std::vector<float>(4, 1.f));
  AdamW empty({}, 0);  // a rank whose shard is empty
  empty.step(nullptr, nullptr, {}, 0.1);
  EXPECT_EQ(empty.step_count(), 1);
}
