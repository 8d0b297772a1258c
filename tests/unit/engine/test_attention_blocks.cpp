// Context parallelism's attention ops (kernels/cpu/attention.h): causal attention over a sequence
// cut in blocks, computed block pair by block pair (the diagonal pair causal, the pairs below it
// full, those above skipped) and merged by log-sum-exp, must equal attention over the whole
// sequence: outputs, log-sum-exps and the gradients of q, k and v. Double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"

using namespace primus;
using namespace primus::cpu;

namespace {

std::vector<double> random_values(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = rng.normal();
  return v;
}

struct Blocks {
  AttentionShape full, block;  // the whole sequence; one block (seq = c)
  int n;                       // blocks per sequence
};

// Rows of block i of every sequence ([batch, c] of `width` columns) out of a [batch * seq, width] matrix.
std::vector<double> rows_of(const std::vector<double>& m, int64_t width, const Blocks& x, int i, int64_t col = 0,
                            int64_t cols = -1) {
  const int64_t c = x.block.seq, S = x.full.seq;
  if (cols < 0) cols = width;
  std::vector<double> out(x.full.batch * c * cols);
  for (int64_t b = 0; b < x.full.batch; ++b)
    for (int64_t t = 0; t < c; ++t)
      for (int64_t k = 0; k < cols; ++k) out[(b * c + t) * cols + k] = m[(b * S + i * c + t) * width + col + k];
  return out;
}

class AttentionBlocks : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int>> {};

TEST_P(AttentionBlocks, MergedBlocksEqualWholeSequenceAttention) {
  const auto [c, D, n] = GetParam();
  Blocks x;
  x.n = n;
  x.full = {2, c * n, 4, 2, D};
  x.block = {2, c, 4, 2, D};
  const AttentionShape& s = x.full;
  const int64_t stride = s.qkv_stride(), HD = s.heads * D, GD = s.groups * D;
  const std::vector<double> qkv = random_values(s.batch * s.seq * stride, 5);
  const std::vector<double> dout = random_values(s.batch * s.seq * HD, 6);
  std::vector<double> out(s.batch * s.seq * HD), lse(s.batch * s.heads * s.seq), dqkv(qkv.size());
  attention_forward(qkv.data(), out.data(), lse.data(), s);
  attention_backward(qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data(), s);

  const AttentionShape& bs = x.block;
  const int64_t brows = bs.batch * c;
  std::vector<std::vector<double>> kv(n), dkv(n, std::vector<double>(brows * 2 * GD, 0.0));
  for (int j = 0; j < n; ++j) kv[j] = rows_of(qkv, stride, x, j, HD, 2 * GD);
  for (int i = 0; i < n; ++i) {
    const std::vector<double> q = rows_of(qkv, stride, x, i);
    std::vector<double> acc(brows * HD, 0.0), l(bs.batch * bs.heads * c, -std::numeric_limits<double>::infinity());
    std::vector<double> bo(acc.size()), bl(l.size());
    for (int j = 0; j <= i; ++j) {
      attention_block_forward(q.data(), kv[j].data(), bo.data(), bl.data(), bs, j == i);
      attention_merge(acc.data(), l.data(), bo.data(), bl.data(), bs);
    }
    const std::vector<double> want = rows_of(out, HD, x, i);
    for (size_t k = 0; k < acc.size(); ++k) ASSERT_NEAR(acc[k], want[k], 1e-12) << "out of block " << i;
    for (int64_t b = 0; b < bs.batch; ++b)
      for (int64_t h = 0; h < bs.heads; ++h)
        for (int64_t t = 0; t < c; ++t)
          ASSERT_NEAR(l[(b * bs.heads + h) * c + t], lse[(b * s.heads + h) * s.seq + i * c + t], 1e-12);

    // Backward with the merged results: dq over the block's pairs, dk and dv into each kv block.
    const std::vector<double> o = rows_of(out, HD, x, i), d = rows_of(dout, HD, x, i);
    std::vector<double> dq(brows * HD, 0.0);
    for (int j = 0; j <= i; ++j)
      attention_block_backward(q.data(), kv[j].data(), o.data(), l.data(), d.data(), dq.data(), dkv[j].data(), bs,
                               j == i);
    const std::vector<double> want_dq = rows_of(dqkv, stride, x, i, 0, HD);
    for (size_t k = 0; k < dq.size(); ++k) ASSERT_NEAR(dq[k], want_dq[k], 1e-11) << "dq of block " << i;
  }
  for (int j = 0; j < n; ++j) {
    const std::vector<double> want = rows_of(dqkv, stride, x, j, HD, 2 * GD);
    for (size_t k = 0; k < want.size(); ++k) ASSERT_NEAR(dkv[j][k], want[k], 1e-11) << "dk|dv of block " << j;
  }
}

// c not a multiple of the kernels' tiles, head dims below and above their column blocks.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBlocks,
                         ::testing::Values(std::make_tuple(int64_t(5), int64_t(8), 4),
                                           std::make_tuple(int64_t(70), int64_t(12), 2),
                                           std::make_tuple(int64_t(16), int64_t(32), 3)));

// The bf16 reference backend's block ops are the fp32 ones with bf16 operands: against the CPU
// backend on the same (bf16-representable) values, to the rounding of the bf16 outputs.
TEST(AttentionBlocksBackends, ReferenceMatchesFp32) {
  const ops::AttentionShape s{2, 24, 4, 2, 16};
  const int64_t rows = s.batch * s.seq, HD = s.heads * s.head_dim, GD2 = 2 * s.groups * s.head_dim;
  auto bf16_tensor = [](const Shape& shape, uint64_t seed) {
    Tensor t = Tensor::empty(shape, DType::BF16);
    Rng rng(seed);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<bf16>()[i] = bf16::from_float(float(rng.normal()));
    return t;
  };
  auto widen = [](const Tensor& t) {
    Tensor f = Tensor::empty(t.shape());
    cast_host(t, f);
    return f;
  };
  const Tensor qkv = bf16_tensor({rows, s.qkv_stride()}, 1), kv = bf16_tensor({rows, GD2}, 2),
               dout = bf16_tensor({rows, HD}, 3);
  ReferenceBackend ref;
  CpuBackend& cpu = cpu_backend();
  for (bool causal : {true, false}) {
    Tensor out_b = Tensor::empty({rows, HD}, DType::BF16), lse_b = Tensor::empty({s.batch, s.heads, s.seq});
    Tensor out_f = Tensor::empty({rows, HD}), lse_f = Tensor::empty({s.batch, s.heads, s.seq});
    ref.attention_block_forward(qkv, kv, out_b, lse_b, s, causal);
    cpu.attention_block_forward(widen(qkv), widen(kv), out_f, lse_f, s, causal);
    const Tensor ob = widen(out_b);
    for (int64_t i = 0; i < out_f.numel(); ++i)
      ASSERT_NEAR(ob.data<float>()[i], out_f.data<float>()[i], 1e-2 * (1 + std::fabs(out_f.data<float>()[i])));
    for (int64_t i = 0; i < lse_f.numel(); ++i) ASSERT_FLOAT_EQ(lse_b.data<float>()[i], lse_f.data<float>()[i]);

    // Merged twice into a fresh accumulator: the same block twice is the block itself.
    Tensor acc = Tensor::zeros({rows, HD}), lse = Tensor::empty({s.batch, s.heads, s.seq});
    for (int64_t i = 0; i < lse.numel(); ++i) lse.data<float>()[i] = -std::numeric_limits<float>::infinity();
    ref.attention_merge(acc, lse, out_b, lse_b, s);
    ref.attention_merge(acc, lse, out_b, lse_b, s);
    for (int64_t i = 0; i < acc.numel(); ++i) ASSERT_NEAR(acc.data<float>()[i], ob.data<float>()[i], 1e-6);
    for (int64_t i = 0; i < lse.numel(); ++i)
      ASSERT_NEAR(lse.data<float>()[i], lse_b.data<float>()[i] + std::log(2.0f), 1e-5);

    Tensor dq_b = Tensor::zeros({rows, HD}), dkv_b = Tensor::zeros({rows, GD2});
    Tensor dq_f = Tensor::zeros({rows, HD}), dkv_f = Tensor::zeros({rows, GD2});
    ref.attention_block_backward(qkv, kv, out_b, lse_b, dout, dq_b, dkv_b, s, causal);
    cpu.attention_block_backward(widen(qkv), widen(kv), ob, lse_b, widen(dout), dq_f, dkv_f, s, causal);
    for (int64_t i = 0; i < dq_f.numel(); ++i) ASSERT_FLOAT_EQ(dq_b.data<float>()[i], dq_f.data<float>()[i]);
    for (int64_t i = 0; i < dkv_f.numel(); ++i) ASSERT_FLOAT_EQ(dkv_b.data<float>()[i], dkv_f.data<float>()[i]);
  }
}

}  // namespace
