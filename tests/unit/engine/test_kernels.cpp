// Each kernel's backward passes against central finite differences in double precision, with
// the objective L = sum(y * R) for a fixed random R (so dL/dy = R).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "support/grad_check.h"
#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"

using namespace primus;
using namespace primus::cpu;
using primus::test::dot;
using primus::test::expect_grad_matches;
using primus::test::random_vector;

TEST(Kernels, LinearBackwardInputAndWeight) {
  const int64_t n = 3, in = 4, out = 5;
  auto x = random_vector(n * in, 1), w = random_vector(out * in, 2), b = random_vector(out, 3);
  auto R = random_vector(n * out, 4);
  auto loss = [&] {
    std::vector<double> y(n * out);
    linear_forward(x.data(), w.data(), b.data(), y.data(), n, in, out);
    return dot(y, R);
  };
  std::vector<double> dx(n * in), dw(out * in, 0.0), db(out, 0.0);
  linear_backward_input(R.data(), w.data(), dx.data(), n, in, out);
  linear_backward_weight(R.data(), x.data(), dw.data(), db.data(), n, in, out);
  expect_grad_matches("dx", x.data(), dx.data(), x.size(), loss);
  expect_grad_matches("dw", w.data(), dw.data(), w.size(), loss);
  expect_grad_matches("db", b.data(), db.data(), b.size(), loss);
}

TEST(Kernels, RMSNormBackward) {
  const int64_t n = 4, c = 7;
  auto x = random_vector(n * c, 5), w = random_vector(c, 6), R = random_vector(n * c, 7);
  std::vector<double> y(n * c), rstd(n);
  auto loss = [&] {
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), n, c, 1e-5);
    return dot(y, R);
  };
  loss();
  std::vector<double> dx(n * c), dw(c, 0.0);
  rmsnorm_backward_input(R.data(), x.data(), w.data(), rstd.data(), dx.data(), n, c, false);
  rmsnorm_backward_weight(R.data(), x.data(), rstd.data(), dw.data(), n, c);
  expect_grad_matches("dx", x.data(), dx.data(), x.size(), loss);
  expect_grad_matches("dw", w.data(), dw.data(), w.size(), loss);
}

TEST(Kernels, SwiGLUBackward) {
  const int64_t n = 3, f = 5;
  auto gu = random_vector(n * 2 * f, 8), R = random_vector(n * f, 9);
  auto loss = [&] {
    std::vector<double> a(n * f);
    swiglu_forward(gu.data(), a.data(), n, f);
    return dot(a, R);
  };
  std::vector<double> dgu(n * 2 * f);
  swiglu_backward(R.data(), gu.data(), dgu.data(), n, f);
  expect_grad_matches("dgate_up", gu.data(), dgu.data(), gu.size(), loss);
}

// gpt-oss's GLU (Glu: alpha 1.702, offset 1, clamp 0.8): values on both sides of the clamps (none
// within the differences' step of them), the forward against its formula and the backward against
// finite differences (a clamped value's gradient is 0).
TEST(Kernels, ClampedGluMatchesItsFormulaAndFiniteDifferences) {
  const int64_t n = 3, f = 6;
  const Glu glu{1.702, 1.0, 0.8};
  auto gu = random_vector(n * 2 * f, 8), R = random_vector(n * f, 9);
  for (double& v : gu)
    if (std::fabs(std::fabs(v) - 0.8) < 1e-3) v += 0.01;
  int clamped = 0;
  for (double v : gu) clamped += std::fabs(v) > 0.8;
  ASSERT_GT(clamped, 4);
  std::vector<double> a(n * f);
  swiglu_forward(gu.data(), a.data(), n, f, glu);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      const double g = std::min(gu[size_t(i * 2 * f + j)], 0.8), u = std::clamp(gu[size_t(i * 2 * f + f + j)], -0.8, 0.8);
      EXPECT_NEAR(a[size_t(i * f + j)], g / (1 + std::exp(-1.702 * g)) * (u + 1), 1e-14);
    }
  auto loss = [&] {
    std::vector<double> y(n * f);
    swiglu_forward(gu.data(), y.data(), n, f, glu);
    return dot(y, R);
  };
  std::vector<double> dgu(n * 2 * f);
  swiglu_backward(R.data(), gu.data(), dgu.data(), n, f, glu);
  expect_grad_matches("dgate_up", gu.data(), dgu.data(), gu.size(), loss);
}

TEST(Kernels, RopeBackwardIsTheTranspose) {
  const int64_t seq = 5, rows = 2 * seq, heads = 3, hd = 8, stride = heads * hd + 2;
  std::vector<double> cs(seq * hd / 2), sn(seq * hd / 2);
  rope_tables(cs.data(), sn.data(), seq, hd, 10000.0, RopeScaling{});
  auto x = random_vector(rows * stride, 10), R = random_vector(rows * stride, 11);
  auto loss = [&] {
    auto y = x;
    rope_apply(y.data(), rows, stride, heads, hd, seq, 0, cs.data(), sn.data(), false);
    return dot(y, R);
  };
  auto dx = R;
  rope_apply(dx.data(), rows, stride, heads, hd, seq, 0, cs.data(), sn.data(), true);
  expect_grad_matches("dx", x.data(), dx.data(), x.size(), loss);
  // Columns past the rotated heads are untouched.
  auto y = x;
  rope_apply(y.data(), rows, stride, heads, hd, seq, 0, cs.data(), sn.data(), false);
  EXPECT_EQ(y[stride - 1], x[stride - 1]);
  // Position 0 is the identity; rotation preserves each pair's norm.
  EXPECT_DOUBLE_EQ(y[0], x[0]);
  const int64_t r = 3;  // position 3
  EXPECT_NEAR(y[r * stride] * y[r * stride] + y[r * stride + hd / 2] * y[r * stride + hd / 2],
              x[r * stride] * x[r * stride] + x[r * stride + hd / 2] * x[r * stride + hd / 2], 1e-12);
}

TEST(Kernels, Llama31RopeScalingMatchesReference) {
  // Hugging Face's llama3 rule, written out for one high, one blended and one low frequency.
  const int64_t hd = 128, half = hd / 2;
  std::vector<double> cs(2 * half), sn(2 * half);
  RopeScaling sc{8.0, 1.0, 4.0, 8192};
  rope_tables(cs.data(), sn.data(), 2, hd, 500000.0, sc);
  for (int64_t i : {0L, 40L, 50L, 63L}) {
    double f = 1.0 / std::pow(500000.0, 2.0 * i / hd);
    const double wavelen = 2 * M_PI / f;
    double expect;
    if (wavelen < 8192.0 / 4) expect = f;
    else if (wavelen > 8192.0) expect = f / 8;
    else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      expect = (1 - smooth) * f / 8 + smooth * f;
    }
    EXPECT_NEAR(std::atan2(sn[half + i], cs[half + i]), expect, 1e-12) << "frequency " << i;
  }
}

// Llama 4 Scout's rope_scaling (llama3, factor 16, both frequency factors 1, 8192 positions):
// no blend band; frequencies whose wavelength passes 8192 divided by 16, the others kept.
TEST(Kernels, Llama4RopeScalingWithEqualFactorsHasNoBlend) {
  const int64_t hd = 128, half = hd / 2;
  std::vector<double> cs(2 * half), sn(2 * half);
  rope_tables(cs.data(), sn.data(), 2, hd, 500000.0, RopeScaling{16.0, 1.0, 1.0, 8192});
  int divided = 0;
  for (int64_t i = 0; i < half; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * double(i) / double(hd));
    const bool low = 2 * M_PI / f > 8192.0;
    divided += low;
    EXPECT_NEAR(std::atan2(sn[half + i], cs[half + i]), low ? f / 16 : f, 1e-12) << "frequency " << i;
    ASSERT_TRUE(std::isfinite(cs[half + i])) << i;
  }
  EXPECT_GT(divided, 0);
  EXPECT_LT(divided, half);
}

TEST(Kernels, EmbeddingBackwardAccumulatesRepeats) {
  const int64_t vocab = 6, c = 3, n = 4;
  std::vector<int32_t> tokens{2, 5, 2, 0};
  auto table = random_vector(vocab * c, 12), R = random_vector(n * c, 13);
  auto loss = [&] {
    std::vector<double> out(n * c);
    embedding_forward(tokens.data(), table.data(), out.data(), n, vocab, c);
    return dot(out, R);
  };
  std::vector<double> dt(vocab * c, 0.0);
  embedding_backward_weight(tokens.data(), R.data(), dt.data(), n, vocab, c);
  expect_grad_matches("dtable", table.data(), dt.data(), table.size(), loss);
  std::vector<int32_t> bad{1, 6};  // 6 is past the vocabulary
  std::vector<double> out(2 * c);
  EXPECT_THROW(embedding_forward(bad.data(), table.data(), out.data(), 2, vocab, c), Error);
}

// Reference attention with the full score matrix, for comparison.
static std::vector<double> naive_attention(const std::vector<double>& qkv, const AttentionShape& s) {
  const int64_t S = s.seq, D = s.head_dim, st = s.qkv_stride(), qs = s.heads * D, kvs = s.groups * D;
  std::vector<double> out(s.batch * S * qs);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / (s.heads / s.groups);
      for (int64_t t = 0; t < S; ++t) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t k = 0; k < D; ++k)
            d += qkv[(b * S + t) * st + h * D + k] * qkv[(b * S + u) * st + qs + g * D + k];
          sc[u] = d / std::sqrt(double(D));
          mx = std::max(mx, sc[u]);
        }
        double z = 0;
        for (auto& v : sc) z += (v = std::exp(v - mx));
        for (int64_t k = 0; k < D; ++k) {
          double o = 0;
          for (int64_t u = 0; u <= t; ++u) o += sc[u] / z * qkv[(b * S + u) * st + qs + kvs + g * D + k];
          out[(b * S + t) * qs + h * D + k] = o;
        }
      }
    }
  return out;
}

TEST(Kernels, AttentionForwardMatchesNaiveAcrossTiles) {
  // 150 positions span three 64-wide tiles; 4 heads share 2 key/value groups.
  AttentionShape s{2, 150, 4, 2, 8};
  auto qkv = random_vector(s.batch * s.seq * s.qkv_stride(), 14, 1.5);
  std::vector<double> out(s.batch * s.seq * s.heads * s.head_dim), lse(s.batch * s.heads * s.seq);
  attention_forward(qkv.data(), out.data(), lse.data(), s);
  auto ref = naive_attention(qkv, s);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-12) << i;

  // The float path (with its vectorised exp) agrees to float precision.
  std::vector<float> qf(qkv.begin(), qkv.end()), of(out.size()), lf(lse.size());
  attention_forward(qf.data(), of.data(), lf.data(), s);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(of[i], ref[i], 2e-5) << i;
}

TEST(Kernels, AttentionBackwardGQA) {
  AttentionShape s{2, 70, 4, 2, 4};  // two tiles, GQA
  auto qkv = random_vector(s.batch * s.seq * s.qkv_stride(), 15);
  const size_t osz = s.batch * s.seq * s.heads * s.head_dim;
  auto R = random_vector(osz, 16);
  std::vector<double> out(osz), lse(s.batch * s.heads * s.seq);
  auto loss = [&] {
    attention_forward(qkv.data(), out.data(), lse.data(), s);
    return dot(out, R);
  };
  loss();
  std::vector<double> dqkv(qkv.size(), 123.0);  // garbage: the backward must overwrite it
  attention_backward(qkv.data(), out.data(), lse.data(), R.data(), dqkv.data(), s);
  // Check a sample spread over q, k and v of both batches (every 7th element keeps it fast).
  // The objective sums 1120 terms, so a larger step keeps round-off out of the difference.
  for (size_t i = 0; i < qkv.size(); i += 7) {
    const double num = primus::test::numeric_grad(&qkv[i], loss, 1e-4);
    ASSERT_NEAR(dqkv[i], num, 1e-9 + 1e-7 * std::fabs(num))
        << "row " << i / s.qkv_stride() << " column " << i % s.qkv_stride();
  }
}

TEST(Kernels, FastExpIsAccurate) {
  for (float x = -80.f; x < 80.f; x += 0.37f) {
    const float e = fast_exp(x), r = std::exp(x);
    ASSERT_NEAR(e, r, 3e-7f * r) << x;
  }
  EXPECT_LT(fast_exp(-std::numeric_limits<float>::infinity()), 1e-37f);
  EXPECT_TRUE(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
}
