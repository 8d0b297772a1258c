// Every op of the CPU bf16 backend (kernels/cpu/bf16) against the reference backend, which defines
// what a bf16 op computes: ragged shapes, GQA, head dims 8 to 128, masked targets, negative token
// ids, vocabulary chunks with global offsets, in-place forms. Both GEMM implementations (this
// project's AVX512-BF16 kernels and oneDNN) are checked on their own. bf16 outputs may differ from
// the reference by fp32 summation order (a bf16 ulp here and there), attention's also by the
// bf16 rounding of its probabilities; fp32 outputs by summation order only.
//
// On a CPU without AVX512-BF16 every case skips itself with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <xmmintrin.h>

#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/ceiling.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/reference_backend.h"
#include "skip_without_bf16.h"
#include "support/relative_error.h"

using namespace primus;
using primus::test::relative_l2_error;

namespace {

// Values uniform in [-scale, scale), as bf16 or fp32.
Tensor random(const Shape& shape, DType dtype, uint64_t seed, float scale = 1.0f) {
  Tensor f = Tensor::empty(shape, DType::F32);
  const Rng rng(seed);
  float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = scale * float(2.0 * ((rng.at(uint64_t(i)) >> 11) * 0x1.0p-53) - 1.0);
  if (dtype == DType::F32) return f;
  Tensor b = Tensor::empty(shape, DType::BF16);
  cpu::cast_host(f, b);
  return b;
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype() == DType::BF16) {
    const bf16* p = t.data<bf16>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i].to_float();
  } else {
    const float* p = t.data<float>();
    v.assign(p, p + t.numel());
  }
  return v;
}

// Relative L2 error of a against the reference r, and the largest element error relative to
// the largest reference magnitude (catches a few wrong elements in a big tensor).
void expect_close(const Tensor& a, const Tensor& r, double tol, const std::string& what) {
  ASSERT_EQ(a.numel(), r.numel()) << what;
  const auto x = values(a), y = values(r);
  double scale = 0, worst = 0;
  for (size_t i = 0; i < y.size(); ++i) scale = std::max(scale, double(std::fabs(y[i])));
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_FALSE(std::isnan(x[i])) << what << " element " << i;
    worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
  }
  if (scale == 0) {
    EXPECT_EQ(worst, 0) << what;
    return;
  }
  EXPECT_LT(relative_l2_error(x, y), tol) << what;
  EXPECT_LT(worst / scale, 8 * tol) << what;
}

constexpr double kBf16Tol = 6e-3;  // a bf16 rounding is 2^-9 relative; order differences add an ulp
constexpr double kF32Tol = 1e-5;

struct Backends {
  cpu::Bf16Backend fast;
  cpu::ReferenceBackend ref;
};

}  // namespace

// ---- GEMM: both implementations, every transposition, output type, accumulation and bias ----

struct GemmCase {
  int64_t m, n, k;
};

class Bf16Gemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Bf16Gemm, BothImplementationsMatchTheReference) {
  SKIP_WITHOUT_BF16();
  const auto [M, N, K] = GetParam();
  cpu::ReferenceBackend ref;
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (DType out : {DType::BF16, DType::F32})
        for (int mode = 0; mode < 4; ++mode) {  // 0: D = AB; 1: D += AB; 2: D = C + AB; 3: alpha and bias
          const Tensor A = random(ta ? Shape{K, M} : Shape{M, K}, DType::BF16, seed++);
          const Tensor B = random(tb ? Shape{N, K} : Shape{K, N}, DType::BF16, seed++);
          const Tensor C = random({M, N}, out, seed++);
          const Tensor bias = mode == 3 ? random({N}, DType::BF16, seed++) : Tensor();
          const float alpha = mode == 3 ? 0.375f : 1.0f, beta = mode == 0 ? 0.0f : mode == 3 ? 0.5f : 1.0f;
          Tensor want = C.clone();
          ref.gemm(ta, tb, alpha, A, B, beta, mode == 2 ? C : want, want, bias);
          // the own kernels whole, oneDNN, and the own kernels in about three K slabs (fp32 D)
          for (int run = 0; run < 3; ++run) {
            const auto impl = run == 1 ? cpu::bf16k::GemmImpl::OneDnn : cpu::bf16k::GemmImpl::Avx512;
            Tensor got = C.clone();
            cpu::bf16k::GemmArgs g;
            g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
            g.A = reinterpret_cast<const uint16_t*>(A.raw()), g.lda = A.size(1);
            g.B = reinterpret_cast<const uint16_t*>(B.raw()), g.ldb = B.size(1);
            g.C = beta == 0 ? nullptr : mode == 2 ? C.raw() : got.raw();
            g.D = got.raw(), g.f32_out = out == DType::F32;
            g.bias = bias.defined() ? reinterpret_cast<const uint16_t*>(bias.raw()) : nullptr;
            if (run == 0)
              cpu::bf16k::gemm_avx512(g);
            else if (run == 1)
              cpu::bf16k::gemm_onednn(g);
            else
              cpu::bf16k::gemm_avx512_slabs(g, double(K) * double(std::min(M, N)) * 2 / 3.5);
            expect_close(got, want, out == DType::F32 ? kF32Tol : kBf16Tol,
                         fmt::format("{}{} {}{} {} mode {}", cpu::bf16k::gemm_impl_name(impl),
                                     run == 2 ? " in slabs" : "", ta ? 'T' : 'N', tb ? 'T' : 'N', dtype_name(out),
                                     mode));
          }
        }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Gemm,
                         ::testing::Values(GemmCase{1, 1, 1}, GemmCase{37, 53, 19}, GemmCase{8, 48, 32},
                                           GemmCase{130, 97, 66}, GemmCase{9, 200, 300}, GemmCase{100, 17, 513},
                                           // A transposed with 4 row tiles or more: each tile packs its own
                                           // rows of A, in tiles up to 768 columns wide (gemm_avx512.cpp),
                                           // over one K block or several (the next one's rows prefetched)
                                           GemmCase{1445, 785, 34}, GemmCase{1445, 21, 600}, GemmCase{300, 130, 701},
                                           // fewer row tiles: A packed first, in two column sweeps (270 > 256)
                                           GemmCase{270, 60, 90},
                                           // three K slabs (the last one odd) in the slab run
                                           GemmCase{70, 90, 1601}),
                         [](const auto& info) {
                           return fmt::format("m{}n{}k{}", info.param.m, info.param.n, info.param.k);
                         });

// The backend's own gemm (whichever implementation it picks), with the model's tensor forms: a
// weight-gradient accumulation into fp32, a residual, rows of a larger tensor.
TEST(Bf16Ops, BackendGemmInTheModelsForms) {
  SKIP_WITHOUT_BF16();
  Backends b;
  const Tensor x = random({24, 40}, DType::BF16, 1), w = random({56, 40}, DType::BF16, 2);
  const Tensor res = random({24, 56}, DType::BF16, 3), dy = random({24, 56}, DType::BF16, 4);
  // y = res + x W^T (C is another tensor)
  Tensor y1 = Tensor::empty({24, 56}, DType::BF16), y2 = Tensor::empty({24, 56}, DType::BF16);
  b.fast.gemm(false, true, 1.0f, x, w, 1.0f, res, y1, Tensor());
  b.ref.gemm(false, true, 1.0f, x, w, 1.0f, res, y2, Tensor());
  expect_close(y1, y2, kBf16Tol, "residual NT");
  // dW (fp32) += scale * dy^T x, twice: accumulation
  Tensor g1 = random({56, 40}, DType::F32, 5), g2 = g1.clone();
  for (int i = 0; i < 2; ++i) {
    b.fast.gemm(true, false, 0.25f, dy, x, 1.0f, g1, g1, Tensor());
    b.ref.gemm(true, false, 0.25f, dy, x, 1.0f, g2, g2, Tensor());
  }
  expect_close(g1, g2, kF32Tol, "weight gradient TN");
  // logits (fp32) of rows 4..20 against the vocabulary rows 8..50 of w
  Tensor z1 = Tensor::empty({16, 42}, DType::F32), z2 = Tensor::empty({16, 42}, DType::F32);
  b.fast.gemm(false, true, 1.0f, x.slice(0, 4, 16), w.slice(0, 8, 42), 0.0f, Tensor(), z1, Tensor());
  b.ref.gemm(false, true, 1.0f, x.slice(0, 4, 16), w.slice(0, 8, 42), 0.0f, Tensor(), z2, Tensor());
  expect_close(z1, z2, kF32Tol, "logits of slices");
  // bad input is refused by name
  Tensor wrong = Tensor::empty({24, 55}, DType::BF16);
  EXPECT_THROW(b.fast.gemm(false, true, 1.0f, x, w, 0.0f, Tensor(), wrong, Tensor()), Error);
  EXPECT_THROW(b.fast.gemm(false, true, 1.0f, x, w, 1.0f, Tensor(), y1, Tensor()), Error);
  EXPECT_THROW(b.fast.gemm(false, true, 1.0f, x.clone().view({40, 24}), w, 0.0f, Tensor(), y1, Tensor()), Error);
}

// The grouped GEMM of the MoE experts: uneven row counts (none, one, past a tile), slices of one
// larger tensor, the three forms (forward NT, input gradient NN, weight gradient TN into fp32),
// and problems of different K in one call (row-major A read in place beside packed A). Each
// problem gives the bits of its own gemm_avx512 call, and the backend's call the reference.
TEST(Bf16Ops, GroupedGemmGivesEachProblemsOwnResult) {
  SKIP_WITHOUT_BF16();
  Backends b;
  const std::vector<int64_t> rows = {37, 0, 1, 130, 9, 96, 200};
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  uint64_t seed = 100;
  struct Form {
    bool ta, tb;
    DType out;
    float beta;
  };
  for (const Form f : {Form{false, true, DType::BF16, 0.0f}, Form{false, false, DType::BF16, 0.0f},
                       Form{true, false, DType::F32, 1.0f}})
    for (bool mixed_k : {false, true}) {
      const int64_t C = 72, F = 160;  // x [total, C] rows by expert, weights [F, C]
      std::vector<Tensor> A, B, D, want;
      const Tensor x = random({total, C + 1}, DType::BF16, seed++), dy = random({total, F}, DType::BF16, seed++);
      int64_t o = 0;
      for (size_t e = 0; e < rows.size(); ++e) {
        const int64_t n = rows[e];
        // mixed_k: every other problem has an odd K (its A is packed, not read in place)
        const int64_t k = mixed_k && e % 2 ? C + 1 : C;
        const Tensor xe = x.slice(0, o, n).clone();
        Tensor xk = Tensor::empty({n, k}, DType::BF16);
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(xk.data<bf16>() + i * k, xe.data<bf16>() + i * (C + 1), size_t(k) * 2);
        if (!f.ta) {
          A.push_back(f.tb ? xk : dy.slice(0, o, n));
          B.push_back(f.tb ? random({F, k}, DType::BF16, seed++) : random({F, C}, DType::BF16, seed++));
          D.push_back(Tensor::empty({n, f.tb ? F : C}, f.out));
        } else {  // dW [F, k] += dy^T x
          A.push_back(dy.slice(0, o, n));
          B.push_back(xk);
          D.push_back(random({F, k}, f.out, seed++));
        }
        want.push_back(D.back().clone());
        o += n;
      }
      const std::string what = fmt::format("{}{} {}{}", f.ta ? 'T' : 'N', f.tb ? 'T' : 'N', dtype_name(f.out),
                                           mixed_k ? " mixed K" : "");
      // The backend against the reference, one problem at a time.
      std::vector<Tensor> got;
      for (const Tensor& d : D) got.push_back(d.clone());
      b.fast.grouped_gemm(f.ta, f.tb, 1.0f, A, B, f.beta, got);
      for (size_t e = 0; e < A.size(); ++e) {
        b.ref.gemm(f.ta, f.tb, 1.0f, A[e], B[e], f.beta, f.beta != 0 ? want[e] : Tensor(), want[e], Tensor());
        expect_close(got[e], want[e], f.out == DType::F32 ? kF32Tol : kBf16Tol, what + fmt::format(" problem {}", e));
      }
      // This project's grouped kernel against its single-problem kernel: the same bits.
      std::vector<cpu::bf16k::GemmArgs> args;
      std::vector<Tensor> grouped, single;
      for (size_t e = 0; e < A.size(); ++e) {
        grouped.push_back(D[e].clone());
        single.push_back(D[e].clone());
        cpu::bf16k::GemmArgs g;
        g.trans_a = f.ta, g.trans_b = f.tb, g.beta = f.beta;
        g.M = f.ta ? A[e].size(1) : A[e].size(0), g.K = f.ta ? A[e].size(0) : A[e].size(1);
        g.N = f.tb ? B[e].size(0) : B[e].size(1);
        g.A = reinterpret_cast<const uint16_t*>(A[e].raw()), g.lda = A[e].size(1);
        g.B = reinterpret_cast<const uint16_t*>(B[e].raw()), g.ldb = B[e].size(1);
        g.f32_out = f.out == DType::F32;
        g.C = f.beta != 0 ? single[e].raw() : nullptr, g.D = single[e].raw();
        cpu::bf16k::gemm_avx512(g);
        g.C = f.beta != 0 ? grouped[e].raw() : nullptr, g.D = grouped[e].raw();
        args.push_back(g);
      }
      cpu::bf16k::gemm_avx512_grouped(args.data(), int64_t(args.size()));
      for (size_t e = 0; e < A.size(); ++e)
        EXPECT_EQ(std::memcmp(grouped[e].raw(), single[e].raw(), size_t(single[e].nbytes())), 0)
            << what << " problem " << e;
    }
  // Mismatched lists are refused.
  std::vector<Tensor> one = {Tensor::empty({2, 2}, DType::BF16)}, none;
  EXPECT_THROW(b.fast.grouped_gemm(false, true, 1.0f, one, none, 0.0f, one), Error);
}

// ---- rows ----

// The MoE routing row ops: the bf16 backend's AVX-512 kernels give the default implementation's
// bits (the reference backend inherits it), on ragged widths, repeated and skipped rows, scales
// and none, and values at bf16's edges: denormals, a NaN, a product that rounds to infinity.
TEST(Bf16Ops, RoutingRowOpsGiveTheDefaultsBits) {
  SKIP_WITHOUT_BF16();
  Backends b;
  for (int64_t C : {int64_t(1), int64_t(16), int64_t(37), int64_t(256)}) {
    Tensor x = random({11, C}, DType::BF16, 10 + uint64_t(C), 3.0f);
    uint16_t* xv = reinterpret_cast<uint16_t*>(x.raw());
    xv[0] = 0x0001;                 // the smallest denormal
    xv[x.numel() - 1] = 0x8075;     // a negative denormal
    if (C > 1) xv[C + 1] = 0x7fc1;  // a NaN
    xv[2 * C] = 0x7f70;             // 3.2e38: times 1.5 rounds to infinity
    const std::vector<int32_t> rows = {3, 0, 10, 3, 7, 2, 3, 8, 1, 0, 5, 9, 4, 6};  // 3 thrice, 0 twice
    std::vector<double> scale(rows.size());
    for (size_t i = 0; i < scale.size(); ++i) scale[i] = (i % 3 ? 1.5 : -0.3) + 1e-3 * double(i);
    for (const std::vector<double>* s : {&scale, static_cast<std::vector<double>*>(nullptr)}) {
      const std::vector<double> sc = s ? *s : std::vector<double>();
      const std::string what = fmt::format("C {} {}", C, s ? "scaled" : "unscaled");
      Tensor g1 = Tensor::empty({int64_t(rows.size()), C}, DType::BF16), g2 = g1.clone();
      b.fast.gather_rows(x, rows, sc, g1);
      b.ref.gather_rows(x, rows, sc, g2);
      EXPECT_EQ(std::memcmp(g1.raw(), g2.raw(), size_t(g1.numel()) * 2), 0) << "gather_rows " << what;
      // scatter onto a tensor with values (rows 6..10 get nothing from rows[0..6))
      Tensor o1 = random({11, C}, DType::BF16, 99, 2.0f), o2 = o1.clone();
      b.fast.scatter_add_rows(g1, rows, sc, o1);
      b.ref.scatter_add_rows(g1, rows, sc, o2);
      EXPECT_EQ(std::memcmp(o1.raw(), o2.raw(), size_t(o1.numel()) * 2), 0) << "scatter_add_rows " << what;
      const std::vector<int32_t> some(rows.begin(), rows.begin() + 6);
      const std::vector<double> ssome = s ? std::vector<double>(sc.begin(), sc.begin() + 6) : std::vector<double>();
      Tensor p1 = random({11, C}, DType::BF16, 98, 2.0f), p2 = p1.clone();
      b.fast.scatter_add_rows(g1.slice(0, 0, 6), some, ssome, p1);
      b.ref.scatter_add_rows(g1.slice(0, 0, 6), some, ssome, p2);
      EXPECT_EQ(std::memcmp(p1.raw(), p2.raw(), size_t(p1.numel()) * 2), 0) << "partial scatter " << what;
      const std::vector<double> d1 = b.fast.row_dots(x, rows, g2), d2 = b.ref.row_dots(x, rows, g2);
      ASSERT_EQ(d1.size(), d2.size());
      EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(double)), 0) << "row_dots " << what;
    }
  }
  // The default's checks, by name; other dtypes take the default.
  Tensor x = random({4, 8}, DType::BF16, 1), out = Tensor::empty({2, 8}, DType::BF16);
  EXPECT_THROW(b.fast.gather_rows(x, {0, 4}, {}, out), Error);
  EXPECT_THROW(b.fast.gather_rows(x, {0, 1}, {1.0}, out), Error);
  EXPECT_THROW(b.fast.scatter_add_rows(out, {0, -1}, {}, x), Error);
  EXPECT_THROW(b.fast.row_dots(x, {0}, out), Error);
  Tensor xf = random({4, 8}, DType::F32, 2), of1 = Tensor::empty({2, 8}, DType::F32), of2 = of1.clone();
  b.fast.gather_rows(xf, {3, 1}, {0.5, 2.0}, of1);
  b.ref.gather_rows(xf, {3, 1}, {0.5, 2.0}, of2);
  EXPECT_EQ(std::memcmp(of1.raw(), of2.raw(), 64), 0);
}

TEST(Bf16Ops, RmsNormForwardAndBackward) {
  SKIP_WITHOUT_BF16();
  Backends b;
  for (int64_t c : {8, 37, 288, 768}) {
    const int64_t n = 45;
    const Tensor x = random({n, c}, DType::BF16, 10 + c, 2.0f), w = random({c}, DType::BF16, 11 + c);
    const Tensor dy = random({n, c}, DType::BF16, 12 + c), res = random({n, c}, DType::BF16, 13 + c);
    Tensor y1 = Tensor::empty({n, c}, DType::BF16), y2 = y1.clone(), r1 = Tensor::empty({n}, DType::F32), r2 = r1.clone();
    b.fast.rmsnorm_forward(x, w, y1, r1, 1e-5f);
    b.ref.rmsnorm_forward(x, w, y2, r2, 1e-5f);
    expect_close(y1, y2, kBf16Tol, fmt::format("y c={}", c));
    expect_close(r1, r2, kF32Tol, fmt::format("rstd c={}", c));
    // dx with no residual, another tensor, and dx itself as the residual
    for (int mode = 0; mode < 3; ++mode) {
      Tensor d1 = mode == 2 ? res.clone() : Tensor::empty({n, c}, DType::BF16), d2 = mode == 2 ? res.clone() : d1.clone();
      const Tensor rr1 = mode == 0 ? Tensor() : mode == 1 ? res : d1, rr2 = mode == 0 ? Tensor() : mode == 1 ? res : d2;
      b.fast.rmsnorm_backward_input(dy, x, w, r2, rr1, d1);
      b.ref.rmsnorm_backward_input(dy, x, w, r2, rr2, d2);
      expect_close(d1, d2, kBf16Tol, fmt::format("dx c={} residual mode {}", c, mode));
    }
    Tensor g1 = random({c}, DType::F32, 14), g2 = g1.clone();  // accumulates onto what is there
    b.fast.rmsnorm_backward_weight(dy, x, r2, g1);
    b.ref.rmsnorm_backward_weight(dy, x, r2, g2);
    expect_close(g1, g2, kF32Tol, fmt::format("dw c={}", c));
  }
}

TEST(Bf16Ops, SwiGluForwardAndBackward) {
  SKIP_WITHOUT_BF16();
  Backends b;
  for (int64_t f : {5, 48, 768}) {
    const int64_t n = 19;
    const Tensor gu = random({n, 2 * f}, DType::BF16, 20 + f, 4.0f), da = random({n, f}, DType::BF16, 21 + f);
    Tensor a1 = Tensor::empty({n, f}, DType::BF16), a2 = a1.clone();
    b.fast.swiglu_forward(gu, a1);
    b.ref.swiglu_forward(gu, a2);
    expect_close(a1, a2, kBf16Tol, fmt::format("act f={}", f));
    Tensor g1 = Tensor::empty({n, 2 * f}, DType::BF16), g2 = g1.clone();
    b.fast.swiglu_backward(da, gu, g1);
    b.ref.swiglu_backward(da, gu, g2);
    expect_close(g1, g2, kBf16Tol, fmt::format("dgate_up f={}", f));
  }
}

// gpt-oss's clamped GLU (ops::Glu: alpha 1.702, offset 1, a clamp of 1.5 that cuts some of the
// values in [-4, 4)): the bf16 backend runs the reference's loop, and both equal the fp32 CPU
// kernel (finite-difference tested in test_engine) on the same inputs up to bf16 rounding.
TEST(Bf16Ops, ClampedGluIsTheFp32KernelRoundedToBf16) {
  SKIP_WITHOUT_BF16();
  Backends b;
  cpu::CpuBackend fp32;
  const ops::Glu glu{1.702, 1.0, 1.5};
  for (int64_t f : {5, 48}) {
    const int64_t n = 19;
    const Tensor gu = random({n, 2 * f}, DType::BF16, 30 + f, 4.0f), da = random({n, f}, DType::BF16, 31 + f);
    Tensor a1 = Tensor::empty({n, f}, DType::BF16), a2 = a1.clone();
    b.fast.glu_forward(gu, a1, glu);
    b.ref.glu_forward(gu, a2, glu);
    EXPECT_EQ(std::memcmp(a1.raw(), a2.raw(), size_t(a1.nbytes())), 0) << "act f=" << f;
    Tensor g1 = Tensor::empty({n, 2 * f}, DType::BF16), g2 = g1.clone();
    b.fast.glu_backward(da, gu, g1, glu);
    b.ref.glu_backward(da, gu, g2, glu);
    EXPECT_EQ(std::memcmp(g1.raw(), g2.raw(), size_t(g1.nbytes())), 0) << "dgate_up f=" << f;
    Tensor gu32 = Tensor::empty({n, 2 * f}, DType::F32), da32 = Tensor::empty({n, f}, DType::F32);
    cpu::cast_host(gu, gu32);
    cpu::cast_host(da, da32);
    Tensor a32 = Tensor::empty({n, f}, DType::F32), g32 = Tensor::empty({n, 2 * f}, DType::F32);
    fp32.glu_forward(gu32, a32, glu);
    fp32.glu_backward(da32, gu32, g32, glu);
    Tensor a1f = Tensor::empty({n, f}, DType::F32), g1f = Tensor::empty({n, 2 * f}, DType::F32);
    cpu::cast_host(a1, a1f);
    cpu::cast_host(g1, g1f);
    expect_close(a1f, a32, kBf16Tol, fmt::format("act against fp32 f={}", f));
    expect_close(g1f, g32, kBf16Tol, fmt::format("dgate_up against fp32 f={}", f));
  }
}

TEST(Bf16Ops, RopeForwardAndInverse) {
  SKIP_WITHOUT_BF16();
  Backends b;
  // halves of 4, 24 and 100 pairs run the loads-first path (200: in two sweeps of up to 64 pairs)
  for (int64_t hd : {8, 48, 64, 128, 200}) {
    const int64_t heads = 5, rotated = 4, seq = 7, rows = 3 * seq, positions = 40;  // the last head is left alone
    Tensor cos = Tensor::empty({positions, hd / 2}, DType::F32), sin = cos.clone();
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t i = 0; i < hd / 2; ++i) {
        cos.data<float>()[p * hd / 2 + i] = std::cos(0.1f * float(p * (i + 1)));
        sin.data<float>()[p * hd / 2 + i] = std::sin(0.1f * float(p * (i + 1)));
      }
    for (bool inverse : {false, true}) {
      Tensor x1 = random({rows, heads * hd + 3}, DType::BF16, 30 + hd), x2 = x1.clone();
      b.fast.rope_apply(x1, rotated, hd, seq, 5, cos, sin, inverse);
      b.ref.rope_apply(x2, rotated, hd, seq, 5, cos, sin, inverse);
      expect_close(x1, x2, kBf16Tol, fmt::format("rope hd={} inverse={}", hd, inverse));
    }
  }
}

// ---- attention ----

struct AttnCase {
  int64_t batch, seq, heads, groups, dim;
};

class Bf16Attention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Bf16Attention, ForwardBackwardAndDecodeMatchTheReference) {
  SKIP_WITHOUT_BF16();
  const AttnCase c = GetParam();
  const ops::AttentionShape s{c.batch, c.seq, c.heads, c.groups, c.dim};
  Backends b;
  const int64_t rows = c.batch * c.seq, width = c.heads * c.dim;
  const Tensor qkv = random({rows, s.qkv_stride()}, DType::BF16, 40, 2.0f);
  Tensor o1 = Tensor::empty({rows, width}, DType::BF16), o2 = o1.clone();
  Tensor l1 = Tensor::empty({c.batch, c.heads, c.seq}, DType::F32), l2 = l1.clone();
  b.fast.attention_forward(qkv, o1, l1, s);
  b.ref.attention_forward(qkv, o2, l2, s);
  expect_close(o1, o2, 1e-2, "out");
  expect_close(l1, l2, 1e-4, "lse");
  const Tensor dout = random({rows, width}, DType::BF16, 41);
  Tensor g1 = Tensor::empty({rows, s.qkv_stride()}, DType::BF16), g2 = g1.clone();
  b.fast.attention_backward(qkv, o2, l2, dout, g1, s);
  b.ref.attention_backward(qkv, o2, l2, dout, g2, s);
  // q, k and v gradients each (a wrong part would hide in the whole)
  const int64_t q = c.heads * c.dim, kv = c.groups * c.dim;
  for (auto [from, len, what] : {std::tuple{int64_t(0), q, "dq"}, {q, kv, "dk"}, {q + kv, kv, "dv"}}) {
    Tensor p1 = Tensor::empty({rows, len}, DType::BF16), p2 = p1.clone();
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(p1.data<bf16>() + r * len, g1.data<bf16>() + r * s.qkv_stride() + from, size_t(len) * 2);
      std::memcpy(p2.data<bf16>() + r * len, g2.data<bf16>() + r * s.qkv_stride() + from, size_t(len) * 2);
    }
    expect_close(p1, p2, 2e-2, what);
  }
  // Decoding one sequence: the last row, a few rows, all rows.
  const ops::AttentionShape d{1, c.seq, c.heads, c.groups, c.dim};
  for (int64_t first : {c.seq - 1, c.seq / 2, int64_t(0)}) {
    Tensor cache = Tensor::zeros({c.seq + 2, s.qkv_stride()}, DType::BF16);  // room past the used rows
    std::memcpy(cache.raw(), qkv.raw(), size_t(c.seq * s.qkv_stride()) * 2);
    Tensor a1 = Tensor::empty({c.seq - first, width}, DType::BF16), a2 = a1.clone();
    b.fast.attention_decode(cache, first, a1, d);
    b.ref.attention_decode(cache, first, a2, d);
    expect_close(a1, a2, 1e-2, fmt::format("decode from {}", first));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16Attention,
                         ::testing::Values(AttnCase{2, 37, 4, 2, 64},    // GQA, a ragged tile
                                           AttnCase{1, 130, 2, 2, 128},  // head dim 128, three key tiles
                                           AttnCase{2, 64, 6, 6, 48},    // llama2c's head dim
                                           AttnCase{1, 5, 4, 1, 8},      // multi-query, tiny
                                           AttnCase{1, 97, 2, 1, 20}),   // head dim not a multiple of 16
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return fmt::format("b{}s{}h{}g{}d{}", c.batch, c.seq, c.heads, c.groups, c.dim);
                         });

// A NaN in one query makes that query's output NaN, as in the reference, not a row of zeros (the
// forward's softmax computes its rescaling factors with a vector exp that would clamp a NaN away).
TEST(Bf16Ops, AttentionKeepsANaNQueryNaN) {
  SKIP_WITHOUT_BF16();
  const ops::AttentionShape s{1, 130, 2, 2, 64};
  Backends b;
  Tensor qkv = random({s.seq, s.qkv_stride()}, DType::BF16, 42, 2.0f);
  const int64_t row = 100;
  qkv.data<bf16>()[row * s.qkv_stride() + 3] = bf16::from_float(NAN);  // head 0 of query 100
  for (ops::Backend* be : {static_cast<ops::Backend*>(&b.fast), static_cast<ops::Backend*>(&b.ref)}) {
    Tensor out = Tensor::empty({s.seq, s.heads * s.head_dim}, DType::BF16);
    Tensor lse = Tensor::empty({1, s.heads, s.seq}, DType::F32);
    be->attention_forward(qkv, out, lse, s);
    for (int64_t c = 0; c < s.head_dim; ++c)
      EXPECT_TRUE(std::isnan(out.data<bf16>()[row * s.heads * s.head_dim + c].to_float()))
          << be->name() << " column " << c;
    EXPECT_FALSE(std::isnan(out.data<bf16>()[(row - 1) * s.heads * s.head_dim].to_float())) << be->name();
    EXPECT_FALSE(std::isnan(out.data<bf16>()[row * s.heads * s.head_dim + s.head_dim].to_float())) << be->name();
  }
}

// ---- embedding, sums, adds, casts ----

TEST(Bf16Ops, EmbeddingWithNegativeIdsAndItsGradient) {
  SKIP_WITHOUT_BF16();
  Backends b;
  const int64_t vocab = 23, c = 70, n = 31;
  const Tensor table = random({vocab, c}, DType::BF16, 50);
  Tensor tokens = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) tokens.data<int32_t>()[i] = i % 5 == 3 ? -1 : int32_t((i * 7) % vocab);
  Tensor e1 = Tensor::empty({n, c}, DType::BF16), e2 = e1.clone();
  b.fast.embedding_forward(tokens, table, e1);
  b.ref.embedding_forward(tokens, table, e2);
  EXPECT_EQ(values(e1), values(e2)) << "a row copy is exact; a negative id is a zero row";
  const Tensor dout = random({n, c}, DType::BF16, 51);
  const std::vector<int32_t> host(tokens.data<int32_t>(), tokens.data<int32_t>() + n);
  Tensor t1 = random({vocab, c}, DType::F32, 52), t2 = t1.clone();
  b.fast.embedding_backward(host, dout, t1);
  b.ref.embedding_backward(host, dout, t2);
  EXPECT_EQ(values(t1), values(t2)) << "the same fp32 additions in the same order";
  tokens.data<int32_t>()[4] = int32_t(vocab);
  EXPECT_THROW(b.fast.embedding_forward(tokens, table, e1), Error);
}

TEST(Bf16Ops, ColumnSumAddAndCast) {
  SKIP_WITHOUT_BF16();
  Backends b;
  const Tensor dy = random({33, 83}, DType::BF16, 60);
  Tensor s1 = random({83}, DType::F32, 61), s2 = s1.clone();
  b.fast.column_sum_accumulate(dy, s1);
  b.ref.column_sum_accumulate(dy, s2);
  EXPECT_EQ(values(s1), values(s2));
  for (DType t : {DType::BF16, DType::F32}) {
    const Tensor x = random({7, 45}, t, 62), y = random({7, 45}, t, 63);
    Tensor a1 = Tensor::empty({7, 45}, t), a2 = a1.clone();
    b.fast.add(x, y, a1);
    b.ref.add(x, y, a2);
    EXPECT_EQ(values(a1), values(a2)) << dtype_name(t);
    Tensor in_place = x.clone();
    b.fast.add(in_place, y, in_place);
    EXPECT_EQ(values(in_place), values(a2)) << "out = a";
  }
  // fp32 -> bf16 rounds to nearest even, as bf16::from_float; bf16 -> fp32 is exact.
  Tensor f = random({1000}, DType::F32, 64, 100.0f);
  f.data<float>()[0] = 1.0f + 0x1.0p-8f;  // a tie: rounds to even (1.0)
  f.data<float>()[1] = 1.0f + 3 * 0x1.0p-8f;  // a tie: rounds up
  f.data<float>()[2] = 1e-39f;  // a denormal
  Tensor h1 = Tensor::empty({1000}, DType::BF16), h2 = h1.clone();
  b.fast.cast(f, h1);
  b.ref.cast(f, h2);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(h1.data<bf16>()[i].bits, h2.data<bf16>()[i].bits) << i;
  Tensor back1 = Tensor::empty({1000}, DType::F32), back2 = back1.clone();
  b.fast.cast(h1, back1);
  b.ref.cast(h1, back2);
  EXPECT_EQ(values(back1), values(back2));
}

// ---- cross-entropy over vocabulary chunks ----

// softcap > 0: Grok's final_logit_softcapping (kernels/softcap.h), fused into the same passes.
static void check_chunked_cross_entropy(double softcap) {
  Backends b;
  const int64_t n = 21, vocab = 101, shard0 = 300;  // this shard holds ids 300 .. 400
  const std::vector<int64_t> chunks{0, 40, 80, 101};
  Tensor targets = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i)
    targets.data<int32_t>()[i] = i % 6 == 2 ? -1 : i % 6 == 4 ? 17 : int32_t(shard0 + (i * 13) % vocab);  // 17: another shard
  const Tensor logits = random({n, vocab}, DType::F32, 70, 8.0f);
  auto run = [&](ops::Backend& be, Tensor& lse, double& loss) {
    Tensor m = Tensor::empty({n}, DType::F32), s = m.clone(), zt = m.clone();
    be.ce_init(m, s, zt);
    for (size_t k = 0; k + 1 < chunks.size(); ++k) {
      const Tensor z = logits.slice(1, chunks[k], chunks[k + 1] - chunks[k]).clone();
      be.ce_chunk_forward(z, targets, shard0 + chunks[k], softcap, m, s, zt);
    }
    Tensor g = m.clone();  // a "global" max above the local one, as over tensor-parallel shards
    for (int64_t i = 0; i < n; ++i) g.data<float>()[i] += float(i % 3);
    be.ce_merge_max(m, s, g);
    loss = be.ce_finish(m, s, zt, targets, lse);
  };
  Tensor lse1 = Tensor::empty({n}, DType::F32), lse2 = lse1.clone();
  double loss1 = 0, loss2 = 0;
  run(b.fast, lse1, loss1);
  run(b.ref, lse2, loss2);
  expect_close(lse1, lse2, kF32Tol, "lse");
  EXPECT_NEAR(loss1, loss2, 1e-5 * std::fabs(loss2));
  for (size_t k = 0; k + 1 < chunks.size(); ++k) {
    const int64_t w = chunks[k + 1] - chunks[k];
    const Tensor z = logits.slice(1, chunks[k], w).clone();
    Tensor d1 = Tensor::empty({n, w}, DType::BF16), d2 = d1.clone();
    b.fast.ce_chunk_backward(z, lse2, targets, shard0 + chunks[k], softcap, d1);
    b.ref.ce_chunk_backward(z, lse2, targets, shard0 + chunks[k], softcap, d2);
    expect_close(d1, d2, kBf16Tol, fmt::format("dlogits chunk {}", k));
    // fp32 dlogits in place over the logits (dtypes agree)
    Tensor in_place = z.clone(), d32 = Tensor::empty({n, w}, DType::F32);
    b.fast.ce_chunk_backward(in_place, lse2, targets, shard0 + chunks[k], softcap, in_place);
    b.ref.ce_chunk_backward(z, lse2, targets, shard0 + chunks[k], softcap, d32);
    expect_close(in_place, d32, kF32Tol, fmt::format("in-place fp32 dlogits chunk {}", k));
    for (int64_t i = 0; i < n; ++i) {
      if (targets.data<int32_t>()[i] >= 0) continue;
      for (int64_t j = 0; j < w; ++j) ASSERT_EQ(d1.data<bf16>()[i * w + j].bits, 0) << "masked row " << i;
    }
  }
}

TEST(Bf16Ops, ChunkedCrossEntropyWithOffsetsAndMaskedTargets) {
  SKIP_WITHOUT_BF16();
  check_chunked_cross_entropy(0.0);
}

// Logits of scale 8 against a cap of 5: most of them on tanh's curved part or saturated.
TEST(Bf16Ops, ChunkedCrossEntropyWithSoftcap) {
  SKIP_WITHOUT_BF16();
  check_chunked_cross_entropy(5.0);
}

// ce_forward_backward's one-sweep kernel against the op set's default (the four chunk ops in
// order): the same lse, loss and dlogits bits, bf16 and fp32 (in place) dlogits, with and without
// the cap, masked rows, a target outside the shard's columns, a ragged vocabulary and an offset.
TEST(Bf16Ops, CrossEntropyInOneSweepIsTheChunkOpsBitForBit) {
  SKIP_WITHOUT_BF16();
  cpu::Bf16Backend be;
  const int64_t n = 19, vocab = 203, c0 = 1000;
  Tensor targets = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i)
    targets.data<int32_t>()[i] = i % 5 == 1 ? -1 : i % 7 == 3 ? 5 : int32_t(c0 + (i * 31) % vocab);
  const Tensor logits = random({n, vocab}, DType::F32, 71, 8.0f);
  for (const double cap : {0.0, 5.0})
    for (const DType dt : {DType::BF16, DType::F32}) {
      Tensor l1 = Tensor::empty({n}, DType::F32), l2 = l1.clone();
      Tensor z1 = logits.clone(), z2 = logits.clone();
      Tensor d1 = dt == DType::F32 ? z1 : Tensor::empty({n, vocab}, dt);
      Tensor d2 = dt == DType::F32 ? z2 : Tensor::empty({n, vocab}, dt);
      const double loss1 = be.ce_forward_backward(z1, targets, c0, cap, l1, d1);
      const double loss2 = be.ops::Backend::ce_forward_backward(z2, targets, c0, cap, l2, d2);
      const std::string what = fmt::format("cap {} dlogits {}", cap, dtype_name(dt));
      EXPECT_EQ(loss1, loss2) << what;
      EXPECT_GT(loss1, 0.0) << what;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(l1.data<float>()[i], l2.data<float>()[i]) << what << " row " << i;
      ASSERT_EQ(std::memcmp(d1.raw(), d2.raw(), size_t(d1.numel()) * dtype_size(dt)), 0) << what;
    }
}

// quantize_fp8's AVX-512 kernels against the op set's default (Backend::quantize_fp8, fp8::quantize
// through fp32): the same bits (a NaN as a NaN), amax and scale, for every bf16 bit pattern and for
// ragged random tensors with NaN, infinities and values past the largest finite one, in both
// formats, every granularity and direction, given and current tensor scales, with and without
// flush-to-zero.
TEST(Bf16Ops, QuantizeFp8IsTheDefaultBitForBit) {
  SKIP_WITHOUT_BF16();
  cpu::Bf16Backend be;
  Tensor every = Tensor::empty({512, 128}, DType::BF16);
  for (int64_t i = 0; i < every.numel(); ++i) every.data<bf16>()[i] = bf16{uint16_t(i)};
  Tensor ragged = random({300, 200}, DType::BF16, 7, 600.0f);
  const uint16_t specials[] = {0x7FC0, 0xFF80, 0x7F80, 0x8000, 0x0001, 0x4780 /* 65536 */, 0x43E0 /* 448 */};
  for (size_t k = 0; k < std::size(specials); ++k)
    ragged.data<bf16>()[size_t(k * 977 + 5)] = bf16{specials[k]};
  Tensor finite = random({130, 257}, DType::BF16, 8, 3.0f);  // no NaN: its amax and current scale count
  const unsigned csr = _mm_getcsr();
  int cases = 0;
  for (const unsigned mxcsr : {csr & ~0x8040u, csr | 0x8040u})
    for (const Tensor* src : {&every, &ragged, &finite})
      for (const fp8::Format f : {fp8::Format::E4M3, fp8::Format::E5M2})
        for (const fp8::Granularity g : {fp8::Granularity::Tensor, fp8::Granularity::Tile1x128,
                                         fp8::Granularity::Block128, fp8::Granularity::Mx32})
          for (const bool rc : {true, false})
            for (const float scale : {0.0f, 3.5f, 1e-3f, 1e30f}) {
              if (g != fp8::Granularity::Tensor && scale != 0.0f) continue;
              _mm_setcsr(mxcsr);
              Tensor ours = Tensor::empty(src->shape(), DType::BF16), def = Tensor::empty(src->shape(), DType::BF16);
              const auto a = be.quantize_fp8(*src, f, g, rc, scale, ours);
              const auto b = be.ops::Backend::quantize_fp8(*src, f, g, rc, scale, def);
              _mm_setcsr(csr);
              const std::string what = fmt::format("{} {} rc {} scale {} mxcsr {:x} src {}", fp8::format_name(f),
                                                   fp8::granularity_name(g), rc, scale, mxcsr, src->shape_str());
              ASSERT_TRUE(a.amax == b.amax || (std::isnan(a.amax) && std::isnan(b.amax))) << what;
              ASSERT_EQ(a.scale, b.scale) << what;
              const bf16 *x = ours.data<bf16>(), *y = def.data<bf16>();
              for (int64_t i = 0; i < ours.numel(); ++i)
                ASSERT_TRUE(x[i].bits == y[i].bits || (std::isnan(x[i].to_float()) && std::isnan(y[i].to_float())))
                    << what << " at " << i << ": " << x[i].bits << " vs " << y[i].bits;
              ++cases;
            }
  EXPECT_EQ(cases, 2 * 3 * 2 * (4 * 2 + 3 * 2));
}

TEST(Bf16Ops, CpuFeaturesAreReported) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const std::string s = f.summary();
  EXPECT_NE(s.find("AVX-512"), std::string::npos) << s;
  EXPECT_NE(s.find("AVX512-BF16"), std::string::npos) << s;
  EXPECT_NE(s.find("AMX"), std::string::npos) << s;
  // The backend runs exactly where the features say it may.
  EXPECT_EQ(cpu::Bf16Backend::supported(), f.avx512_bf16_usable());
  if (!f.avx512_bf16_usable()) {
    EXPECT_THROW(cpu::Bf16Backend(), Error);
  }
}

// The instruction ceiling (kernels/cpu/ceiling.h): the loop this CPU can run, named, positive, and
// the cached value is the measured one's kind. Prints the numbers beside the measured GEMM peaks
// (a benchmark's line, not a timed assertion: the machine may be shared).
TEST(InstructionCeiling, MeasuresTheInstructionTheCpuHas) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const cpu::InstructionCeiling b = cpu::measure_instruction_ceiling(true, 8, 1 << 14);
  const cpu::InstructionCeiling s = cpu::measure_instruction_ceiling(false, 8, 1 << 14);
  EXPECT_EQ(b.instruction, f.avx512_bf16_usable() ? "vdpbf16ps zmm"
                           : f.avx512()          ? "vfmadd231ps zmm"
                                                 : "vfmadd231ps ymm");
  EXPECT_EQ(s.instruction, f.avx512() ? "vfmadd231ps zmm" : "vfmadd231ps ymm");
  EXPECT_GT(b.gflops, 1.0);
  EXPECT_GT(s.gflops, 1.0);
  EXPECT_GT(b.threads, 0);
  const cpu::InstructionCeiling& cached = cpu::instruction_ceiling(true);
  if (std::getenv("PRIMUS_CEILING_GFLOPS") == nullptr) {
    EXPECT_EQ(cached.instruction, b.instruction);
  }
  std::printf("instruction ceiling on %d threads: %s %.1f GFLOP/s, %s %.1f GFLOP/s\n", b.threads,
              b.instruction.c_str(), b.gflops, s.instruction.c_str(), s.gflops);
}
