// Flash attention on the GPU against the CPU kernel (causal) or a naive double-precision
// reference (non-causal), on the same bf16-rounded inputs.
//
// Tolerances. Inputs are unit-variance normals rounded to bf16, so both sides see identical
// values and differ only by the GPU's precision choices:
//  * out is bf16: rounding alone is 2^-9 relative (0.2%); P is rounded to bf16 before P V, which
//    adds errors of the same relative size, averaged over the keys. atol = rtol = 2e-2 leaves
//    a margin of ~10x for the worst of ~10^6 elements.
//  * lse is fp32 from fp32 tensor-core dot products of identical bf16 inputs and ex2.approx
//    (2 ulp); only the summation order differs: 1e-3 absolute + 1e-3 relative is ~100x margin.
//  * dq, dk, dv are bf16 and pass through bf16 P and dS (each 2^-9 relative) and fp32 sums of up
//    to seq * heads/groups terms of mixed sign; their typical size depends on the shape (dk, dv of
//    a group sum over its heads), so the absolute part scales with the reference's RMS:
//    atol = 2e-2 * max(1, rms), rtol = 2e-2.
// The backward is fed the same (bf16-rounded) out and the same lse on both sides, so its test
// does not inherit the forward's error.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "kernels/cpu/attention.h"
#ifdef PRIMUS_EMULATED_GPU
#include "emu/counters.h"
#endif
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/runtime.h"

namespace primus::gputest {
namespace {

using cuda::AttentionDims;

struct Case {
  int64_t batch, seq, heads, groups, head_dim;
  bool causal;
};

std::string name(const Case& c) {
  return fmt::format("B{} S{} H{} G{} D{} {}", c.batch, c.seq, c.heads, c.groups, c.head_dim,
                     c.causal ? "causal" : "full");
}

// Naive reference in double: forward (out, lse) and backward (dqkv) for causal or full attention.
// The backward uses the given out and lse, as the kernels do.
void naive_forward(const Case& c, const std::vector<float>& qkv, std::vector<float>& out, std::vector<float>& lse) {
  const int64_t S = c.seq, H = c.heads, D = c.head_dim, per = c.heads / c.groups;
  const int64_t stride = (c.heads + 2 * c.groups) * D;
  const double scale = 1.0 / std::sqrt(double(D));
  out.assign(size_t(c.batch * S * H * D), 0.f);
  lse.assign(size_t(c.batch * H * S), 0.f);
  std::vector<double> s(static_cast<size_t>(S)), o(static_cast<size_t>(D));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / per;
      for (int64_t i = 0; i < S; ++i) {
        const float* q = &qkv[size_t((b * S + i) * stride + h * D)];
        const int64_t n = c.causal ? i + 1 : S;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const float* k = &qkv[size_t((b * S + j) * stride + (H + g) * D)];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[d]) * double(k[d]);
          s[size_t(j)] = dot * scale;
          m = std::max(m, s[size_t(j)]);
        }
        double l = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(s[size_t(j)] - m);
          l += p;
          const float* v = &qkv[size_t((b * S + j) * stride + (H + c.groups + g) * D)];
          for (int64_t d = 0; d < D; ++d) o[size_t(d)] += p * double(v[d]);
        }
        for (int64_t d = 0; d < D; ++d) out[size_t((b * S + i) * H * D + h * D + d)] = float(o[size_t(d)] / l);
        lse[size_t((b * H + h) * S + i)] = float(m + std::log(l));
      }
    }
}

void naive_backward(const Case& c, const std::vector<float>& qkv, const std::vector<float>& out,
                    const std::vector<float>& lse, const std::vector<float>& dout, std::vector<float>& dqkv) {
  const int64_t S = c.seq, H = c.heads, G = c.groups, D = c.head_dim, per = c.heads / c.groups;
  const int64_t stride = (H + 2 * G) * D;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> acc(qkv.size(), 0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / per;
      for (int64_t i = 0; i < S; ++i) {
        const float* q = &qkv[size_t((b * S + i) * stride + h * D)];
        const float* go = &dout[size_t((b * S + i) * H * D + h * D)];
        const float* o = &out[size_t((b * S + i) * H * D + h * D)];
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += double(go[d]) * double(o[d]);
        const double L = lse[size_t((b * H + h) * S + i)];
        const int64_t n = c.causal ? i + 1 : S;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t krow = (b * S + j) * stride + (H + g) * D, vrow = (b * S + j) * stride + (H + G + g) * D;
          double dot = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += double(q[d]) * double(qkv[size_t(krow + d)]);
            dp += double(go[d]) * double(qkv[size_t(vrow + d)]);
          }
          const double p = std::exp(dot * scale - L), ds = p * (dp - delta);
          for (int64_t d = 0; d < D; ++d) {
            acc[size_t((b * S + i) * stride + h * D + d)] += ds * scale * double(qkv[size_t(krow + d)]);
            acc[size_t(krow + d)] += ds * scale * double(q[d]);
            acc[size_t(vrow + d)] += p * double(go[d]);
          }
        }
      }
    }
  dqkv.resize(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) dqkv[i] = float(acc[i]);
}

// The q, k or v columns of a fused [rows, stride] matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t stride, int64_t begin, int64_t count) {
  std::vector<float> out;
  out.reserve(size_t(rows * count));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < count; ++c) out.push_back(m[size_t(r * stride + begin + c)]);
  return out;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * double(x);
  return v.empty() ? 0.0 : std::sqrt(s / double(v.size()));
}

void expect_grad_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  expect_close(got, want, 2e-2 * std::max(1.0, rms(want)), 2e-2, what);
}

constexpr uint16_t kBf16NaN = 0x7fc0;

// The swizzled shared-memory tiles are meant to be free of bank conflicts (see
// flash_attention_common.cuh): on the emulated GPU, which counts ldmatrix's, every pass is checked.
class ExpectNoBankConflicts {
 public:
  explicit ExpectNoBankConflicts(const char* what) : what_(what) {
#ifdef PRIMUS_EMULATED_GPU
    cuda::synchronize();
    before_ = emu::counters();
#endif
  }
  ~ExpectNoBankConflicts() {
#ifdef PRIMUS_EMULATED_GPU
    cuda::synchronize();
    const emu::Counters after = emu::counters();
    EXPECT_GT(after.ldmatrix_phases, before_.ldmatrix_phases) << what_;
    EXPECT_EQ(after.ldmatrix_conflicts - before_.ldmatrix_conflicts, 0u)
        << what_ << ": ldmatrix bank conflicts in " << after.ldmatrix_phases - before_.ldmatrix_phases << " phases";
#endif
  }

 private:
  const char* what_;
#ifdef PRIMUS_EMULATED_GPU
  emu::Counters before_;
#endif
};

void check(const Case& c) {
  SCOPED_TRACE(name(c));
  const AttentionDims d{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  ASSERT_EQ(cuda::flash_attention_unsupported(d), "");
  const int64_t rows = c.batch * c.seq, stride = d.qkv_stride(), HD = c.heads * c.head_dim;
  const uint64_t seed = uint64_t(c.seq * 131 + c.heads * 7 + c.head_dim + (c.causal ? 1 : 0));
  const std::vector<float> qkv = round_bf16(random_floats(size_t(rows * stride), seed));
  const std::vector<float> dout = round_bf16(random_floats(size_t(rows * HD), seed + 1));

  // Reference forward.
  std::vector<float> out_ref, lse_ref;
  if (c.causal) {
    const cpu::AttentionShape shape{c.batch, c.seq, c.heads, c.groups, c.head_dim};
    out_ref.resize(size_t(rows * HD));
    lse_ref.resize(size_t(c.batch * c.heads * c.seq));
    cpu::attention_forward<float>(qkv.data(), out_ref.data(), lse_ref.data(), shape);
  } else {
    naive_forward(c, qkv, out_ref, lse_ref);
  }

  // GPU forward; out starts as NaN so that an unwritten element fails.
  const DeviceBf16 qkv_dev(to_bf16_bits(qkv));
  const DeviceBf16 out_dev(std::vector<uint16_t>(size_t(rows * HD), kBf16NaN));
  const DeviceArray<float> lse_dev(std::vector<float>(size_t(c.batch * c.heads * c.seq), NAN));
  auto bf = [](const DeviceBf16& a) { return reinterpret_cast<__nv_bfloat16*>(a.get()); };
  {
    const ExpectNoBankConflicts guard("forward");
    cuda::flash_attention_forward(bf(qkv_dev), bf(out_dev), lse_dev.get(), d, c.causal, cuda::stream());
  }
  expect_close(from_bf16_bits(out_dev.host()), out_ref, 2e-2, 2e-2, "out");
  expect_close(lse_dev.host(), lse_ref, 1e-3, 1e-3, "lse");

  // Backward, both sides from the same bf16 out and the same lse.
  const std::vector<float> out_b = round_bf16(out_ref);
  std::vector<float> dqkv_ref;
  if (c.causal) {
    const cpu::AttentionShape shape{c.batch, c.seq, c.heads, c.groups, c.head_dim};
    dqkv_ref.resize(qkv.size());
    cpu::attention_backward<float>(qkv.data(), out_b.data(), lse_ref.data(), dout.data(), dqkv_ref.data(), shape);
  } else {
    naive_backward(c, qkv, out_b, lse_ref, dout, dqkv_ref);
  }
  const DeviceBf16 outb_dev(to_bf16_bits(out_b));
  const DeviceArray<float> lser_dev(lse_ref);
  const DeviceBf16 dout_dev(to_bf16_bits(dout));
  const DeviceBf16 dqkv_dev(std::vector<uint16_t>(qkv.size(), kBf16NaN));  // every element must be written
  {
    const ExpectNoBankConflicts guard("backward");
    cuda::flash_attention_backward(bf(qkv_dev), bf(outb_dev), lser_dev.get(), bf(dout_dev), bf(dqkv_dev), d,
                                   c.causal, cuda::stream());
  }
  const std::vector<float> dqkv = from_bf16_bits(dqkv_dev.host());
  const int64_t kv = c.groups * c.head_dim;
  expect_grad_close(columns(dqkv, rows, stride, 0, HD), columns(dqkv_ref, rows, stride, 0, HD), "dq");
  expect_grad_close(columns(dqkv, rows, stride, HD, kv), columns(dqkv_ref, rows, stride, HD, kv), "dk");
  expect_grad_close(columns(dqkv, rows, stride, HD + kv, kv), columns(dqkv_ref, rows, stride, HD + kv, kv), "dv");

  // dK and dV accumulate in registers in a fixed order: a second run gives the same bits.
  const DeviceBf16 dqkv2_dev(std::vector<uint16_t>(qkv.size(), kBf16NaN));
  cuda::flash_attention_backward(bf(qkv_dev), bf(outb_dev), lser_dev.get(), bf(dout_dev), bf(dqkv2_dev), d, c.causal,
                                 cuda::stream());
  const std::vector<uint16_t> a = dqkv_dev.host(), b = dqkv2_dev.host();
  size_t differ = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = HD; col < stride; ++col) differ += a[size_t(r * stride + col)] != b[size_t(r * stride + col)];
  EXPECT_EQ(differ, 0u) << "dk/dv differ between two identical runs";
}

TEST(FlashAttention, CausalSmall) {
  PRIMUS_REQUIRE_GPU();
  check({2, 128, 4, 4, 64, true});
}

TEST(FlashAttention, CausalRaggedTailGqaD128) {
  PRIMUS_REQUIRE_GPU();
  check({1, 300, 8, 2, 128, true});
}

TEST(FlashAttention, CausalLongGqa) {
  PRIMUS_REQUIRE_GPU();
#ifdef PRIMUS_EMULATED_GPU
  // The emulated GPU (tests/emulated) runs a few hundred thousand mma.sync a second: half the
  // length and half the heads (still 4 heads per group, 8 query tiles) take this case from about
  // 10 s to about 1 s there.
  check({1, 512, 8, 2, 64, true});
#else
  check({1, 1024, 16, 4, 64, true});
#endif
}

TEST(FlashAttention, FullRaggedTailMqa) {
  PRIMUS_REQUIRE_GPU();
  check({2, 200, 4, 1, 64, false});
}

TEST(FlashAttention, FullShortD128) {
  PRIMUS_REQUIRE_GPU();
  check({1, 64, 2, 2, 128, false});
}

// Tails shorter than one tile, and a single row (every kernel's masked paths at their extreme).
TEST(FlashAttention, TinySequences) {
  PRIMUS_REQUIRE_GPU();
  check({3, 1, 2, 1, 64, true});
  check({1, 17, 4, 2, 128, true});
  check({1, 33, 2, 1, 128, false});
  check({2, 65, 2, 2, 64, false});
}

// Non-causal D=128 with a ragged tail and GQA (the remaining combination of the four kernels).
TEST(FlashAttention, FullRaggedTailGqaD128) {
  PRIMUS_REQUIRE_GPU();
  check({1, 190, 4, 2, 128, false});
}

// Context parallelism's block ops against the CPU kernels (kernels/cpu/attention.h) on the same
// bf16 inputs: a query block (the q columns of fused rows) against a separate [k | v] block,
// causal (the diagonal pair) and full; the merge into a running fp32 result; and the backward's
// fp32 accumulators, which must be added to (they start non-zero here), not overwritten.
void check_block(const Case& c) {
  SCOPED_TRACE(name(c));
  const AttentionDims d{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  const cpu::AttentionShape shape{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  const int64_t rows = c.batch * c.seq, stride = d.qkv_stride(), HD = c.heads * c.head_dim;
  const int64_t KV = 2 * c.groups * c.head_dim, stats = c.batch * c.heads * c.seq;
  const uint64_t seed = uint64_t(c.seq * 17 + c.head_dim + (c.causal ? 3 : 0));
  const std::vector<float> qkv = round_bf16(random_floats(size_t(rows * stride), seed));
  const std::vector<float> kv = round_bf16(random_floats(size_t(rows * KV), seed + 1));
  const std::vector<float> dout = round_bf16(random_floats(size_t(rows * HD), seed + 2));
  auto bf = [](const DeviceBf16& a) { return reinterpret_cast<__nv_bfloat16*>(a.get()); };

  std::vector<float> out_ref(static_cast<size_t>(rows * HD)), lse_ref(static_cast<size_t>(stats));
  cpu::attention_block_forward<float>(qkv.data(), kv.data(), out_ref.data(), lse_ref.data(), shape, c.causal);
  const DeviceBf16 qkv_dev(to_bf16_bits(qkv)), kv_dev(to_bf16_bits(kv));
  const DeviceBf16 out_dev(std::vector<uint16_t>(size_t(rows * HD), kBf16NaN));
  const DeviceArray<float> lse_dev(std::vector<float>(size_t(stats), NAN));
  cuda::flash_attention_block_forward(bf(qkv_dev), bf(kv_dev), bf(out_dev), lse_dev.get(), d, c.causal,
                                      cuda::stream());
  const std::vector<float> out_b = from_bf16_bits(out_dev.host());
  expect_close(out_b, out_ref, 2e-2, 2e-2, "block out");
  expect_close(lse_dev.host(), lse_ref, 1e-3, 1e-3, "block lse");

  // Merge the GPU's block into a running result that already holds another block.
  const std::vector<float> acc0 = random_floats(size_t(rows * HD), seed + 3);
  const std::vector<float> l0 = random_floats(size_t(stats), seed + 4, 2.0);
  std::vector<float> acc_ref = acc0, l_ref = l0;
  const std::vector<float> lse_gpu = lse_dev.host();
  cpu::attention_merge<float>(acc_ref.data(), l_ref.data(), out_b.data(), lse_gpu.data(), shape);
  const DeviceArray<float> acc_dev(acc0), l_dev(l0);
  cuda::attention_merge(acc_dev.get(), l_dev.get(), bf(out_dev), lse_dev.get(), d, cuda::stream());
  expect_close(acc_dev.host(), acc_ref, 1e-5, 1e-5, "merged acc");
  expect_close(l_dev.host(), l_ref, 1e-5, 1e-5, "merged lse");

  // Backward from the same bf16 out and lse, into accumulators that start at 1.
  std::vector<float> dq_ref(size_t(rows * HD), 1.f), dkv_ref(size_t(rows * KV), 1.f);
  cpu::attention_block_backward<float>(qkv.data(), kv.data(), out_b.data(), lse_gpu.data(), dout.data(),
                                       dq_ref.data(), dkv_ref.data(), shape, c.causal);
  const DeviceBf16 dout_dev(to_bf16_bits(dout));
  const DeviceArray<float> dq_dev(std::vector<float>(dq_ref.size(), 1.f)), dkv_dev(std::vector<float>(dkv_ref.size(), 1.f));
  cuda::flash_attention_block_backward(bf(qkv_dev), bf(kv_dev), bf(out_dev), lse_dev.get(), bf(dout_dev), dq_dev.get(),
                                       dkv_dev.get(), d, c.causal, cuda::stream());
  expect_grad_close(dq_dev.host(), dq_ref, "block dq");
  const std::vector<float> dkv = dkv_dev.host();
  const int64_t gd = c.groups * c.head_dim;
  expect_grad_close(columns(dkv, rows, KV, 0, gd), columns(dkv_ref, rows, KV, 0, gd), "block dk");
  expect_grad_close(columns(dkv, rows, KV, gd, gd), columns(dkv_ref, rows, KV, gd, gd), "block dv");
}

TEST(FlashAttentionBlocks, DiagonalAndFullPairs) {
  PRIMUS_REQUIRE_GPU();
  check_block({2, 96, 4, 2, 64, true});
  check_block({2, 96, 4, 2, 64, false});
  check_block({1, 70, 4, 1, 128, true});
  check_block({1, 70, 2, 2, 128, false});
}

// ---- Packed documents (AttentionDims::doc_start, kernels/cpu/attention.h's Documents) ----

// Each row's document start from per-sequence starts.
std::vector<int32_t> doc_start_of(const std::vector<std::vector<int32_t>>& starts, int64_t seq) {
  std::vector<int32_t> st(starts.size() * size_t(seq));
  for (size_t b = 0; b < starts.size(); ++b)
    for (size_t d = 0; d < starts[b].size(); ++d) {
      const int64_t end = d + 1 < starts[b].size() ? starts[b][d + 1] : seq;
      for (int64_t t = starts[b][d]; t < end; ++t) st[b * size_t(seq) + size_t(t)] = starts[b][d];
    }
  return st;
}

// -inf (a row that sees no key of a block) as a finite sentinel, so that it compares equal.
std::vector<float> finite(std::vector<float> v) {
  for (float& x : v)
    if (x == -INFINITY) x = -1e30f;
  return v;
}

// Packed attention on the GPU equals each document's attention alone (the CPU kernel on that
// document's rows, batch 1), forward and backward, on the same bf16 inputs; the backward is fed
// the reference's (bf16) out and lse as in check().
void check_packed(const Case& c, const std::vector<std::vector<int32_t>>& starts) {
  SCOPED_TRACE(name(c) + " packed");
  const std::vector<int32_t> st = doc_start_of(starts, c.seq);
  const DeviceArray<int32_t> st_dev(st);
  AttentionDims d{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  d.doc_start = st_dev.get();
  const int64_t rows = c.batch * c.seq, stride = d.qkv_stride(), HD = c.heads * c.head_dim;
  const std::vector<float> qkv = round_bf16(random_floats(size_t(rows * stride), 71));
  const std::vector<float> dout = round_bf16(random_floats(size_t(rows * HD), 72));
  // The reference: every document alone.
  std::vector<float> out_ref(size_t(rows * HD)), lse_ref(size_t(c.batch * c.heads * c.seq)), dqkv_ref(qkv.size());
  for (size_t b = 0; b < starts.size(); ++b)
    for (size_t k = 0; k < starts[b].size(); ++k) {
      const int64_t a = starts[b][k], n = (k + 1 < starts[b].size() ? starts[b][k + 1] : c.seq) - a;
      const int64_t r0 = int64_t(b) * c.seq + a;
      const cpu::AttentionShape one{1, n, c.heads, c.groups, c.head_dim};
      std::vector<float> o(size_t(n * HD)), l(size_t(c.heads * n)), g(size_t(n * stride));
      cpu::attention_forward<float>(qkv.data() + r0 * stride, o.data(), l.data(), one);
      const std::vector<float> ob = round_bf16(o);
      cpu::attention_backward<float>(qkv.data() + r0 * stride, ob.data(), l.data(), dout.data() + r0 * HD, g.data(),
                                     one);
      std::copy(o.begin(), o.end(), out_ref.begin() + r0 * HD);
      std::copy(g.begin(), g.end(), dqkv_ref.begin() + r0 * stride);
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t t = 0; t < n; ++t)
          lse_ref[size_t((int64_t(b) * c.heads + h) * c.seq + a + t)] = l[size_t(h * n + t)];
    }
  auto bf = [](const DeviceBf16& x) { return reinterpret_cast<__nv_bfloat16*>(x.get()); };
  const DeviceBf16 qkv_dev(to_bf16_bits(qkv));
  const DeviceBf16 out_dev(std::vector<uint16_t>(size_t(rows * HD), kBf16NaN));
  const DeviceArray<float> lse_dev(std::vector<float>(lse_ref.size(), NAN));
  cuda::flash_attention_forward(bf(qkv_dev), bf(out_dev), lse_dev.get(), d, true, cuda::stream());
  expect_close(from_bf16_bits(out_dev.host()), out_ref, 2e-2, 2e-2, "packed out");
  expect_close(lse_dev.host(), lse_ref, 1e-3, 1e-3, "packed lse");
  const DeviceBf16 outb_dev(to_bf16_bits(round_bf16(out_ref)));
  const DeviceArray<float> lser_dev(lse_ref);
  const DeviceBf16 dout_dev(to_bf16_bits(dout));
  const DeviceBf16 dqkv_dev(std::vector<uint16_t>(qkv.size(), kBf16NaN));
  cuda::flash_attention_backward(bf(qkv_dev), bf(outb_dev), lser_dev.get(), bf(dout_dev), bf(dqkv_dev), d, true,
                                 cuda::stream());
  const std::vector<float> dqkv = from_bf16_bits(dqkv_dev.host());
  const int64_t kv = c.groups * c.head_dim;
  expect_grad_close(columns(dqkv, rows, stride, 0, HD), columns(dqkv_ref, rows, stride, 0, HD), "packed dq");
  expect_grad_close(columns(dqkv, rows, stride, HD, kv), columns(dqkv_ref, rows, stride, HD, kv), "packed dk");
  expect_grad_close(columns(dqkv, rows, stride, HD + kv, kv), columns(dqkv_ref, rows, stride, HD + kv, kv),
                    "packed dv");
}

// Documents that cross the 128-row forward tiles and the 64-row backward tiles, start on a tile
// boundary, and one of a single row; D=64 and D=128 with GQA.
TEST(FlashAttentionPacked, EachDocumentEqualsItsAttentionAlone) {
  PRIMUS_REQUIRE_GPU();
  check_packed({2, 200, 4, 2, 64, true}, {{0, 37, 128, 129, 170}, {0, 64, 199}});
  check_packed({1, 150, 2, 1, 128, true}, {{0, 70, 140}});
}

// A ring block pair with documents (key_pos0: the key block's first position): the query block
// follows the key block (full pair); some queries' documents began in the key block, others
// after it (no visible key: out 0, lse -inf), against the CPU kernel with the same documents.
TEST(FlashAttentionPacked, RingBlockPairWithDocuments) {
  PRIMUS_REQUIRE_GPU();
  const Case c{1, 96, 4, 2, 64, false};
  // Whole-sequence starts of the query rows (positions 96 .. 191): documents from 40, 96, 150.
  std::vector<int32_t> st(96);
  for (int64_t t = 0; t < 96; ++t) st[size_t(t)] = 96 + t < 150 ? (t < 20 ? 40 : 96) : 150;
  const DeviceArray<int32_t> st_dev(st);
  AttentionDims d{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  d.doc_start = st_dev.get();
  d.key_pos0 = 0;
  const cpu::AttentionShape shape{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  const cpu::Documents docs{st.data(), 0};
  const int64_t rows = c.seq, stride = d.qkv_stride(), HD = c.heads * c.head_dim, KV = 2 * c.groups * c.head_dim;
  const std::vector<float> qkv = round_bf16(random_floats(size_t(rows * stride), 81));
  const std::vector<float> kv = round_bf16(random_floats(size_t(rows * KV), 82));
  const std::vector<float> dout = round_bf16(random_floats(size_t(rows * HD), 83));
  auto bf = [](const DeviceBf16& x) { return reinterpret_cast<__nv_bfloat16*>(x.get()); };
  std::vector<float> out_ref(size_t(rows * HD)), lse_ref(size_t(c.heads * rows));
  cpu::attention_block_forward<float>(qkv.data(), kv.data(), out_ref.data(), lse_ref.data(), shape, false, docs);
  const DeviceBf16 qkv_dev(to_bf16_bits(qkv)), kv_dev(to_bf16_bits(kv));
  const DeviceBf16 out_dev(std::vector<uint16_t>(size_t(rows * HD), kBf16NaN));
  const DeviceArray<float> lse_dev(std::vector<float>(lse_ref.size(), NAN));
  cuda::flash_attention_block_forward(bf(qkv_dev), bf(kv_dev), bf(out_dev), lse_dev.get(), d, false, cuda::stream());
  expect_close(from_bf16_bits(out_dev.host()), out_ref, 2e-2, 2e-2, "block out");
  expect_close(finite(lse_dev.host()), finite(lse_ref), 1e-3, 1e-3, "block lse");
  // Backward with a finite (merged) lse: the block's own where it saw keys (a row that saw none has
  // its diagonal block's; any finite value does, as it sees no key here).
  std::vector<float> lse_merged = lse_ref;
  for (float& x : lse_merged)
    if (x == -INFINITY) x = 1.f;
  std::vector<float> dq_ref(size_t(rows * HD), 1.f), dkv_ref(size_t(rows * KV), 1.f);
  const std::vector<float> out_b = round_bf16(out_ref);
  cpu::attention_block_backward<float>(qkv.data(), kv.data(), out_b.data(), lse_merged.data(), dout.data(),
                                       dq_ref.data(), dkv_ref.data(), shape, false, docs);
  const DeviceBf16 outb_dev(to_bf16_bits(out_b)), dout_dev(to_bf16_bits(dout));
  const DeviceArray<float> lsem_dev(lse_merged);
  const DeviceArray<float> dq_dev(std::vector<float>(dq_ref.size(), 1.f)), dkv_dev(std::vector<float>(dkv_ref.size(), 1.f));
  cuda::flash_attention_block_backward(bf(qkv_dev), bf(kv_dev), bf(outb_dev), lsem_dev.get(), bf(dout_dev),
                                       dq_dev.get(), dkv_dev.get(), d, false, cuda::stream());
  expect_grad_close(dq_dev.host(), dq_ref, "block dq");
  expect_grad_close(dkv_dev.host(), dkv_ref, "block dk, dv");
}

// ---- Sliding windows and sinks (AttentionDims::window, ::sinks; kernels/cpu/attention.h) ----

// The GPU's forward, backward and sinks' gradient against the CPU kernel with the same window,
// sinks and documents (the CPU kernel is checked against a plain double reference in
// tests/unit/engine/test_attention_sinks_window.cpp); the backward is fed the reference's bf16 out
// and lse as in check().
void check_window_sinks(const Case& c, int64_t window, bool with_sinks, const std::vector<std::vector<int32_t>>& starts) {
  SCOPED_TRACE(name(c) + fmt::format(" window {}{}{}", window, with_sinks ? " sinks" : "", starts.empty() ? "" : " documents"));
  const std::vector<int32_t> st = starts.empty() ? std::vector<int32_t>(1) : doc_start_of(starts, c.seq);
  const DeviceArray<int32_t> st_dev(st);
  const std::vector<float> sinks = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f, 0.0f, -2.0f, 4.0f};
  const DeviceArray<float> sinks_dev(std::vector<float>(sinks.begin(), sinks.begin() + c.heads));
  AttentionDims d{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  d.window = window;
  if (!starts.empty()) d.doc_start = st_dev.get();
  if (with_sinks) d.sinks = sinks_dev.get();
  cpu::AttentionShape shape{c.batch, c.seq, c.heads, c.groups, c.head_dim};
  shape.window = window;
  const cpu::Documents docs{starts.empty() ? nullptr : st.data(), 0};
  const float* cpu_sinks = with_sinks ? sinks.data() : nullptr;
  const int64_t rows = c.batch * c.seq, stride = d.qkv_stride(), HD = c.heads * c.head_dim;
  const std::vector<float> qkv = round_bf16(random_floats(size_t(rows * stride), 91));
  const std::vector<float> dout = round_bf16(random_floats(size_t(rows * HD), 92));
  std::vector<float> out_ref(size_t(rows * HD)), lse_ref(size_t(c.batch * c.heads * c.seq)), dqkv_ref(qkv.size());
  cpu::attention_forward<float>(qkv.data(), out_ref.data(), lse_ref.data(), shape, docs, cpu_sinks);
  const std::vector<float> out_b = round_bf16(out_ref);
  cpu::attention_backward<float>(qkv.data(), out_b.data(), lse_ref.data(), dout.data(), dqkv_ref.data(), shape, docs);

  auto bf = [](const DeviceBf16& x) { return reinterpret_cast<__nv_bfloat16*>(x.get()); };
  const DeviceBf16 qkv_dev(to_bf16_bits(qkv));
  const DeviceBf16 out_dev(std::vector<uint16_t>(size_t(rows * HD), kBf16NaN));
  const DeviceArray<float> lse_dev(std::vector<float>(lse_ref.size(), NAN));
  {
    const ExpectNoBankConflicts guard("forward");
    cuda::flash_attention_forward(bf(qkv_dev), bf(out_dev), lse_dev.get(), d, true, cuda::stream());
  }
  expect_close(from_bf16_bits(out_dev.host()), out_ref, 2e-2, 2e-2, "out");
  expect_close(lse_dev.host(), lse_ref, 1e-3, 1e-3, "lse");
  const DeviceBf16 outb_dev(to_bf16_bits(out_b));
  const DeviceArray<float> lser_dev(lse_ref);
  const DeviceBf16 dout_dev(to_bf16_bits(dout));
  const DeviceBf16 dqkv_dev(std::vector<uint16_t>(qkv.size(), kBf16NaN));
  cuda::flash_attention_backward(bf(qkv_dev), bf(outb_dev), lser_dev.get(), bf(dout_dev), bf(dqkv_dev), d, true,
                                 cuda::stream());
  const std::vector<float> dqkv = from_bf16_bits(dqkv_dev.host());
  const int64_t kv = c.groups * c.head_dim;
  expect_grad_close(columns(dqkv, rows, stride, 0, HD), columns(dqkv_ref, rows, stride, 0, HD), "dq");
  expect_grad_close(columns(dqkv, rows, stride, HD, kv), columns(dqkv_ref, rows, stride, HD, kv), "dk");
  expect_grad_close(columns(dqkv, rows, stride, HD + kv, kv), columns(dqkv_ref, rows, stride, HD + kv, kv), "dv");
  if (!with_sinks) return;
  std::vector<float> dsinks_ref(size_t(c.heads), 0.25f);
  cpu::attention_sink_backward<float>(out_b.data(), dout.data(), lse_ref.data(), sinks.data(), dsinks_ref.data(), shape);
  const DeviceArray<float> dsinks_dev(std::vector<float>(size_t(c.heads), 0.25f));  // added to
  cuda::attention_sink_backward(bf(outb_dev), lser_dev.get(), bf(dout_dev), sinks_dev.get(), dsinks_dev.get(), d,
                                cuda::stream());
  expect_close(dsinks_dev.host(), dsinks_ref, 1e-3 * std::max(1.0, rms(dsinks_ref)), 1e-3, "dsinks");
}

// Windows shorter than a tile (whole key tiles skipped), across tiles, and of one key; sinks alone
// and with them; with documents; D=64 and D=128 with GQA.
TEST(FlashAttentionWindowSinks, MatchTheCpuKernel) {
  PRIMUS_REQUIRE_GPU();
  check_window_sinks({2, 200, 4, 2, 64, true}, 7, true, {});
  check_window_sinks({2, 200, 4, 2, 64, true}, 70, false, {});
  check_window_sinks({1, 150, 4, 2, 64, true}, -1, true, {});
  check_window_sinks({1, 150, 2, 1, 128, true}, 40, true, {});
  check_window_sinks({1, 150, 2, 1, 128, true}, 0, false, {});
  check_window_sinks({2, 200, 4, 2, 64, true}, 30, true, {{0, 37, 128, 129, 170}, {0, 64, 199}});
}

// Decoding with a window and sinks against the CPU kernel's decode.
TEST(FlashAttentionWindowSinks, DecodeMatchesTheCpuKernel) {
  PRIMUS_REQUIRE_GPU();
  const int64_t seq = 90, heads = 4, groups = 2, D = 64, first = 60;
  AttentionDims d{1, seq, heads, groups, D};
  d.window = 20;
  const std::vector<float> sinks = {0.5f, 2.0f, -1.0f, 3.0f};
  const DeviceArray<float> sinks_dev(sinks);
  d.sinks = sinks_dev.get();
  cpu::AttentionShape shape{1, seq, heads, groups, D};
  shape.window = 20;
  const std::vector<float> cache = round_bf16(random_floats(size_t(seq * d.qkv_stride()), 93));
  std::vector<float> ref(size_t((seq - first) * heads * D));
  cpu::attention_decode<float>(cache.data(), first, ref.data(), shape, sinks.data());
  const DeviceBf16 cache_dev(to_bf16_bits(cache));
  const DeviceBf16 out_dev(std::vector<uint16_t>(ref.size(), kBf16NaN));
  cuda::attention_decode(reinterpret_cast<__nv_bfloat16*>(cache_dev.get()), first,
                         reinterpret_cast<__nv_bfloat16*>(out_dev.get()), d, cuda::stream());
  expect_close(from_bf16_bits(out_dev.host()), ref, 2e-2, 2e-2, "decode out");
}

TEST(FlashAttention, UnsupportedShapes) {  // no GPU needed
  EXPECT_EQ(cuda::flash_attention_unsupported({2, 128, 4, 4, 64}), "");
  EXPECT_EQ(cuda::flash_attention_unsupported({1, 300, 8, 2, 128}), "");
  EXPECT_EQ(cuda::flash_attention_unsupported({1, 1, 32, 8, 64}), "");
  const std::string d96 = cuda::flash_attention_unsupported({1, 128, 4, 4, 96});
  EXPECT_NE(d96.find("head_dim"), std::string::npos) << d96;
  EXPECT_NE(d96.find("96"), std::string::npos) << d96;
  const std::string div = cuda::flash_attention_unsupported({1, 128, 6, 4, 64});
  EXPECT_NE(div.find("divisible"), std::string::npos) << div;
  for (const AttentionDims& bad : {AttentionDims{0, 128, 4, 4, 64}, AttentionDims{1, 0, 4, 4, 64},
                                   AttentionDims{1, 128, 0, 1, 64}, AttentionDims{1, 128, 4, 0, 64},
                                   AttentionDims{1, 128, 4, 4, 0}, AttentionDims{-1, 128, 4, 4, 64}}) {
    const std::string why = cuda::flash_attention_unsupported(bad);
    EXPECT_NE(why.find("positive"), std::string::npos) << why;
  }
  EXPECT_NE(cuda::flash_attention_unsupported({1, 128, 4, 4, 32}), "");
  EXPECT_NE(cuda::flash_attention_unsupported({1, 128, 4, 4, 256}), "");
  EXPECT_NE(cuda::flash_attention_unsupported({70000, 128, 4, 4, 64}), "");
}

}  // namespace
}  // namespace primus::gputest
