// gpt-oss's attention on every CPU backend: sliding windows (AttentionShape::window) and attention
// sinks (AttentionShape::sinks, kernels/cpu/attention.h), alone, together and with packed
// documents, forward (out, log-sum-exp), backward (dq, dk, dv) and the sinks' gradient
// (attention_sink_backward) against a plain reference in double; the gradients against finite
// differences in double; decoding against the forward's rows. The sequence crosses the 64-row
// tiles and the window is shorter than a tile, so whole key tiles are skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../bf16/skip_without_bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"
#include "support/relative_error.h"

using namespace primus;

namespace {

constexpr int64_t kSinkSeq = 150;

struct Variant {
  int64_t window;  // -1: none
  bool sinks;
  bool documents;
};

std::vector<double> normals(int64_t n, uint64_t seed, double scale = 1.0) {
  const Rng rng(seed);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * rng.normal_at(uint64_t(i));
  return v;
}

Tensor tensor_of(const std::vector<double>& v, const Shape& shape, DType dtype) {
  Tensor d = Tensor::empty(shape, DType::F64);
  std::copy(v.begin(), v.end(), d.data<double>());
  if (dtype == DType::F64) return d;
  Tensor f = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = float(v[size_t(i)]);
  if (dtype == DType::F32) return f;
  Tensor t = Tensor::empty(shape, dtype);
  cpu::cast_host(f, t);
  return t;
}

std::vector<double> values(const Tensor& t) {
  if (t.dtype() == DType::F64) return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
  std::vector<double> v(static_cast<size_t>(t.numel()));
  Tensor f = Tensor::empty(t.shape(), DType::F32);
  if (t.dtype() == DType::F32) {
    f.copy_from(t);
  } else {
    cpu::cast_host(t, f);
  }
  for (int64_t i = 0; i < f.numel(); ++i) v[size_t(i)] = f.data<float>()[i];
  return v;
}

// Values as the backend's dtype holds them (bf16 rounding), back in double.
std::vector<double> rounded(const std::vector<double>& v, DType dtype) {
  return values(tensor_of(v, {int64_t(v.size())}, dtype));
}

// Two sequences; the second holds documents at 0, 37, 100 when `documents`.
std::vector<int32_t> doc_starts() {
  std::vector<int32_t> st(size_t(2 * kSinkSeq), 0);
  for (int64_t t = 0; t < kSinkSeq; ++t) st[size_t(kSinkSeq + t)] = t < 37 ? 0 : t < 100 ? 37 : 100;
  return st;
}

// The attention of Variant v, written out in double: every score, the sink as one more term of
// the denominator, the gradients from the definitions (kernels/cpu/attention.h).
struct Reference {
  cpu::AttentionShape s;
  std::vector<int32_t> start;  // empty: no documents
  std::vector<double> sinks;   // empty: none

  int64_t first_key(int64_t b, int64_t t) const {
    const int64_t doc = start.empty() ? 0 : start[size_t(b * s.seq + t)];
    return std::max(doc, s.window_start(t));
  }
  double score(const std::vector<double>& qkv, int64_t b, int64_t h, int64_t t, int64_t u) const {
    const int64_t D = s.head_dim, W = s.qkv_stride(), g = h / (s.heads / s.groups);
    double dot = 0;
    for (int64_t d = 0; d < D; ++d)
      dot += qkv[size_t((b * s.seq + t) * W + h * D + d)] * qkv[size_t((b * s.seq + u) * W + (s.heads + g) * D + d)];
    return dot / std::sqrt(double(D));
  }
  void forward(const std::vector<double>& qkv, std::vector<double>& out, std::vector<double>& lse) const {
    const int64_t D = s.head_dim, W = s.qkv_stride(), H = s.heads;
    out.assign(size_t(s.batch * s.seq * H * D), 0.0);
    lse.assign(size_t(s.batch * H * s.seq), 0.0);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < s.seq; ++t) {
          const int64_t g = h / (H / s.groups);
          double m = sinks.empty() ? -std::numeric_limits<double>::infinity() : sinks[size_t(h)];
          for (int64_t u = first_key(b, t); u <= t; ++u) m = std::max(m, score(qkv, b, h, t, u));
          double z = sinks.empty() ? 0.0 : std::exp(sinks[size_t(h)] - m);
          for (int64_t u = first_key(b, t); u <= t; ++u) {
            const double p = std::exp(score(qkv, b, h, t, u) - m);
            z += p;
            for (int64_t d = 0; d < D; ++d)
              out[size_t((b * s.seq + t) * H * D + h * D + d)] += p * qkv[size_t((b * s.seq + u) * W + (H + s.groups + g) * D + d)];
          }
          for (int64_t d = 0; d < D; ++d) out[size_t((b * s.seq + t) * H * D + h * D + d)] /= z;
          lse[size_t((b * H + h) * s.seq + t)] = m + std::log(z);
        }
  }
  void backward(const std::vector<double>& qkv, const std::vector<double>& out, const std::vector<double>& lse,
                const std::vector<double>& dout, std::vector<double>& dqkv, std::vector<double>& dsinks) const {
    const int64_t D = s.head_dim, W = s.qkv_stride(), H = s.heads, G = s.groups;
    const double scale = 1.0 / std::sqrt(double(D));
    dqkv.assign(qkv.size(), 0.0);
    dsinks.assign(size_t(H), 0.0);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < s.seq; ++t) {
          const int64_t g = h / (H / G), row = b * s.seq + t;
          double di = 0;
          for (int64_t d = 0; d < D; ++d) di += dout[size_t(row * H * D + h * D + d)] * out[size_t(row * H * D + h * D + d)];
          const double L = lse[size_t((b * H + h) * s.seq + t)];
          if (!sinks.empty()) dsinks[size_t(h)] -= std::exp(sinks[size_t(h)] - L) * di;
          for (int64_t u = first_key(b, t); u <= t; ++u) {
            const int64_t key = (b * s.seq + u) * W;
            const double p = std::exp(score(qkv, b, h, t, u) - L);
            double dp = 0;
            for (int64_t d = 0; d < D; ++d) dp += dout[size_t(row * H * D + h * D + d)] * qkv[size_t(key + (H + G + g) * D + d)];
            const double ds = p * (dp - di);
            for (int64_t d = 0; d < D; ++d) {
              dqkv[size_t(row * W + h * D + d)] += ds * scale * qkv[size_t(key + (H + g) * D + d)];
              dqkv[size_t(key + (H + g) * D + d)] += ds * scale * qkv[size_t(row * W + h * D + d)];
              dqkv[size_t(key + (H + G + g) * D + d)] += p * dout[size_t(row * H * D + h * D + d)];
            }
          }
        }
  }
};

// One backend's run of a variant: the shape, its tensors and results.
struct Case {
  ops::AttentionShape s;
  Reference ref;
  std::vector<double> qkv, dout, sinks;
  DType dtype;

  Case(const Variant& v, DType dt) : dtype(dt) {
    s.batch = 2, s.seq = kSinkSeq, s.heads = 4, s.groups = 2, s.head_dim = 16;
    s.window = v.window;
    ref.s = s;
    qkv = rounded(normals(s.batch * s.seq * s.qkv_stride(), 21), dt);
    dout = rounded(normals(s.batch * s.seq * s.heads * s.head_dim, 22), dt);
    if (v.sinks) {
      sinks = {0.5, 2.0, -1.0, 3.0};  // some large enough to take most of a row's weight
      s.sinks = tensor_of(sinks, {s.heads}, ops::stat_dtype(dt));
      ref.sinks = sinks;
    }
    if (v.documents) {
      ref.start = doc_starts();
      s.doc_start = Tensor::empty({s.batch * s.seq}, DType::I32);
      std::copy(ref.start.begin(), ref.start.end(), s.doc_start.data<int32_t>());
    }
  }
  Shape rows(int64_t cols) const { return {s.batch * s.seq, cols}; }

  // out, lse, dqkv, dsinks from the backend.
  void on(ops::Backend& be, std::vector<double>& out, std::vector<double>& lse, std::vector<double>& dqkv,
          std::vector<double>& dsinks) const {
    const DType stat = ops::stat_dtype(dtype), grad = dtype == DType::F64 ? DType::F64 : DType::F32;
    const Tensor x = tensor_of(qkv, rows(s.qkv_stride()), dtype), g = tensor_of(dout, rows(s.heads * s.head_dim), dtype);
    Tensor o = be.empty(rows(s.heads * s.head_dim), dtype), l = be.empty({s.batch, s.heads, s.seq}, stat);
    Tensor dx = be.empty(rows(s.qkv_stride()), dtype);
    be.attention_forward(x, o, l, s);
    be.attention_backward(x, o, l, g, dx, s);
    out = values(o), lse = values(l), dqkv = values(dx), dsinks.clear();
    if (s.sinks.defined()) {
      Tensor ds = be.zeros({s.heads}, grad);
      be.attention_sink_backward(o, l, g, ds, s);
      dsinks = values(ds);
    }
  }
};

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  return test::relative_l2_error(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()));
}

const Variant kVariants[] = {
    {40, false, false}, {-1, true, false}, {40, true, false}, {7, true, true}, {64, true, true}, {0, false, false}};

void expect_matches_reference(ops::Backend& be, DType dtype, double tol) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(testing::Message() << "window " << v.window << (v.sinks ? ", sinks" : "")
                                    << (v.documents ? ", documents" : ""));
    const Case run(v, dtype);
    std::vector<double> out, lse, dqkv, dsinks, r_out, r_lse, r_dqkv, r_dsinks;
    run.on(be, out, lse, dqkv, dsinks);
    run.ref.forward(run.qkv, r_out, r_lse);
    // The backward from the backend's own out and lse, as the kernels take them.
    run.ref.backward(run.qkv, out, lse, run.dout, r_dqkv, r_dsinks);
    EXPECT_LT(rel(out, r_out), tol) << "out";
    EXPECT_LT(rel(lse, r_lse), tol) << "lse";
    EXPECT_LT(rel(dqkv, r_dqkv), 2 * tol) << "dq, dk, dv";
    if (v.sinks) {
      EXPECT_LT(rel(dsinks, r_dsinks), 2 * tol) << "dsinks";
    }
  }
}

}  // namespace

TEST(AttentionSinksWindow, MatchTheReferenceInFp64) {
  cpu::CpuBackend be;
  expect_matches_reference(be, DType::F64, 1e-7);
}

TEST(AttentionSinksWindow, MatchTheReferenceInFp32) {
  cpu::CpuBackend be;
  expect_matches_reference(be, DType::F32, 1e-5);
}

TEST(AttentionSinksWindow, MatchTheReferenceOnTheBf16Reference) {
  cpu::ReferenceBackend be;
  expect_matches_reference(be, DType::BF16, 8e-3);
}

TEST(AttentionSinksWindow, MatchTheReferenceOnTheCpuBf16Backend) {
  SKIP_WITHOUT_BF16();
  cpu::Bf16Backend be;
  expect_matches_reference(be, DType::BF16, 8e-3);
}

// loss = sum(out * dout): its gradient by the kernels (dqkv, dsinks) against central differences.
TEST(AttentionSinksWindow, GradientsMatchFiniteDifferencesInFp64) {
  cpu::CpuBackend be;
  for (const Variant& v : {Variant{40, true, false}, Variant{7, true, true}}) {
    SCOPED_TRACE(testing::Message() << "window " << v.window);
    Case run(v, DType::F64);
    run.s.batch = 1, run.s.seq = 80;  // a smaller problem: two key tiles
    run.ref.s = run.s;
    if (v.documents) {
      run.ref.start.assign(size_t(run.s.seq), 0);
      for (int64_t t = 37; t < run.s.seq; ++t) run.ref.start[size_t(t)] = 37;
      run.s.doc_start = Tensor::empty({run.s.seq}, DType::I32);
      std::copy(run.ref.start.begin(), run.ref.start.end(), run.s.doc_start.data<int32_t>());
    }
    run.qkv.resize(size_t(run.s.seq * run.s.qkv_stride()));
    run.dout.resize(size_t(run.s.seq * run.s.heads * run.s.head_dim));
    std::vector<double> out, lse, dqkv, dsinks;
    run.on(be, out, lse, dqkv, dsinks);
    auto loss = [&](const std::vector<double>& qkv, const std::vector<double>& sinks) {
      Case r = run;
      r.qkv = qkv;
      r.s.sinks = tensor_of(sinks, {r.s.heads}, DType::F64);
      const Tensor x = tensor_of(qkv, r.rows(r.s.qkv_stride()), DType::F64);
      Tensor o = be.empty(r.rows(r.s.heads * r.s.head_dim), DType::F64), l = be.empty({1, r.s.heads, r.s.seq}, DType::F64);
      be.attention_forward(x, o, l, r.s);
      double sum = 0;
      for (int64_t i = 0; i < o.numel(); ++i) sum += o.data<double>()[i] * run.dout[size_t(i)];
      return sum;
    };
    const double eps = 1e-5;
    const Rng pick(5);
    for (int i = 0; i < 40; ++i) {
      const size_t k = size_t(pick.at(uint64_t(i)) % run.qkv.size());
      std::vector<double> up = run.qkv, down = run.qkv;
      up[k] += eps, down[k] -= eps;
      const double fd = (loss(up, run.sinks) - loss(down, run.sinks)) / (2 * eps);
      EXPECT_NEAR(dqkv[k], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "qkv element " << k;
    }
    for (size_t h = 0; h < run.sinks.size(); ++h) {
      std::vector<double> up = run.sinks, down = run.sinks;
      up[h] += eps, down[h] -= eps;
      const double fd = (loss(run.qkv, up) - loss(run.qkv, down)) / (2 * eps);
      EXPECT_NEAR(dsinks[h], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "sink of head " << h;
    }
  }
}

// Decoding with a window and sinks: each cached row's attention equals the forward's row.
TEST(AttentionSinksWindow, DecodeEqualsTheForwardRows) {
  cpu::CpuBackend fp32;
  cpu::ReferenceBackend bf16_ref;
  for (ops::Backend* be : {static_cast<ops::Backend*>(&fp32), static_cast<ops::Backend*>(&bf16_ref)}) {
    const DType dt = be == &fp32 ? DType::F32 : DType::BF16;
    SCOPED_TRACE(be->name());
    Case run(Variant{40, true, false}, dt);
    run.s.batch = 1;
    const int64_t HD = run.s.heads * run.s.head_dim;
    const Tensor x = tensor_of(std::vector<double>(run.qkv.begin(), run.qkv.begin() + kSinkSeq * run.s.qkv_stride()),
                               {kSinkSeq, run.s.qkv_stride()}, dt);
    Tensor o = be->empty({kSinkSeq, HD}, dt), l = be->empty({1, run.s.heads, kSinkSeq}, DType::F32);
    be->attention_forward(x, o, l, run.s);
    const int64_t first = 100;
    Tensor d = be->empty({kSinkSeq - first, HD}, dt);
    be->attention_decode(x, first, d, run.s);
    const std::vector<double> all = values(o), dec = values(d);
    EXPECT_LT(rel(dec, std::vector<double>(all.begin() + first * HD, all.end())), dt == DType::F32 ? 1e-6 : 8e-3);
  }
}

// The ring's block ops refuse windows and sinks by name.
TEST(AttentionSinksWindow, RingBlocksRefuseWindowsAndSinks) {
  cpu::CpuBackend be;
  Case run(Variant{40, false, false}, DType::F32);
  const int64_t N = run.s.batch * run.s.seq;
  Tensor qkv = be.zeros({N, run.s.qkv_stride()}, DType::F32), kv = be.zeros({N, 2 * run.s.groups * run.s.head_dim}, DType::F32);
  Tensor out = be.empty({N, run.s.heads * run.s.head_dim}, DType::F32), lse = be.empty({run.s.batch, run.s.heads, run.s.seq}, DType::F32);
  try {
    be.attention_block_forward(qkv, kv, out, lse, run.s, true);
    FAIL() << "a window in a ring block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window attention and attention sinks"), std::string::npos) << e.what();
  }
}
