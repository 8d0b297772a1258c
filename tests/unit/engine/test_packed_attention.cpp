// Attention over documents packed into a sequence (ops::AttentionShape::doc_start): on every CPU
// backend, the packed attention of each document equals that document's attention run alone,
// forward (out, log-sum-exp) and backward (dq, dk, dv); ring attention's blocks with documents,
// merged, equal the packed attention of the whole sequence. The documents cross the 64-row tiles,
// start on a tile boundary, and include one-row documents.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../bf16/skip_without_bf16.h"
#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"
#include "support/relative_error.h"

using namespace primus;

namespace {

// Sequence b's documents begin at starts[b] (ascending, first 0).
const std::vector<std::vector<int32_t>> kStarts = {{0, 37, 100, 101, 128}, {0, 64, 70, 149}};
constexpr int64_t kSeq = 150;

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor f = Tensor::empty(shape, DType::F32);
  const Rng rng(seed);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = float(rng.normal_at(uint64_t(i)));
  if (dtype == DType::F32) return f;
  Tensor t = Tensor::empty(shape, dtype);
  cpu::cast_host(f, t);
  return t;
}

std::vector<float> as_floats(const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), DType::F32);
  if (t.dtype() == DType::F32)
    f.copy_from(t);
  else
    cpu::cast_host(t, f);
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

Tensor doc_start_of(const std::vector<std::vector<int32_t>>& starts, int64_t seq) {
  Tensor t = Tensor::empty({int64_t(starts.size()) * seq}, DType::I32);
  for (size_t b = 0; b < starts.size(); ++b)
    for (size_t d = 0; d < starts[b].size(); ++d) {
      const int64_t end = d + 1 < starts[b].size() ? starts[b][d + 1] : seq;
      for (int64_t t0 = starts[b][d]; t0 < end; ++t0) t.data<int32_t>()[int64_t(b) * seq + t0] = starts[b][d];
    }
  return t;
}

// Packed attention against each document alone on backend `be` in `dtype`, within `tol`
// (relative L2 error of each document's out, lse and dqkv).
void expect_packed_equals_alone(ops::Backend& be, DType dtype, double tol) {
  ops::AttentionShape s{int64_t(kStarts.size()), kSeq, 4, 2, 16};
  s.doc_start = doc_start_of(kStarts, kSeq);
  const int64_t rows = s.batch * s.seq, W = s.qkv_stride(), HD = s.heads * s.head_dim;
  const Tensor qkv = random_tensor({rows, W}, dtype, 11), dout = random_tensor({rows, HD}, dtype, 12);
  Tensor out = be.empty({rows, HD}, dtype), lse = be.empty({s.batch, s.heads, s.seq}, DType::F32);
  Tensor dqkv = be.empty({rows, W}, dtype);
  be.attention_forward(qkv, out, lse, s);
  be.attention_backward(qkv, out, lse, dout, dqkv, s);
  const std::vector<float> out_p = as_floats(out), lse_p = as_floats(lse), dqkv_p = as_floats(dqkv);
  for (size_t b = 0; b < kStarts.size(); ++b)
    for (size_t d = 0; d < kStarts[b].size(); ++d) {
      const int64_t a = kStarts[b][d], n = (d + 1 < kStarts[b].size() ? kStarts[b][d + 1] : kSeq) - a;
      const int64_t r0 = int64_t(b) * kSeq + a;
      SCOPED_TRACE(testing::Message() << "sequence " << b << " document at " << a << " of " << n << " rows");
      const ops::AttentionShape one{1, n, s.heads, s.groups, s.head_dim};
      Tensor o1 = be.empty({n, HD}, dtype), l1 = be.empty({1, s.heads, n}, DType::F32), g1 = be.empty({n, W}, dtype);
      be.attention_forward(qkv.slice(0, r0, n), o1, l1, one);
      be.attention_backward(qkv.slice(0, r0, n), o1, l1, dout.slice(0, r0, n), g1, one);
      const std::vector<float> o_alone = as_floats(o1), l_alone = as_floats(l1), g_alone = as_floats(g1);
      const std::vector<float> o_packed(out_p.begin() + r0 * HD, out_p.begin() + (r0 + n) * HD);
      const std::vector<float> g_packed(dqkv_p.begin() + r0 * W, dqkv_p.begin() + (r0 + n) * W);
      std::vector<float> l_packed;
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t t = 0; t < n; ++t) l_packed.push_back(lse_p[size_t((int64_t(b) * s.heads + h) * kSeq + a + t)]);
      EXPECT_LT(test::relative_l2_error(o_packed, o_alone), tol) << "out";
      EXPECT_LT(test::relative_l2_error(l_packed, l_alone), tol) << "lse";
      EXPECT_LT(test::relative_l2_error(g_packed, g_alone), 2 * tol) << "dq, dk, dv";
    }
}

}  // namespace

TEST(PackedAttention, EachDocumentEqualsItsAttentionAloneInFp32) {
  cpu::CpuBackend be;
  expect_packed_equals_alone(be, DType::F32, 1e-5);
}

TEST(PackedAttention, EachDocumentEqualsItsAttentionAloneOnTheBf16Reference) {
  cpu::ReferenceBackend be;
  expect_packed_equals_alone(be, DType::BF16, 6e-3);
}

TEST(PackedAttention, EachDocumentEqualsItsAttentionAloneOnTheCpuBf16Backend) {
  SKIP_WITHOUT_BF16();
  cpu::Bf16Backend be;
  expect_packed_equals_alone(be, DType::BF16, 6e-3);
}

TEST(PackedAttention, DocumentStartsOfAnotherShapeAreRefused) {
  cpu::CpuBackend be;
  ops::AttentionShape s{1, 8, 2, 1, 4};
  s.doc_start = Tensor::zeros({7}, DType::I32);
  Tensor qkv = Tensor::zeros({8, s.qkv_stride()}, DType::F32), out = Tensor::empty({8, 8}, DType::F32),
         lse = Tensor::empty({1, 2, 8}, DType::F32);
  EXPECT_THROW(be.attention_forward(qkv, out, lse, s), Error);
  s.doc_start = Tensor::zeros({8}, DType::F32);
  EXPECT_THROW(be.attention_forward(qkv, out, lse, s), Error);
}

// Ring attention's view (model/context_parallel.h): the sequence cut in blocks of c rows; query
// block i against key block j <= i with the key block's first position, merged by log-sum-exp.
// A block pair of two different documents contributes nothing (lse -inf); the merge equals the
// packed attention of the whole sequence. Double precision.
TEST(PackedAttention, RingBlocksWithDocumentsMergeIntoThePackedAttention) {
  const int64_t c = 40, n = 4, S = c * n, D = 8;
  const std::vector<std::vector<int32_t>> starts = {{0, 30, 41, 80, 81, 155}};
  const cpu::AttentionShape full{1, S, 4, 2, D}, blk{1, c, 4, 2, D};
  const int64_t W = full.qkv_stride(), HD = full.heads * D, GD = full.groups * D;
  const Tensor st = doc_start_of(starts, S);
  const int32_t* start = st.data<int32_t>();
  std::vector<double> qkv(size_t(S * W)), dout(size_t(S * HD));
  const Rng rng(21);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = rng.normal_at(i);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = rng.normal_at(qkv.size() + i);
  std::vector<double> out(size_t(S * HD)), lse(size_t(full.heads * S)), dqkv(qkv.size());
  cpu::attention_forward(qkv.data(), out.data(), lse.data(), full, {start, 0});
  cpu::attention_backward(qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data(), full, {start, 0});
  // Per block i: its q rows (fused), [k | v] rows, and the merged result.
  auto rows = [&](const std::vector<double>& m, int64_t width, int64_t i, int64_t col, int64_t cols) {
    std::vector<double> r(size_t(c * cols));
    for (int64_t t = 0; t < c; ++t)
      for (int64_t k = 0; k < cols; ++k) r[size_t(t * cols + k)] = m[size_t((i * c + t) * width + col + k)];
    return r;
  };
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<double> q = rows(qkv, W, i, 0, W);
    std::vector<double> acc(size_t(c * HD), 0.0), L(size_t(full.heads * c), -INFINITY);
    for (int64_t j = 0; j <= i; ++j) {
      std::vector<double> kv = rows(qkv, W, j, HD, 2 * GD), o(size_t(c * HD)), l(size_t(full.heads * c));
      cpu::attention_block_forward(q.data(), kv.data(), o.data(), l.data(), blk, j == i, {start + i * c, j * c});
      cpu::attention_merge(acc.data(), L.data(), o.data(), l.data(), blk);
    }
    const std::vector<double> want = rows(out, HD, i, 0, HD);
    for (size_t k = 0; k < acc.size(); ++k) ASSERT_NEAR(acc[k], want[k], 1e-12) << "block " << i;
    for (int64_t h = 0; h < full.heads; ++h)
      for (int64_t t = 0; t < c; ++t)
        ASSERT_NEAR(L[size_t(h * c + t)], lse[size_t(h * S + i * c + t)], 1e-12) << "block " << i;
  }
  // Backward: every pair's share, with the merged out and lse, summed.
  std::vector<double> dq(size_t(S * HD), 0.0), dkv(size_t(S * 2 * GD), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      const std::vector<double> q = rows(qkv, W, i, 0, W), kv = rows(qkv, W, j, HD, 2 * GD),
                                o = rows(out, HD, i, 0, HD), g = rows(dout, HD, i, 0, HD);
      std::vector<double> l(size_t(full.heads * c));
      for (int64_t h = 0; h < full.heads; ++h)
        for (int64_t t = 0; t < c; ++t) l[size_t(h * c + t)] = lse[size_t(h * S + i * c + t)];
      std::vector<double> dqi(size_t(c * HD), 0.0), dkvj(size_t(c * 2 * GD), 0.0);
      cpu::attention_block_backward(q.data(), kv.data(), o.data(), l.data(), g.data(), dqi.data(), dkvj.data(), blk,
                                    j == i, {start + i * c, j * c});
      for (size_t k = 0; k < dqi.size(); ++k) dq[size_t(i * c * HD) + k] += dqi[k];
      for (size_t k = 0; k < dkvj.size(); ++k) dkv[size_t(j * c * 2 * GD) + k] += dkvj[k];
    }
  for (int64_t r = 0; r < S; ++r) {
    for (int64_t k = 0; k < HD; ++k) ASSERT_NEAR(dq[size_t(r * HD + k)], dqkv[size_t(r * W + k)], 1e-11) << r;
    for (int64_t k = 0; k < 2 * GD; ++k)
      ASSERT_NEAR(dkv[size_t(r * 2 * GD + k)], dqkv[size_t(r * W + HD + k)], 1e-11) << r;
  }
}
