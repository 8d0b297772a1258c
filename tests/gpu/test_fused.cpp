// The CUDA backend's fused kernels (kernels/cuda/fused.h) against their CPU references: the CPU
// kernels (kernels/cpu/elementwise.h) and optim's AdamW on float copies of the same bf16-rounded
// inputs, or fp64 sums where no CPU kernel exists (cross-entropy, sums of squares). Shapes cover
// the 16-byte vector paths (rows of c % 8 == 0) and the scalar ones (odd c), and the two-stage
// reductions are checked for identical bits across runs.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/fused.h"
#include "kernels/softcap.h"
#include "optim/adamw.h"

namespace primus {
namespace {

using namespace gputest;
using cuda::AdamWChunk;
using dbf16 = __nv_bfloat16;

dbf16* B(const DeviceBf16& d) { return reinterpret_cast<dbf16*>(d.get()); }

// Uploads float values as bf16 (they should be bf16-exact already).
DeviceBf16 upload_bf16(const std::vector<float>& v) { return DeviceBf16(to_bf16_bits(v)); }
std::vector<float> download_bf16(const DeviceBf16& d) { return from_bf16_bits(d.host()); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  int64_t n, c;
};
// Odd widths (scalar paths), a width that is a multiple of 8 but not of 256 (a partial vector
// tile), a model width, and row counts that span several 64-row reduction blocks (70001 rows:
// more than 1024 blocks of 64, so the column reductions lengthen their row blocks).
const std::vector<Shape> kShapes = {{37, 100}, {37, 4096}, {300, 264}, {5, 7}, {1, 1}, {130, 8}, {70001, 8}};

// ---------------------------------------------------------------- RMSNorm

TEST(FusedRmsNorm, ForwardMatchesCpu) {
  PRIMUS_REQUIRE_GPU();
  for (const auto [n, c] : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << n << " c=" << c);
    const auto x = round_bf16(random_floats(size_t(n * c), 1));
    auto w = random_floats(size_t(c), 2, 0.2);
    for (float& v : w) v += 1.0f;
    w = round_bf16(w);
    std::vector<float> y_ref(size_t(n * c)), rstd_ref(static_cast<size_t>(n));
    cpu::rmsnorm_forward<float>(x.data(), w.data(), y_ref.data(), rstd_ref.data(), n, c, 1e-5);

    auto dx = upload_bf16(x), dw = upload_bf16(w);
    DeviceBf16 dy(size_t(n * c));
    DeviceArray<float> drstd(static_cast<size_t>(n));
    cuda::rmsnorm_forward(B(dx), B(dw), B(dy), drstd.get(), n, c, 1e-5f, cuda::stream());
    expect_close(download_bf16(dy), y_ref, 1e-2, 8e-3, "rmsnorm y");
    expect_close(drstd.host(), rstd_ref, 0, 2e-6, "rmsnorm rstd");
  }
}

TEST(FusedRmsNorm, BackwardInputMatchesCpuWithAndWithoutResidual) {
  PRIMUS_REQUIRE_GPU();
  for (const auto [n, c] : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << n << " c=" << c);
    const auto x = round_bf16(random_floats(size_t(n * c), 3));
    const auto dyv = round_bf16(random_floats(size_t(n * c), 4));
    const auto res = round_bf16(random_floats(size_t(n * c), 5));
    auto w = random_floats(size_t(c), 6, 0.2);
    for (float& v : w) v += 1.0f;
    w = round_bf16(w);
    std::vector<float> y(size_t(n * c)), rstd(static_cast<size_t>(n)), dx_ref(size_t(n * c));
    cpu::rmsnorm_forward<float>(x.data(), w.data(), y.data(), rstd.data(), n, c, 1e-5);
    cpu::rmsnorm_backward_input<float>(dyv.data(), x.data(), w.data(), rstd.data(), dx_ref.data(), n, c, false);
    std::vector<float> dx_res_ref = dx_ref;
    for (size_t i = 0; i < dx_res_ref.size(); ++i) dx_res_ref[i] += res[i];

    auto dx_in = upload_bf16(x), ddy = upload_bf16(dyv), dw = upload_bf16(w), dres = upload_bf16(res);
    DeviceArray<float> drstd(rstd);
    DeviceBf16 ddx(size_t(n * c));
    cuda::rmsnorm_backward_input(B(ddy), B(dx_in), B(dw), drstd.get(), nullptr, B(ddx), n, c, cuda::stream());
    expect_close(download_bf16(ddx), dx_ref, 2e-2, 1e-2, "dx without residual");
    cuda::rmsnorm_backward_input(B(ddy), B(dx_in), B(dw), drstd.get(), B(dres), B(ddx), n, c, cuda::stream());
    expect_close(download_bf16(ddx), dx_res_ref, 2e-2, 1e-2, "dx with a residual");
    auto inplace = upload_bf16(res);  // dx == residual
    cuda::rmsnorm_backward_input(B(ddy), B(dx_in), B(dw), drstd.get(), B(inplace), B(inplace), n, c,
                                 cuda::stream());
    expect_close(download_bf16(inplace), dx_res_ref, 2e-2, 1e-2, "dx in place over the residual");
  }
}

TEST(FusedRmsNorm, BackwardWeightMatchesCpuAndIsDeterministic) {
  PRIMUS_REQUIRE_GPU();
  for (const auto [n, c] : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << n << " c=" << c);
    const auto x = round_bf16(random_floats(size_t(n * c), 7));
    const auto dyv = round_bf16(random_floats(size_t(n * c), 8));
    const auto rstd = random_floats(size_t(n), 9, 0.1);
    const auto dw0 = random_floats(size_t(c), 10);
    std::vector<float> dw_ref = dw0;
    cpu::rmsnorm_backward_weight<float>(dyv.data(), x.data(), rstd.data(), dw_ref.data(), n, c);

    auto dx = upload_bf16(x), ddy = upload_bf16(dyv);
    DeviceArray<float> drstd(rstd);
    DeviceArray<float> a(dw0), b(dw0);
    cuda::rmsnorm_backward_weight(B(ddy), B(dx), drstd.get(), a.get(), n, c, cuda::stream());
    cuda::rmsnorm_backward_weight(B(ddy), B(dx), drstd.get(), b.get(), n, c, cuda::stream());
    const auto got = a.host();
    expect_close(got, dw_ref, 1e-4, 1e-4, "dw");
    EXPECT_TRUE(same_bits(got, b.host())) << "two runs on the same input differ";
  }
}

TEST(FusedColumnSum, MatchesCpuAndIsDeterministic) {
  PRIMUS_REQUIRE_GPU();
  for (const auto [n, m] : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << n << " m=" << m);
    const auto dyv = round_bf16(random_floats(size_t(n * m), 11));
    const auto out0 = random_floats(size_t(m), 12);
    std::vector<float> ref(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += dyv[size_t(i * m + j)];
      ref[size_t(j)] = float(double(out0[size_t(j)]) + s);
    }
    auto ddy = upload_bf16(dyv);
    DeviceArray<float> a(out0), b(out0);
    cuda::column_sum_accumulate(B(ddy), a.get(), n, m, cuda::stream());
    cuda::column_sum_accumulate(B(ddy), b.get(), n, m, cuda::stream());
    const auto got = a.host();
    expect_close(got, ref, 1e-4, 1e-5, "column sums");
    EXPECT_TRUE(same_bits(got, b.host())) << "two runs on the same input differ";
  }
}

// ---------------------------------------------------------------- SwiGLU

TEST(FusedSwiGlu, ForwardAndBackwardMatchCpu) {
  PRIMUS_REQUIRE_GPU();
  for (const auto [n, f] : kShapes) {
    SCOPED_TRACE(testing::Message() << "n=" << n << " f=" << f);
    const auto gu = round_bf16(random_floats(size_t(n * 2 * f), 13, 2.0));
    const auto da = round_bf16(random_floats(size_t(n * f), 14));
    std::vector<float> a_ref(size_t(n * f)), dgu_ref(size_t(n * 2 * f));
    cpu::swiglu_forward<float>(gu.data(), a_ref.data(), n, f);
    cpu::swiglu_backward<float>(da.data(), gu.data(), dgu_ref.data(), n, f);

    auto dgu = upload_bf16(gu), dda = upload_bf16(da);
    DeviceBf16 da_out(size_t(n * f)), ddgu(size_t(n * 2 * f));
    cuda::swiglu_forward(B(dgu), B(da_out), n, f, cuda::stream());
    cuda::swiglu_backward(B(dda), B(dgu), B(ddgu), n, f, cuda::stream());
    expect_close(download_bf16(da_out), a_ref, 1e-2, 1e-2, "swiglu act");
    expect_close(download_bf16(ddgu), dgu_ref, 1e-2, 1e-2, "swiglu dgate_up");
  }
}

// ---------------------------------------------------------------- RoPE

struct RopeCase {
  int64_t head_dim, heads, row_heads, seq, batch, pos0;
};

TEST(FusedRope, MatchesCpuAndInverseUndoesForward) {
  PRIMUS_REQUIRE_GPU();
  // A fused row of row_heads heads of which the first `heads` are rotated (e.g. q of a qkv row).
  const std::vector<RopeCase> cases = {{64, 3, 5, 12, 2, 5},  // vector path
                                       {128, 2, 2, 7, 3, 0},  // vector path, every head rotated
                                       {6, 2, 3, 4, 2, 1},    // half = 3: scalar path
                                       {10, 1, 2, 3, 1, 0}};  // stride % 8 != 0: scalar path
  for (const auto& k : cases) {
    SCOPED_TRACE(testing::Message() << "head_dim=" << k.head_dim << " heads=" << k.heads);
    const int64_t rows = k.seq * k.batch, stride = k.row_heads * k.head_dim, half = k.head_dim / 2;
    const int64_t positions = k.pos0 + k.seq;
    std::vector<float> cos(size_t(positions * half)), sin(size_t(positions * half));
    cpu::rope_tables<float>(cos.data(), sin.data(), positions, k.head_dim, 10000.0, cpu::RopeScaling{});
    const auto x = round_bf16(random_floats(size_t(rows * stride), 15));
    std::vector<float> fwd_ref = x, inv_ref = x;
    cpu::rope_apply<float>(fwd_ref.data(), rows, stride, k.heads, k.head_dim, k.seq, k.pos0, cos.data(), sin.data(),
                           false);
    cpu::rope_apply<float>(inv_ref.data(), rows, stride, k.heads, k.head_dim, k.seq, k.pos0, cos.data(), sin.data(),
                           true);

    DeviceArray<float> dcos(cos), dsin(sin);
    auto dx = upload_bf16(x);
    cuda::rope_apply(B(dx), rows, stride, k.heads, k.head_dim, k.seq, k.pos0, dcos.get(), dsin.get(), false,
                     cuda::stream());
    const auto fwd = download_bf16(dx);
    expect_close(fwd, fwd_ref, 1e-2, 1e-2, "rope forward");
    for (int64_t r = 0; r < rows; ++r)  // heads past `heads` are untouched, bit for bit
      for (int64_t j = k.heads * k.head_dim; j < stride; ++j)
        ASSERT_EQ(fwd[size_t(r * stride + j)], x[size_t(r * stride + j)]) << "row " << r << " column " << j;
    cuda::rope_apply(B(dx), rows, stride, k.heads, k.head_dim, k.seq, k.pos0, dcos.get(), dsin.get(), true,
                     cuda::stream());
    expect_close(download_bf16(dx), x, 2e-2, 2e-2, "rope inverse of forward");

    auto dx2 = upload_bf16(x);
    cuda::rope_apply(B(dx2), rows, stride, k.heads, k.head_dim, k.seq, k.pos0, dcos.get(), dsin.get(), true,
                     cuda::stream());
    expect_close(download_bf16(dx2), inv_ref, 1e-2, 1e-2, "rope inverse");
  }
}

// ---------------------------------------------------------------- Embedding

TEST(EmbeddingGrouping, GroupsPositionsByTokenInOrder) {
  const std::vector<int32_t> tokens = {5, 3, 5, 0, 3, 5};
  const auto g = cuda::EmbeddingGrouping::build(tokens.data(), int64_t(tokens.size()));
  EXPECT_EQ(g.unique_tokens, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(g.offsets, (std::vector<int32_t>{0, 1, 3, 6}));
  EXPECT_EQ(g.positions, (std::vector<int32_t>{3, 1, 4, 0, 2, 5}));
}

TEST(EmbeddingGrouping, EmptyAndSingleAndNegative) {
  const auto e = cuda::EmbeddingGrouping::build(nullptr, 0);
  EXPECT_TRUE(e.unique_tokens.empty());
  EXPECT_EQ(e.offsets, (std::vector<int32_t>{0}));
  EXPECT_TRUE(e.positions.empty());

  const int32_t one = 42;
  const auto s = cuda::EmbeddingGrouping::build(&one, 1);
  EXPECT_EQ(s.unique_tokens, (std::vector<int32_t>{42}));
  EXPECT_EQ(s.offsets, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s.positions, (std::vector<int32_t>{0}));

  // The kernels never see negative ids (checked against the vocabulary first), but the grouping
  // still orders them correctly.
  const std::vector<int32_t> neg = {-1, 2, -1, 2147483647, -2147483647 - 1};
  const auto n = cuda::EmbeddingGrouping::build(neg.data(), int64_t(neg.size()));
  EXPECT_EQ(n.unique_tokens, (std::vector<int32_t>{-2147483647 - 1, -1, 2, 2147483647}));
  EXPECT_EQ(n.offsets, (std::vector<int32_t>{0, 1, 3, 4, 5}));
  EXPECT_EQ(n.positions, (std::vector<int32_t>{4, 0, 2, 1, 3}));
}

TEST(EmbeddingGrouping, EveryPositionOnceWithItsToken) {
  const int64_t n = 5000, vocab = 97;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  const Rng rng(16);
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t(rng.at(uint64_t(i)) % uint64_t(vocab));
  const auto g = cuda::EmbeddingGrouping::build(tokens.data(), n);
  ASSERT_EQ(g.offsets.size(), g.unique_tokens.size() + 1);
  ASSERT_EQ(g.offsets.front(), 0);
  ASSERT_EQ(g.offsets.back(), n);
  std::vector<int> seen(size_t(n), 0);
  for (size_t u = 0; u < g.unique_tokens.size(); ++u) {
    if (u > 0) {
      EXPECT_LT(g.unique_tokens[u - 1], g.unique_tokens[u]);
    }
    EXPECT_LT(g.offsets[u], g.offsets[u + 1]) << "a unique token without positions";
    for (int32_t p = g.offsets[u]; p < g.offsets[u + 1]; ++p) {
      const int32_t pos = g.positions[size_t(p)];
      EXPECT_EQ(tokens[size_t(pos)], g.unique_tokens[u]);
      if (p > g.offsets[u]) {
        EXPECT_LT(g.positions[size_t(p - 1)], pos);
      }
      ++seen[size_t(pos)];
    }
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[size_t(i)], 1) << "position " << i;
}

TEST(FusedEmbedding, ForwardCopiesRowsExactly) {
  PRIMUS_REQUIRE_GPU();
  for (const int64_t c : {int64_t(100), int64_t(4096), int64_t(7)}) {
    SCOPED_TRACE(testing::Message() << "c=" << c);
    const int64_t vocab = 50, n = 37;
    const auto table = round_bf16(random_floats(size_t(vocab * c), 17));
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7) % 11);  // repeats
    tokens[3] = int32_t(vocab - 1);
    std::vector<float> ref(size_t(n * c));
    cpu::embedding_forward<float>(tokens.data(), table.data(), ref.data(), n, vocab, c);
    auto dtable = upload_bf16(table);
    DeviceArray<int32_t> dtok(tokens);
    DeviceBf16 dout(size_t(n * c));
    cuda::embedding_forward(dtok.get(), B(dtable), B(dout), n, c, cuda::stream());
    EXPECT_TRUE(same_bits(download_bf16(dout), ref));
  }
}

TEST(FusedEmbedding, BackwardWithRepeatedTokensEqualsCpuSum) {
  PRIMUS_REQUIRE_GPU();
  for (const int64_t c : {int64_t(100), int64_t(4096), int64_t(7)}) {
    SCOPED_TRACE(testing::Message() << "c=" << c);
    const int64_t vocab = 50, n = 300;
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    const Rng rng(18);
    for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t(rng.at(uint64_t(i)) % 13);  // many repeats
    tokens[7] = int32_t(vocab - 1);
    const auto dout = round_bf16(random_floats(size_t(n * c), 19));
    const auto g = cuda::EmbeddingGrouping::build(tokens.data(), n);
    DeviceArray<int32_t> du(g.unique_tokens), doff(g.offsets), dpos(g.positions);
    auto ddout = upload_bf16(dout);

    // From zero: the same additions in the same (position) order as the CPU kernel: same bits.
    std::vector<float> ref(size_t(vocab * c), 0.f);
    cpu::embedding_backward_weight<float>(tokens.data(), dout.data(), ref.data(), n, vocab, c);
    DeviceArray<float> dtable(size_t(vocab * c));
    cuda::embedding_backward(du.get(), doff.get(), dpos.get(), int64_t(g.unique_tokens.size()), B(ddout),
                             dtable.get(), c, cuda::stream());
    EXPECT_TRUE(same_bits(dtable.host(), ref)) << "embedding gradient from zero differs from the CPU sum";

    // Accumulating into existing gradients.
    const auto init = random_floats(size_t(vocab * c), 20);
    std::vector<float> ref2 = init;
    cpu::embedding_backward_weight<float>(tokens.data(), dout.data(), ref2.data(), n, vocab, c);
    DeviceArray<float> dtable2(init), dtable3(init);
    cuda::embedding_backward(du.get(), doff.get(), dpos.get(), int64_t(g.unique_tokens.size()), B(ddout),
                             dtable2.get(), c, cuda::stream());
    cuda::embedding_backward(du.get(), doff.get(), dpos.get(), int64_t(g.unique_tokens.size()), B(ddout),
                             dtable3.get(), c, cuda::stream());
    const auto got = dtable2.host();
    expect_close(got, ref2, 1e-5, 1e-5, "embedding gradient accumulated");
    EXPECT_TRUE(same_bits(got, dtable3.host()));
  }
}

// ---------------------------------------------------------------- Cross-entropy

struct CeRef {
  std::vector<float> lse;
  double loss = 0;
};

CeRef ce_reference(const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t n, int64_t v) {
  CeRef r;
  r.lse.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, double(logits[size_t(i * v + j)]));
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(double(logits[size_t(i * v + j)]) - mx);
    const double lse = mx + std::log(s);
    r.lse[size_t(i)] = float(lse);
    const int32_t t = targets[size_t(i)];
    if (t >= 0) r.loss += lse - double(logits[size_t(i * v + t)]);
  }
  return r;
}

// Columns [c0, c0 + vc) of an [n, v] matrix, as their own contiguous [n, vc] buffer.
std::vector<float> columns(const std::vector<float>& m, int64_t n, int64_t v, int64_t c0, int64_t vc) {
  std::vector<float> out(size_t(n * vc));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < vc; ++j) out[size_t(i * vc + j)] = m[size_t(i * v + c0 + j)];
  return out;
}

struct CeRun {
  std::vector<float> lse, target_logit, dlogits;  // dlogits as [n, v]
  float loss = 0;
};

// The forward visits the chunks in `order` (default: ascending), as a caller may.
CeRun ce_run(const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t n, int64_t v,
             const std::vector<int64_t>& chunk_sizes, std::vector<size_t> order = {}, float softcap = 0.f) {
  DeviceArray<int32_t> dt(targets);
  const size_t rows = static_cast<size_t>(n);
  DeviceArray<float> rmax(rows), rsum(rows), tl(rows), lse(rows), loss(1);
  cuda::ce_init(rmax.get(), rsum.get(), tl.get(), n, cuda::stream());
  std::vector<std::vector<float>> chunks;
  std::vector<int64_t> starts;
  int64_t c0 = 0;
  for (const int64_t vc : chunk_sizes) {
    chunks.push_back(columns(logits, n, v, c0, vc));
    starts.push_back(c0);
    c0 += vc;
  }
  EXPECT_EQ(c0, v);
  if (order.empty())
    for (size_t k = 0; k < chunk_sizes.size(); ++k) order.push_back(k);
  for (const size_t k : order) {
    DeviceArray<float> dl(chunks[k]);  // exactly n * vc floats: a read past the chunk is outside it
    cuda::ce_chunk_forward(dl.get(), dt.get(), starts[k], chunk_sizes[k], softcap, rmax.get(), rsum.get(), tl.get(), n,
                           cuda::stream());
  }
  cuda::ce_finish(rmax.get(), rsum.get(), tl.get(), dt.get(), lse.get(), loss.get(), n, cuda::stream());
  CeRun r;
  r.lse = lse.host();
  r.target_logit = tl.host();
  r.loss = loss.host()[0];
  r.dlogits.assign(size_t(n * v), NAN);
  for (size_t k = 0; k < chunk_sizes.size(); ++k) {
    const int64_t vc = chunk_sizes[k];
    DeviceArray<float> dl(chunks[k]);
    DeviceBf16 dd(size_t(n * vc));
    cuda::ce_chunk_backward(dl.get(), lse.get(), dt.get(), starts[k], vc, softcap, B(dd), n, cuda::stream());
    const auto g = download_bf16(dd);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < vc; ++j) r.dlogits[size_t(i * v + starts[k] + j)] = g[size_t(i * vc + j)];
  }
  return r;
}

TEST(FusedCrossEntropy, ChunksMatchReferenceAndOneBigChunk) {
  PRIMUS_REQUIRE_GPU();
  const int64_t n = 37, v = 1000;
  const auto logits = random_floats(size_t(n * v), 21, 3.0);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  const Rng rng(22);
  for (int64_t i = 0; i < n; ++i) targets[size_t(i)] = int32_t(rng.at(uint64_t(i)) % uint64_t(v));
  targets[0] = 0;
  targets[1] = int32_t(v - 1);
  targets[2] = 300;  // first column of the second chunk below
  targets[3] = 299;  // last column of the first
  for (int64_t i = 4; i < n; i += 5) targets[size_t(i)] = -1;  // masked
  const CeRef ref = ce_reference(logits, targets, n, v);

  // vc = 300 and 400: vector paths; 301 (odd) and 299: scalar paths.
  const CeRun one = ce_run(logits, targets, n, v, {v});
  const CeRun many = ce_run(logits, targets, n, v, {300, 301, 299, 100});
  const CeRun vec = ce_run(logits, targets, n, v, {400, 600});
  for (const CeRun* r : {&one, &many, &vec}) {
    expect_close(r->lse, ref.lse, 1e-5, 1e-6, "lse");
    EXPECT_NEAR(double(r->loss), ref.loss, 1e-5 * std::abs(ref.loss)) << "loss sum";
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = targets[size_t(i)];
      EXPECT_EQ(r->target_logit[size_t(i)], t >= 0 ? logits[size_t(i * v + t)] : 0.f) << "row " << i;
    }
    std::vector<float> dref(size_t(n * v));
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = targets[size_t(i)];
      for (int64_t j = 0; j < v; ++j)
        dref[size_t(i * v + j)] =
            t < 0 ? 0.f
                  : float(std::exp(double(logits[size_t(i * v + j)]) - double(ref.lse[size_t(i)])) - (j == t ? 1 : 0));
    }
    expect_close(r->dlogits, dref, 4e-3, 1e-2, "dlogits");
    for (int64_t i = 4; i < n; i += 5)
      for (int64_t j = 0; j < v; ++j) ASSERT_EQ(r->dlogits[size_t(i * v + j)], 0.f) << "masked row " << i;
  }
  expect_close(many.lse, one.lse, 1e-6, 1e-6, "chunked lse vs one chunk");
  EXPECT_NEAR(double(many.loss), double(one.loss), 1e-5 * std::abs(double(one.loss)));
}

// Soft-capped logits (Grok's final_logit_softcapping, kernels/softcap.h): the loss of
// cap * tanh(z / cap) and its gradient w.r.t. z, the cap's slope included, on the vector and the
// scalar paths; logits of up to +-4 cap reach the saturated ends of tanh.
TEST(FusedCrossEntropy, SoftcapMatchesReference) {
  PRIMUS_REQUIRE_GPU();
  const int64_t n = 13, v = 96;
  const float cap = 5.f;
  const auto logits = random_floats(size_t(n * v), 41, 8.0);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[size_t(i)] = int32_t((i * 37) % v);
  targets[5] = -1;
  std::vector<float> capped(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) capped[i] = float(ops::softcap(double(logits[i]), double(cap)));
  const CeRef ref = ce_reference(capped, targets, n, v);
  for (const auto& sizes : {std::vector<int64_t>{96}, std::vector<int64_t>{31, 33, 32}}) {
    const CeRun r = ce_run(logits, targets, n, v, sizes, {}, cap);
    expect_close(r.lse, ref.lse, 1e-5, 1e-5, "lse");
    EXPECT_NEAR(double(r.loss), ref.loss, 1e-5 * std::abs(ref.loss)) << "loss sum";
    std::vector<float> dref(size_t(n * v));
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = targets[size_t(i)];
      for (int64_t j = 0; j < v; ++j) {
        const double z = capped[size_t(i * v + j)];
        dref[size_t(i * v + j)] = t < 0 ? 0.f
                                        : float((std::exp(z - double(ref.lse[size_t(i)])) - (j == t ? 1 : 0)) *
                                                ops::softcap_slope(z, double(cap)));
      }
    }
    expect_close(r.dlogits, dref, 4e-3, 1e-2, "dlogits");
  }
  // Soft-capping changes the loss: the uncapped run differs.
  const CeRun plain = ce_run(logits, targets, n, v, {96});
  EXPECT_GT(std::abs(double(plain.loss) - ref.loss), 1.0);
}

// Chunks in any order, with targets on both sides of every chunk edge, the last row's among them:
// a chunk must use exactly its own columns (reading one past its chunk, `<=` for `<`, gives the
// wrong target logit when the next chunk does not come later, and reads past the chunk's buffer
// on the last row).
TEST(FusedCrossEntropy, ChunksInAnyOrderWithTargetsAtTheirEdges) {
  PRIMUS_REQUIRE_GPU();
  const int64_t n = 9, v = 40;
  const auto logits = random_floats(size_t(n * v), 31, 2.0);
  struct Split {
    std::vector<int64_t> sizes;
    std::vector<int32_t> targets;  // the first and last columns of chunks; the last row's the first of chunk 1
  };
  // Chunks of 16 and 8 columns take the vector path, 15 and 9 the scalar one.
  const std::vector<Split> splits = {{{16, 8, 16}, {16, 15, 24, 23, 0, 39, -1, 8, 16}},
                                     {{15, 9, 16}, {15, 14, 24, 23, 0, 39, -1, 7, 15}}};
  for (const Split& sp : splits) {
    const CeRef ref = ce_reference(logits, sp.targets, n, v);
    for (const auto& order :
         {std::vector<size_t>{0, 1, 2}, std::vector<size_t>{2, 1, 0}, std::vector<size_t>{1, 2, 0}}) {
      SCOPED_TRACE(testing::Message() << "chunks " << sp.sizes[0] << "," << sp.sizes[1] << "," << sp.sizes[2]
                                      << " in the order " << order[0] << order[1] << order[2]);
      const CeRun r = ce_run(logits, sp.targets, n, v, sp.sizes, order);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t t = sp.targets[size_t(i)];
        EXPECT_EQ(r.target_logit[size_t(i)], t >= 0 ? logits[size_t(i * v + t)] : 0.f) << "row " << i;
      }
      expect_close(r.lse, ref.lse, 1e-5, 1e-6, "lse");
      EXPECT_NEAR(double(r.loss), ref.loss, 1e-5 * std::abs(ref.loss)) << "loss sum";
    }
  }
}

TEST(FusedCrossEntropy, LossSumOverManyRowsIsDeterministic) {
  PRIMUS_REQUIRE_GPU();
  const int64_t n = 5000, v = 12;  // several 2048-row blocks in ce_finish
  const auto logits = random_floats(size_t(n * v), 23, 2.0);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[size_t(i)] = i % 7 == 0 ? -1 : int32_t(i % v);
  const CeRef ref = ce_reference(logits, targets, n, v);
  const CeRun a = ce_run(logits, targets, n, v, {8, 4});
  const CeRun b = ce_run(logits, targets, n, v, {8, 4});
  EXPECT_NEAR(double(a.loss), ref.loss, 1e-5 * std::abs(ref.loss));
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(float)), 0) << "two runs give different loss bits";
  expect_close(a.lse, ref.lse, 1e-5, 1e-6, "lse");

  // No rows: the sum is written as 0.
  DeviceArray<float> loss(std::vector<float>{123.f});
  cuda::ce_finish(nullptr, nullptr, nullptr, nullptr, nullptr, loss.get(), 0, cuda::stream());
  EXPECT_EQ(loss.host()[0], 0.f);
}

// ---------------------------------------------------------------- Casts

TEST(FusedCast, RoundTripsMatchHostRounding) {
  PRIMUS_REQUIRE_GPU();
  for (const int64_t n : {int64_t(1003), int64_t(4096), int64_t(5)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto x = random_floats(size_t(n), 24, 10.0);
    DeviceArray<float> dx(x);
    DeviceBf16 db(static_cast<size_t>(n));
    cuda::cast_f32_to_bf16(dx.get(), B(db), n, cuda::stream());
    EXPECT_EQ(db.host(), to_bf16_bits(x)) << "fp32 -> bf16 (round to nearest even)";
    DeviceArray<float> back(static_cast<size_t>(n));
    cuda::cast_bf16_to_f32(B(db), back.get(), n, cuda::stream());
    EXPECT_TRUE(same_bits(back.host(), round_bf16(x)));
    // Misaligned by one element: the scalar path.
    DeviceBf16 db2(static_cast<size_t>(n));
    cuda::cast_f32_to_bf16(dx.get() + 1, B(db2) + 1, n - 1, cuda::stream());
    const auto got = db2.host();
    const auto want = to_bf16_bits(x);
    EXPECT_EQ(got[0], 0u);
    for (int64_t i = 1; i < n; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << i;
  }
}

// ---------------------------------------------------------------- AdamW and sums of squares

struct OptCase {
  std::vector<ParamSegment> segments;
  int64_t numel;
};

// Segments over several 4096-element tiles, with gaps (untouched), offsets that are and are not
// multiples of 4 (vector and scalar tiles), both decay flags, and a segment shorter than a vector.
OptCase opt_case() {
  OptCase k;
  k.segments = {{"w0", 0, 4096 + 5, true},  {"b0", 4104, 1000, false}, {"n0", 5106, 7, false},
                {"w1", 5200, 9001, true}, {"w2", 14210, 3, true}};
  k.numel = 14300;
  return k;
}

std::vector<AdamWChunk> to_chunks(const std::vector<ParamSegment>& segs) {
  std::vector<AdamWChunk> out;
  for (const auto& s : segs) out.push_back({s.offset, s.numel, s.weight_decay ? 1 : 0, 0});
  return out;
}

void run_adamw_case(float wd, float grad_scale, bool with_bf16) {
  const OptCase k = opt_case();
  const int64_t N = k.numel;
  const auto p0 = random_floats(size_t(N), 25);
  const std::vector<AdamWChunk> chunks = to_chunks(k.segments);
  DeviceArray<AdamWChunk> dchunks(chunks);
  DeviceArray<float> dp(p0), dm(static_cast<size_t>(N)), dv(static_cast<size_t>(N));
  const uint16_t sentinel = 0x1234;
  DeviceBf16 dpb(std::vector<uint16_t>(size_t(N), sentinel));

  // The CPU optimizer with float-representable options, so both sides derive the same constants.
  AdamWOptions o;
  o.beta1 = double(0.9f);
  o.beta2 = double(0.95f);
  o.eps = double(1e-8f);
  o.weight_decay = double(wd);
  AdamW cpu_opt(o, N);
  std::vector<float> p_cpu = p0;
  const float lr = 3e-3f;

  for (int step = 1; step <= 3; ++step) {
    const auto g = random_floats(size_t(N), 100 + uint64_t(step));
    std::vector<float> g_scaled(g.size());
    for (size_t i = 0; i < g.size(); ++i) g_scaled[i] = g[i] * grad_scale;  // one float rounding, as the kernel
    cpu_opt.step(p_cpu.data(), g_scaled.data(), k.segments, double(lr));

    DeviceArray<float> dg(g);
    cuda::AdamWParams prm;
    prm.lr = lr;
    prm.beta1 = 0.9f;
    prm.beta2 = 0.95f;
    prm.eps = 1e-8f;
    prm.weight_decay = wd;
    prm.step = step;
    prm.grad_scale = grad_scale;
    cuda::adamw_step(dp.get(), dg.get(), dm.get(), dv.get(), with_bf16 ? B(dpb) : nullptr, dchunks.get(),
                     int(chunks.size()), prm, cuda::stream());
  }
  const auto p = dp.host(), m = dm.host(), v = dv.host();
  const std::vector<float> m_cpu(cpu_opt.exp_avg(), cpu_opt.exp_avg() + N);
  const std::vector<float> v_cpu(cpu_opt.exp_avg_sq(), cpu_opt.exp_avg_sq() + N);
  expect_close(p, p_cpu, 1e-7, 2e-6, "params");
  expect_close(m, m_cpu, 1e-9, 2e-6, "exp_avg");
  expect_close(v, v_cpu, 1e-12, 2e-6, "exp_avg_sq");
  size_t exact = 0;
  for (int64_t i = 0; i < N; ++i) exact += std::memcmp(&p[size_t(i)], &p_cpu[size_t(i)], sizeof(float)) == 0;
  std::printf("[ info     ] AdamW (wd %g, grad_scale %g): %zu of %lld params bit-identical to the CPU step\n",
              double(wd), double(grad_scale), exact, (long long)N);

  std::vector<char> inside(size_t(N), 0);
  for (const auto& s : k.segments)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) inside[size_t(i)] = 1;
  const auto pb = dpb.host();
  for (int64_t i = 0; i < N; ++i) {
    if (!inside[size_t(i)]) {
      ASSERT_EQ(std::memcmp(&p[size_t(i)], &p0[size_t(i)], sizeof(float)), 0) << "gap element " << i << " changed";
      ASSERT_EQ(m[size_t(i)], 0.f) << i;
      ASSERT_EQ(v[size_t(i)], 0.f) << i;
      ASSERT_EQ(pb[size_t(i)], sentinel) << "bf16 copy written outside the chunks at " << i;
    } else if (with_bf16) {
      ASSERT_EQ(pb[size_t(i)], bf16::from_float(p[size_t(i)]).bits) << "bf16 copy of element " << i;
    } else {
      ASSERT_EQ(pb[size_t(i)], sentinel) << "bf16 copy written although none was asked for";
    }
  }
}

TEST(FusedAdamW, MatchesCpuOverSeveralChunksWithDecay) {
  PRIMUS_REQUIRE_GPU();
  run_adamw_case(0.1f, 1.0f, true);
}

TEST(FusedAdamW, MatchesCpuWithoutDecayOrBf16Copy) {
  PRIMUS_REQUIRE_GPU();
  run_adamw_case(0.0f, 1.0f, false);
}

TEST(FusedAdamW, MatchesCpuWithGradScale) {
  PRIMUS_REQUIRE_GPU();
  run_adamw_case(0.1f, 0.37f, true);
}

// The precision-aware optimizer's state (optim/adamw.h): bf16, fp16 and E4M3 moments and bf16 or
// fp16-master parameters, against the CPU optimizer with the same options. Both compute in fp32
// from the stored values, with the same fused multiply-adds as the fp32 step (which agrees bit for
// bit, above), and store as the storage says: bf16 to nearest even, fp16 / E4M3 codes with each
// chunk's scale from the amax of its updated moment (kernels/adam_state.h; the GPU takes the amax
// with atomics over many blocks, the CPU in one loop). Every value read back, and every
// parameter, equals the CPU's bit for bit.
DType dtype_of_storage(cuda::StateStorage s) {
  switch (s) {
    case cuda::StateStorage::BF16: return DType::BF16;
    case cuda::StateStorage::F16: return DType::F16;
    case cuda::StateStorage::E4M3: return DType::F8E4M3;
    default: return DType::F32;
  }
}

void run_adamw_state_case(cuda::StateStorage ms, cuda::StateStorage vs, cuda::ParamStorage ps,
                          float grad_scale = 1.0f) {
  const OptCase k = opt_case();
  const int64_t N = k.numel;
  const auto p0 = random_floats(size_t(N), 31);
  std::vector<float> p_init(p0);
  if (ps == cuda::ParamStorage::BF16)
    for (float& x : p_init) x = bf16::from_float(x).to_float();
  const std::vector<AdamWChunk> chunks = to_chunks(k.segments);
  DeviceArray<AdamWChunk> dchunks(chunks);
  const DType md = dtype_of_storage(ms), vd = dtype_of_storage(vs);
  // Each moment's codes (zeros), as raw bytes of its size; the scales start at 1 (TE's).
  DeviceArray<float> dp(p_init);
  DeviceArray<uint8_t> dm(std::vector<uint8_t>(size_t(N) * dtype_size(md), 0));
  DeviceArray<uint8_t> dv(std::vector<uint8_t>(size_t(N) * dtype_size(vd), 0));
  DeviceArray<float> dscales(std::vector<float>(2 * chunks.size(), 1.0f));
  DeviceBf16 dwork(std::vector<uint16_t>(size_t(N), 0));
  AdamWOptions o;
  o.beta1 = double(0.9f);
  o.beta2 = double(0.95f);
  o.eps = double(1e-8f);
  o.weight_decay = double(0.1f);
  o.exp_avg_dtype = md;
  o.exp_avg_sq_dtype = vd;
  o.main_params_dtype = ps == cuda::ParamStorage::BF16        ? DType::BF16
                        : ps == cuda::ParamStorage::F16Master ? DType::F16
                                                              : DType::F32;
  AdamW cpu_opt(o, N);
  std::vector<float> p_cpu = p_init;
  std::vector<bf16> w_cpu(static_cast<size_t>(N));
  for (int step = 1; step <= 3; ++step) {
    const auto g = random_floats(size_t(N), 200 + uint64_t(step));
    std::vector<float> g_cpu = g;
    cpu_opt.step(p_cpu.data(), g_cpu.data(), k.segments, 3e-3, w_cpu.data(), grad_scale);
    DeviceArray<float> dg(g);
    cuda::AdamWParams prm;
    prm.lr = 3e-3;
    prm.beta1 = 0.9f;
    prm.beta2 = 0.95f;
    prm.eps = 1e-8f;
    prm.weight_decay = 0.1f;
    prm.step = step;
    prm.grad_scale = grad_scale;
    prm.exp_avg = ms;
    prm.exp_avg_sq = vs;
    prm.params = ps;
    prm.state_scales = dscales.get();
    cuda::adamw_step(dp.get(), dg.get(), dm.get(), dv.get(), B(dwork), dchunks.get(), int(chunks.size()), prm,
                     cuda::stream());
  }
  // The device's moments as values: its codes with its scales, read as the host reads them.
  const std::vector<float> scales = dscales.host();
  auto values = [&](const std::vector<uint8_t>& raw, DType d, bool second) {
    std::vector<float> out(static_cast<size_t>(N), 0.0f);
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int64_t o0 = chunks[c].offset, n = chunks[c].numel;
      const uint8_t* at = raw.data() + size_t(o0) * dtype_size(d);
      for (int64_t i = 0; i < n; ++i) {
        float& x = out[size_t(o0 + i)];
        if (d == DType::F32)
          std::memcpy(&x, at + 4 * i, 4);
        else if (d == DType::BF16)
          x = bf16{uint16_t(at[2 * i] | at[2 * i + 1] << 8)}.to_float();
      }
      if (scaled_state(d)) read_scaled_state(d, at, n, scales[2 * c + (second ? 1 : 0)], out.data() + o0);
    }
    return out;
  };
  const std::vector<float> p = dp.host(), m = values(dm.host(), md, false), v = values(dv.host(), vd, true);
  std::vector<float> m_cpu(static_cast<size_t>(N)), v_cpu(static_cast<size_t>(N));
  cpu_opt.moment(false, 0, N, m_cpu.data());
  cpu_opt.moment(true, 0, N, v_cpu.data());
  const struct {
    const char* name;
    const std::vector<float>& got;
    const std::vector<float>& want;
  } arrays[] = {{"params", p, p_cpu}, {"exp_avg", m, m_cpu}, {"exp_avg_sq", v, v_cpu}};
  for (const auto& a : arrays) {
    size_t exact = 0;
    for (int64_t i = 0; i < N; ++i) exact += std::memcmp(&a.got[size_t(i)], &a.want[size_t(i)], sizeof(float)) == 0;
    EXPECT_EQ(exact, size_t(N)) << a.name << ": bit-identical to the CPU step";
  }
  const std::vector<uint16_t> w = dwork.host();
  for (const auto& s : k.segments)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) ASSERT_EQ(w[size_t(i)], w_cpu[size_t(i)].bits) << i;
}

TEST(FusedAdamW, Bf16MomentsMatchTheCpuStep) {
  PRIMUS_REQUIRE_GPU();
  using S = cuda::StateStorage;
  run_adamw_state_case(S::BF16, S::BF16, cuda::ParamStorage::F32);
  run_adamw_state_case(S::BF16, S::F32, cuda::ParamStorage::F32);
  run_adamw_state_case(S::F32, S::BF16, cuda::ParamStorage::F32);
}

TEST(FusedAdamW, Bf16ParametersMatchTheCpuStep) {
  PRIMUS_REQUIRE_GPU();
  run_adamw_state_case(cuda::StateStorage::BF16, cuda::StateStorage::BF16, cuda::ParamStorage::BF16);
}

// fp16 and E4M3 moments (Transformer Engine's scaled states), alone and mixed, with the clipping
// factor folded in, and TE's fp16 master weights.
TEST(FusedAdamW, ScaledMomentsMatchTheCpuStep) {
  PRIMUS_REQUIRE_GPU();
  using S = cuda::StateStorage;
  run_adamw_state_case(S::F16, S::F16, cuda::ParamStorage::F32);
  run_adamw_state_case(S::E4M3, S::E4M3, cuda::ParamStorage::F32, 0.37f);
  run_adamw_state_case(S::E4M3, S::F16, cuda::ParamStorage::F32);
  run_adamw_state_case(S::F32, S::E4M3, cuda::ParamStorage::F32);
}

TEST(FusedAdamW, Fp16MasterMatchesTheCpuStep) {
  PRIMUS_REQUIRE_GPU();
  run_adamw_state_case(cuda::StateStorage::F32, cuda::StateStorage::F32, cuda::ParamStorage::F16Master);
  run_adamw_state_case(cuda::StateStorage::E4M3, cuda::StateStorage::F16, cuda::ParamStorage::F16Master, 0.37f);
}

TEST(FusedAdamW, NoChunksIsANoOp) {
  PRIMUS_REQUIRE_GPU();
  DeviceArray<float> p(std::vector<float>{1.f, 2.f});
  cuda::AdamWParams prm;
  prm.lr = 1.f;
  cuda::adamw_step(p.get(), p.get(), p.get(), p.get(), nullptr, nullptr, 0, prm, cuda::stream());
  EXPECT_EQ(p.host(), (std::vector<float>{1.f, 2.f}));
}

TEST(FusedSumSquares, MatchesFp64AndIsDeterministic) {
  PRIMUS_REQUIRE_GPU();
  const OptCase k = opt_case();
  const auto x = random_floats(size_t(k.numel), 26, 3.0);
  const auto chunks = to_chunks(k.segments);
  double ref = 0;
  for (const auto& s : k.segments)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) ref += double(x[size_t(i)]) * double(x[size_t(i)]);
  DeviceArray<float> dx(x);
  DeviceArray<AdamWChunk> dchunks(chunks);
  DeviceArray<double> a(1), b(1);
  cuda::sum_squares(dx.get(), dchunks.get(), int(chunks.size()), a.get(), cuda::stream());
  cuda::sum_squares(dx.get(), dchunks.get(), int(chunks.size()), b.get(), cuda::stream());
  const double got = a.host()[0], again = b.host()[0];
  EXPECT_NEAR(got, ref, 1e-12 * ref);
  EXPECT_EQ(std::memcmp(&got, &again, sizeof(double)), 0) << "two runs give different bits";

  // A range list that is all empty, and no ranges at all: 0.
  const std::vector<AdamWChunk> empty = {{10, 0, 1, 0}};
  DeviceArray<AdamWChunk> de(empty);
  DeviceArray<double> c(std::vector<double>{5.0});
  cuda::sum_squares(dx.get(), de.get(), 1, c.get(), cuda::stream());
  EXPECT_EQ(c.host()[0], 0.0);
  DeviceArray<double> d(std::vector<double>{5.0});
  cuda::sum_squares(dx.get(), nullptr, 0, d.get(), cuda::stream());
  EXPECT_EQ(d.host()[0], 0.0);
}

// ---------------------------------------------------------------- offsets past 2^31 elements

// A flat buffer of an 8B model has more than 2^31 elements: the optimizer, the gradient norm and
// the casts must index it in 64 bits. Buffers of 2^31 + 2^22 floats (about 40 GB in all, so a
// GPU test needs a large GPU; on the emulated GPU they are sparse and only the touched pages cost
// memory), and ranges just below, across and far above 2^31, aligned and not. Only the ranges and
// a few sentinel elements around each are written; the CPU optimizer runs on a compact copy.
class LargeOffsets : public testing::Test {
 protected:
  static constexpr int64_t kN = (int64_t(1) << 31) + (int64_t(1) << 22);
  static constexpr int kGuard = 8;  // sentinels on each side of a range
  static constexpr float kSentinel = 12345.f;

  void SetUp() override {
    PRIMUS_REQUIRE_GPU();
    for (float** b : {&p, &g, &m, &v}) {
      if (cudaMalloc(reinterpret_cast<void**>(b), size_t(kN) * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        GTEST_SKIP() << "needs 4 buffers of " << kN << " floats and one of bf16 on the GPU";
      }
    }
    if (cudaMalloc(reinterpret_cast<void**>(&pb), size_t(kN) * 2) != cudaSuccess) {
      cudaGetLastError();
      GTEST_SKIP() << "needs 40 GB on the GPU";
    }
  }
  void TearDown() override {
    for (void* b : {static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(m), static_cast<void*>(v),
                    static_cast<void*>(pb)})
      if (b) cudaFree(b);
  }
  template <typename T>
  void put(T* dev, int64_t at, const std::vector<T>& host) {
    cuda::copy_to_device(dev + at, host.data(), host.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> get(const T* dev, int64_t at, int64_t count) {
    std::vector<T> out(static_cast<size_t>(count));
    cuda::copy_to_host(out.data(), dev + at, out.size() * sizeof(T));
    return out;
  }

  float *p = nullptr, *g = nullptr, *m = nullptr, *v = nullptr;
  uint16_t* pb = nullptr;
  // Across 2^31 (unaligned start), at 2^31 + 2^21 (aligned), far above with a scalar tail.
  const std::vector<ParamSegment> segments = {{"across", (int64_t(1) << 31) - 3 * 4096 - 3, 5 * 4096 + 11, true},
                                              {"aligned", (int64_t(1) << 31) + (int64_t(1) << 21), 2 * 4096, false},
                                              {"high", kN - 4096 - 101, 4096 + 7, true}};
};

TEST_F(LargeOffsets, AdamWSumOfSquaresAndCasts) {
  // Compact host copies of the ranges, and their sentinels on the device.
  int64_t total = 0;
  for (const auto& s : segments) total += s.numel;
  const auto p0 = random_floats(size_t(total), 41), g0 = random_floats(size_t(total), 42);
  std::vector<ParamSegment> compact;
  int64_t at = 0;
  const std::vector<float> sentinels(kGuard, kSentinel);
  for (const auto& s : segments) {
    compact.push_back({s.name, at, s.numel, s.weight_decay});
    put(p, s.offset, std::vector<float>(p0.begin() + at, p0.begin() + at + s.numel));
    put(g, s.offset, std::vector<float>(g0.begin() + at, g0.begin() + at + s.numel));
    put(m, s.offset, std::vector<float>(size_t(s.numel), 0.f));
    put(v, s.offset, std::vector<float>(size_t(s.numel), 0.f));
    for (float* b : {p, m, v}) {
      put(b, s.offset - kGuard, sentinels);
      put(b, s.offset + s.numel, sentinels);
    }
    put(pb, s.offset - kGuard, std::vector<uint16_t>(2 * kGuard + size_t(s.numel), 0x1234));
    at += s.numel;
  }
  const std::vector<AdamWChunk> chunks = to_chunks(segments);
  DeviceArray<AdamWChunk> dchunks(chunks);

  // Two AdamW steps, against the CPU optimizer on the compact copy.
  AdamWOptions o;
  o.beta1 = double(0.9f);
  o.beta2 = double(0.95f);
  o.eps = double(1e-8f);
  o.weight_decay = double(0.1f);
  AdamW cpu_opt(o, total);
  std::vector<float> p_cpu = p0;
  const float lr = 1e-3f;
  for (int step = 1; step <= 2; ++step) {
    cpu_opt.step(p_cpu.data(), g0.data(), compact, double(lr));
    cuda::AdamWParams prm;
    prm.lr = lr;
    prm.beta1 = 0.9f;
    prm.beta2 = 0.95f;
    prm.eps = 1e-8f;
    prm.weight_decay = 0.1f;
    prm.step = step;
    cuda::adamw_step(p, g, m, v, reinterpret_cast<dbf16*>(pb), dchunks.get(), int(chunks.size()), prm, cuda::stream());
  }
  for (size_t k = 0; k < segments.size(); ++k) {
    const auto& s = segments[k];
    SCOPED_TRACE(s.name);
    const auto got_p = get(p, s.offset, s.numel);
    const std::vector<float> want_p(p_cpu.begin() + compact[k].offset, p_cpu.begin() + compact[k].offset + s.numel);
    expect_close(got_p, want_p, 1e-7, 2e-6, "params");
    const std::vector<float> want_m(cpu_opt.exp_avg() + compact[k].offset,
                                    cpu_opt.exp_avg() + compact[k].offset + s.numel);
    expect_close(get(m, s.offset, s.numel), want_m, 1e-9, 2e-6, "exp_avg");
    const auto got_b = get(pb, s.offset, s.numel);
    for (int64_t i = 0; i < s.numel; ++i)
      ASSERT_EQ(got_b[size_t(i)], bf16::from_float(got_p[size_t(i)]).bits) << "bf16 copy of element " << i;
    for (float* b : {p, m, v}) {
      EXPECT_EQ(get(b, s.offset - kGuard, kGuard), sentinels) << "written before the range";
      EXPECT_EQ(get(b, s.offset + s.numel, kGuard), sentinels) << "written after the range";
    }
    EXPECT_EQ(get(pb, s.offset - kGuard, kGuard), std::vector<uint16_t>(kGuard, 0x1234));
    EXPECT_EQ(get(pb, s.offset + s.numel, kGuard), std::vector<uint16_t>(kGuard, 0x1234));
  }

  // The sum of squares of the gradients over the same ranges (fp64, fixed order).
  double ref = 0;
  for (const float x : g0) ref += double(x) * double(x);
  DeviceArray<double> sq(size_t{1});
  cuda::sum_squares(g, dchunks.get(), int(chunks.size()), sq.get(), cuda::stream());
  EXPECT_NEAR(sq.host()[0], ref, 1e-12 * ref);

  // Casts of the high range, both ways.
  const auto& hi = segments.back();
  cuda::cast_f32_to_bf16(g + hi.offset, reinterpret_cast<dbf16*>(pb) + hi.offset, hi.numel, cuda::stream());
  const std::vector<float> g_hi(g0.end() - hi.numel, g0.end());
  EXPECT_EQ(get(pb, hi.offset, hi.numel), to_bf16_bits(g_hi));
  cuda::cast_bf16_to_f32(reinterpret_cast<dbf16*>(pb) + hi.offset, m + hi.offset, hi.numel, cuda::stream());
  EXPECT_TRUE(same_bits(get(m, hi.offset, hi.numel), round_bf16(g_hi)));
}

TEST(FusedKernels, ZeroRowsAreNoOps) {
  PRIMUS_REQUIRE_GPU();
  // n == 0 must launch nothing (a zero-block launch is an error) and touch nothing.
  DeviceArray<float> f(std::vector<float>{7.f});
  cuda::rmsnorm_forward(nullptr, nullptr, nullptr, nullptr, 0, 64, 1e-5f, cuda::stream());
  cuda::rmsnorm_backward_input(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 64, cuda::stream());
  cuda::rmsnorm_backward_weight(nullptr, nullptr, nullptr, f.get(), 0, 1, cuda::stream());
  cuda::column_sum_accumulate(nullptr, f.get(), 0, 1, cuda::stream());
  cuda::swiglu_forward(nullptr, nullptr, 0, 64, cuda::stream());
  cuda::swiglu_backward(nullptr, nullptr, nullptr, 0, 64, cuda::stream());
  cuda::rope_apply(nullptr, 0, 64, 1, 64, 1, 0, nullptr, nullptr, false, cuda::stream());
  cuda::embedding_forward(nullptr, nullptr, nullptr, 0, 64, cuda::stream());
  cuda::embedding_backward(nullptr, nullptr, nullptr, 0, nullptr, nullptr, 64, cuda::stream());
  cuda::ce_init(nullptr, nullptr, nullptr, 0, cuda::stream());
  cuda::ce_chunk_forward(nullptr, nullptr, 0, 64, 0.f, nullptr, nullptr, nullptr, 0, cuda::stream());
  cuda::ce_chunk_backward(nullptr, nullptr, nullptr, 0, 64, 0.f, nullptr, 0, cuda::stream());
  cuda::cast_f32_to_bf16(nullptr, nullptr, 0, cuda::stream());
  cuda::cast_bf16_to_f32(nullptr, nullptr, 0, cuda::stream());
  cuda::synchronize();
  EXPECT_EQ(f.host()[0], 7.f);
}

}  // namespace
}  // namespace primus
