#include "kernels/cpu/bf16/bf16_backend.h"

#include <algorithm>

#include <fmt/ranges.h>

#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/bf16/kernels.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/reference_backend.h"
#include "kernels/cross_entropy.h"
#include "kernels/fp8_bands.h"
#include "kernels/row_ops.h"

namespace primus::cpu {

namespace {

void expect(const Tensor& t, DType dtype, const char* what) {
  check_host(t, what);
  PRIMUS_CHECK(t.dtype() == dtype, "{} is {}, expected {}", what, dtype_name(t.dtype()), dtype_name(dtype));
}

void expect(const Tensor& t, DType dtype, int64_t numel, const char* what) {
  expect(t, dtype, what);
  PRIMUS_CHECK(t.numel() == numel, "{} has {} elements ({}), expected {}", what, t.numel(), t.shape_str(), numel);
}

uint16_t* U(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data<bf16>()); }
float* F(const Tensor& t) { return t.data<float>(); }

// The checks of a cross-entropy gradient's operands (fp32 logits [n, vc], lse and targets [n],
// dlogits of the logits' size in bf16 or fp32) and dlogits as the kernels take it: one pointer set.
struct CeDlogits {
  uint16_t* bf16 = nullptr;
  float* f32 = nullptr;
};
CeDlogits ce_dlogits(const Tensor& logits, const Tensor& lse, const Tensor& targets, Tensor& dlogits) {
  expect(logits, DType::F32, "ce logits");
  const int64_t n = logits.size(0), vc = logits.size(1);
  expect(lse, DType::F32, n, "ce lse");
  expect(targets, DType::I32, n, "ce targets");
  check_host(dlogits, "ce dlogits");
  PRIMUS_CHECK(dlogits.numel() == n * vc, "ce dlogits {} for logits {}", dlogits.shape_str(), logits.shape_str());
  if (dlogits.dtype() == DType::BF16) return {U(dlogits), nullptr};
  expect(dlogits, DType::F32, "ce dlogits");
  return {nullptr, F(dlogits)};
}

// quantize_fp8's bands (kernels/fp8_bands.h) through bf16k::fp8_quantize.
class Avx512Fp8Bands final : public ops::Fp8BandKernel {
 public:
  float amax(const Tensor& src, int64_t i0, int64_t n) const override { return bf16k::fp8_amax(U(src) + i0, n); }
  float quantize(const Tensor& src, int64_t r0, int64_t rows, const ops::Fp8Request& r, float scale,
                 Tensor& dst) const override {
    const int64_t cols = src.size(1);
    return bf16k::fp8_quantize(U(src) + r0 * cols, rows, cols, r.format, r.granularity, r.reduce_cols, scale,
                               U(dst) + r0 * cols);
  }
};


}  // namespace

bool Bf16Backend::supported(std::string* why_not) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_bf16_usable()) return true;
  if (why_not)
    *why_not = !f.avx512() ? "this CPU (or its OS) has no AVX-512" : "this CPU has AVX-512 but no AVX512-BF16";
  return false;
}

Bf16Backend::Bf16Backend() {
  std::string why;
  if (!supported(&why)) fail("the CPU bf16 backend cannot run here: {}", why);
}

std::string Bf16Backend::name() const {
  return cpu_features().amx_usable() ? "cpu-bf16 (AMX through oneDNN, AVX512-BF16)" : "cpu-bf16 (AVX512-BF16)";
}

namespace {

// The checked arguments of one bf16 GEMM (backend.h's contract).
bf16k::GemmArgs gemm_args(bool ta, bool tb, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
                          Tensor& D, const Tensor& bias) {
  PRIMUS_CHECK(A.dim() == 2 && B.dim() == 2 && D.dim() == 2, "gemm takes 2-d tensors");
  expect(A, DType::BF16, "gemm A");
  expect(B, DType::BF16, "gemm B");
  check_host(D, "gemm D");
  PRIMUS_CHECK(D.dtype() == DType::BF16 || D.dtype() == DType::F32, "gemm D is {}: bf16 or fp32", dtype_name(D.dtype()));
  const int64_t M = ta ? A.size(1) : A.size(0), K = ta ? A.size(0) : A.size(1);
  const int64_t N = tb ? B.size(0) : B.size(1);
  PRIMUS_CHECK((tb ? B.size(1) : B.size(0)) == K, "gemm inner dimensions {} and {} differ", K,
               tb ? B.size(1) : B.size(0));
  PRIMUS_CHECK(D.size(0) == M && D.size(1) == N, "gemm output {} for a [{}, {}] product", D.shape_str(), M, N);
  bf16k::GemmArgs g;
  g.trans_a = ta, g.trans_b = tb;
  g.M = M, g.N = N, g.K = K;
  g.alpha = alpha, g.beta = beta;
  g.A = U(A), g.lda = A.size(1);
  g.B = U(B), g.ldb = B.size(1);
  g.D = D.raw();
  g.f32_out = D.dtype() == DType::F32;
  if (beta != 0.0f) {
    check_host(C, "gemm C");
    PRIMUS_CHECK(C.shape() == D.shape() && C.dtype() == D.dtype(), "gemm C ({} {}) must match D ({} {})",
                 dtype_name(C.dtype()), C.shape_str(), dtype_name(D.dtype()), D.shape_str());
    g.C = C.raw();
  }
  if (bias.defined()) {
    expect(bias, DType::BF16, N, "gemm bias");
    g.bias = U(bias);
  }
  return g;
}

}  // namespace

void Bf16Backend::gemm(bool ta, bool tb, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
                       Tensor& D, const Tensor& bias) {
  bf16k::gemm(gemm_args(ta, tb, alpha, A, B, beta, C, D, bias));
}

void Bf16Backend::grouped_gemm(bool ta, bool tb, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                               const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
  PRIMUS_CHECK(A.size() == B.size() && A.size() == D.size() && alpha.size() == A.size(),
               "grouped_gemm of {} A, {} B, {} D and {} alphas", A.size(), B.size(), D.size(), alpha.size());
  std::vector<bf16k::GemmArgs> args;
  args.reserve(A.size());
  for (size_t i = 0; i < A.size(); ++i)
    args.push_back(gemm_args(ta, tb, alpha[i], A[i], B[i], beta, beta != 0.0f ? D[i] : Tensor(), D[i], Tensor()));
  bf16k::gemm_grouped(args.data(), int64_t(args.size()));
}

void Bf16Backend::rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) {
  expect(x, DType::BF16, "rmsnorm x");
  const int64_t n = x.size(0), c = x.size(1);
  expect(w, DType::BF16, c, "rmsnorm w");
  expect(y, DType::BF16, n * c, "rmsnorm y");
  expect(rstd, DType::F32, n, "rmsnorm rstd");
  bf16k::rmsnorm_forward(U(x), U(w), U(y), F(rstd), n, c, eps);
}

void Bf16Backend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                         const Tensor& residual, Tensor& dx) {
  expect(x, DType::BF16, "rmsnorm x");
  const int64_t n = x.size(0), c = x.size(1);
  expect(dy, DType::BF16, n * c, "rmsnorm dy");
  expect(w, DType::BF16, c, "rmsnorm w");
  expect(rstd, DType::F32, n, "rmsnorm rstd");
  expect(dx, DType::BF16, n * c, "rmsnorm dx");
  if (residual.defined()) expect(residual, DType::BF16, n * c, "rmsnorm residual");
  bf16k::rmsnorm_backward_input(U(dy), U(x), U(w), F(rstd), residual.defined() ? U(residual) : nullptr, U(dx), n, c);
}

void Bf16Backend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) {
  expect(x, DType::BF16, "rmsnorm x");
  const int64_t n = x.size(0), c = x.size(1);
  expect(dy, DType::BF16, n * c, "rmsnorm dy");
  expect(rstd, DType::F32, n, "rmsnorm rstd");
  expect(dw, DType::F32, c, "rmsnorm dw");
  bf16k::rmsnorm_backward_weight(U(dy), U(x), F(rstd), F(dw), n, c);
}

void Bf16Backend::glu_forward(const Tensor& gate_up, Tensor& act, const ops::Glu& glu) {
  if (!glu.plain()) return ReferenceBackend().glu_forward(gate_up, act, glu);  // the same contract, unvectorised
  expect(act, DType::BF16, "swiglu act");
  const int64_t n = act.size(0), f = act.size(1);
  expect(gate_up, DType::BF16, 2 * n * f, "swiglu gate_up");
  bf16k::swiglu_forward(U(gate_up), U(act), n, f);
}

void Bf16Backend::glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const ops::Glu& glu) {
  if (!glu.plain()) return ReferenceBackend().glu_backward(dact, gate_up, dgate_up, glu);
  expect(dact, DType::BF16, "swiglu dact");
  const int64_t n = dact.size(0), f = dact.size(1);
  expect(gate_up, DType::BF16, 2 * n * f, "swiglu gate_up");
  expect(dgate_up, DType::BF16, 2 * n * f, "swiglu dgate_up");
  bf16k::swiglu_backward(U(dact), U(gate_up), U(dgate_up), n, f);
}

void Bf16Backend::rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                             const Tensor& sin, bool inverse) {
  expect(x, DType::BF16, "rope x");
  expect(cos, DType::F32, "rope cos");
  expect(sin, DType::F32, "rope sin");
  PRIMUS_CHECK(x.dim() == 2 && heads * head_dim <= x.size(1) && head_dim % 2 == 0 && cos.size(1) * 2 == head_dim &&
                   sin.shape() == cos.shape() && seq > 0 && pos0 + std::min(seq, x.size(0)) <= cos.size(0),
               "rope of {} heads of {} at positions from {} on rows of {} with tables {}", heads, head_dim, pos0,
               x.size(1), cos.shape_str());
  bf16k::rope_apply(U(x), x.size(0), x.size(1), heads, head_dim, seq, pos0, F(cos), F(sin), inverse);
}

void Bf16Backend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) {
  PRIMUS_CHECK(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.groups > 0 && s.heads % s.groups == 0 && s.head_dim > 0,
               "attention shape batch {} seq {} heads {} groups {} head_dim {}", s.batch, s.seq, s.heads, s.groups,
               s.head_dim);
  expect(qkv, DType::BF16, s.batch * s.seq * s.qkv_stride(), "attention qkv");
  expect(out, DType::BF16, s.batch * s.seq * s.heads * s.head_dim, "attention out");
  expect(lse, DType::F32, s.batch * s.heads * s.seq, "attention lse");
  bf16k::attention_forward(U(qkv), U(out), F(lse), s, ops::documents_of(s, device()),
                           static_cast<const float*>(ops::sinks_of(s, device(), DType::F32)));
}

void Bf16Backend::attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                                          const ops::AttentionShape& s) {
  ReferenceBackend().attention_sink_backward(out, lse, dout, dsinks, s);  // O(rows) next to the backward
}

void Bf16Backend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     Tensor& dqkv, const ops::AttentionShape& s) {
  PRIMUS_CHECK(s.batch > 0 && s.seq > 0 && s.heads > 0 && s.groups > 0 && s.heads % s.groups == 0 && s.head_dim > 0,
               "attention shape batch {} seq {} heads {} groups {} head_dim {}", s.batch, s.seq, s.heads, s.groups,
               s.head_dim);
  const int64_t rows = s.batch * s.seq;
  expect(qkv, DType::BF16, rows * s.qkv_stride(), "attention qkv");
  expect(out, DType::BF16, rows * s.heads * s.head_dim, "attention out");
  expect(lse, DType::F32, s.batch * s.heads * s.seq, "attention lse");
  expect(dout, DType::BF16, rows * s.heads * s.head_dim, "attention dout");
  expect(dqkv, DType::BF16, rows * s.qkv_stride(), "attention dqkv");
  bf16k::attention_backward(U(qkv), U(out), F(lse), U(dout), U(dqkv), s, ops::documents_of(s, device()));
}

void Bf16Backend::attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) {
  expect(cache, DType::BF16, "attention cache");
  expect(out, DType::BF16, "attention out");
  PRIMUS_CHECK(s.batch == 1 && s.heads > 0 && s.groups > 0 && s.heads % s.groups == 0 && first >= 0 && first < s.seq &&
                   cache.dim() == 2 && cache.size(0) >= s.seq && cache.size(1) == s.qkv_stride() &&
                   out.numel() == (s.seq - first) * s.heads * s.head_dim,
               "attention decode of rows {}..{} on a cache {} into {}", first, s.seq, cache.shape_str(),
               out.shape_str());
  bf16k::attention_decode(U(cache), first, U(out), s, static_cast<const float*>(ops::sinks_of(s, device(), DType::F32)));
}

void Bf16Backend::attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                          const ops::AttentionShape& s, bool causal) {
  ReferenceBackend().attention_block_forward(qkv, kv, out, lse, s, causal);
}

void Bf16Backend::attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                                  const ops::AttentionShape& s) {
  ReferenceBackend().attention_merge(acc, lse, block_out, block_lse, s);
}

void Bf16Backend::attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                           const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc,
                                           const ops::AttentionShape& s, bool causal) {
  ReferenceBackend().attention_block_backward(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal);
}

void Bf16Backend::embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) {
  expect(tokens, DType::I32, "embedding tokens");
  expect(table, DType::BF16, "embedding table");
  expect(out, DType::BF16, "embedding out");
  const int64_t n = out.size(0), c = out.size(1), vocab = table.size(0);
  PRIMUS_CHECK(tokens.numel() == n && table.size(1) == c, "embedding: {} tokens, table {}, out {}", tokens.numel(),
               table.shape_str(), out.shape_str());
  const int32_t* t = tokens.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (t[i] >= vocab) fail("token id {} at position {} is outside the vocabulary of {} entries", t[i], i, vocab);
  bf16k::embedding_forward(t, U(table), U(out), n, c);
}

void Bf16Backend::embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) {
  expect(dout, DType::BF16, "embedding dout");
  expect(dtable, DType::F32, "embedding dtable");
  const int64_t n = dout.size(0), c = dout.size(1), vocab = dtable.size(0);
  PRIMUS_CHECK(int64_t(host_tokens.size()) == n && dtable.size(1) == c,
               "embedding backward: {} tokens, dout {}, dtable {}", host_tokens.size(), dout.shape_str(),
               dtable.shape_str());
  for (int64_t i = 0; i < n; ++i)
    if (host_tokens[size_t(i)] >= vocab)
      fail("token id {} at position {} is outside the vocabulary of {} entries", host_tokens[size_t(i)], i, vocab);
  bf16k::embedding_backward(host_tokens.data(), U(dout), F(dtable), n, c);
}

void Bf16Backend::column_sum_accumulate(const Tensor& dy, Tensor& out) {
  expect(dy, DType::BF16, "column sum dy");
  const int64_t n = dy.size(0), m = dy.size(1);
  expect(out, DType::F32, m, "column sum out");
  bf16k::column_sum_accumulate(U(dy), F(out), n, m);
}

void Bf16Backend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_host(a, "add a");
  check_host(b, "add b");
  check_host(out, "add out");
  PRIMUS_CHECK(a.numel() == out.numel() && b.numel() == out.numel() && a.dtype() == out.dtype() &&
                   b.dtype() == out.dtype() && (out.dtype() == DType::BF16 || out.dtype() == DType::F32),
               "add of {} {} and {} {} into {} {}", dtype_name(a.dtype()), a.shape_str(), dtype_name(b.dtype()),
               b.shape_str(), dtype_name(out.dtype()), out.shape_str());
  if (out.dtype() == DType::BF16)
    bf16k::add_bf16(U(a), U(b), U(out), out.numel());
  else
    bf16k::add_f32(F(a), F(b), F(out), out.numel());
}

// The three per-row steps of the cross-entropy are O(rows) on fp32 tensors: the reference
// backend's, which are exactly what they must compute.
void Bf16Backend::ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  expect(row_max, DType::F32, "ce row_max");
  expect(row_sum, DType::F32, row_max.numel(), "ce row_sum");
  expect(target_logit, DType::F32, row_max.numel(), "ce target_logit");
  ReferenceBackend().ce_init(row_max, row_sum, target_logit);
}

void Bf16Backend::ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                   Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  expect(logits, DType::F32, "ce logits");
  const int64_t n = logits.size(0), vc = logits.size(1);
  expect(targets, DType::I32, n, "ce targets");
  expect(row_max, DType::F32, n, "ce row_max");
  expect(row_sum, DType::F32, n, "ce row_sum");
  expect(target_logit, DType::F32, n, "ce target_logit");
  bf16k::ce_chunk_forward(F(logits), targets.data<int32_t>(), n, vc, c0, float(softcap), F(row_max), F(row_sum),
                          F(target_logit));
}

void Bf16Backend::ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) {
  ReferenceBackend().ce_merge_max(row_max, row_sum, global_max);
}

double Bf16Backend::ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                              const Tensor& targets, Tensor& lse) {
  const int64_t n = row_max.numel();
  expect(row_max, DType::F32, "ce row_max");
  expect(row_sum, DType::F32, n, "ce row_sum");
  expect(target_logit, DType::F32, n, "ce target_logit");
  expect(targets, DType::I32, n, "ce targets");
  expect(lse, DType::F32, n, "ce lse");
  return ReferenceBackend().ce_finish(row_max, row_sum, target_logit, targets, lse);
}

void Bf16Backend::ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                    double softcap, Tensor& dlogits) {
  const CeDlogits d = ce_dlogits(logits, lse, targets, dlogits);
  bf16k::ce_chunk_backward(F(logits), F(lse), targets.data<int32_t>(), logits.size(0), logits.size(1), c0,
                           float(softcap), d.bf16, d.f32);
}

double Bf16Backend::ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                        Tensor& lse, Tensor& dlogits) {
  const CeDlogits d = ce_dlogits(logits, lse, targets, dlogits);
  const int64_t n = logits.size(0);
  std::vector<float> zt(static_cast<size_t>(n));
  bf16k::ce_forward_backward(F(logits), targets.data<int32_t>(), n, logits.size(1), c0, float(softcap), F(lse),
                             zt.data(), d.bf16, d.f32);
  return ops::ce_loss_sum(F(lse), zt.data(), targets.data<int32_t>(), n);
}

void Bf16Backend::cast(const Tensor& src, Tensor& dst) {
  check_host(src, "cast source");
  check_host(dst, "cast destination");
  PRIMUS_CHECK(src.numel() == dst.numel(), "cast of {} elements into {}", src.numel(), dst.numel());
  if (src.dtype() == DType::F32 && dst.dtype() == DType::BF16)
    bf16k::cast_f32_to_bf16(F(src), U(dst), src.numel());
  else if (src.dtype() == DType::BF16 && dst.dtype() == DType::F32)
    bf16k::cast_bf16_to_f32(U(src), F(dst), src.numel());
  else
    cast_host(src, dst);
}

namespace {
bool bf16_rows(const Tensor& t) { return t.dtype() == DType::BF16 && t.device() == Device::CPU && t.is_contiguous(); }
const double* scales(const std::vector<double>& s) { return s.empty() ? nullptr : s.data(); }
}  // namespace

void Bf16Backend::gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                              Tensor& out) {
  if (!bf16_rows(x) || !bf16_rows(out)) return ops::Backend::gather_rows(x, rows, scale, out);
  ops::check_gather_rows(x, rows, scale, out);
  bf16k::gather_rows(U(x), x.size(1), rows.data(), scales(scale), int64_t(rows.size()), U(out));
}

void Bf16Backend::scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                                   Tensor& out) {
  if (!bf16_rows(y) || !bf16_rows(out)) return ops::Backend::scatter_add_rows(y, rows, scale, out);
  ops::check_scatter_add_rows(y, rows, scale, out);
  // The listed rows grouped by destination, in list order (a stable counting sort).
  const int64_t R = out.size(0);
  std::vector<int64_t> first(size_t(R + 1), 0);
  for (int32_t r : rows) ++first[size_t(r) + 1];
  for (int64_t r = 0; r < R; ++r) first[size_t(r + 1)] += first[size_t(r)];
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  std::vector<int32_t> order(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) order[size_t(next[size_t(rows[i])]++)] = int32_t(i);
  bf16k::scatter_add_rows(U(y), y.size(1), first.data(), order.data(), R, scales(scale), U(out));
}

std::vector<double> Bf16Backend::row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) {
  if (!bf16_rows(a) || !bf16_rows(b)) return ops::Backend::row_dots(a, rows, b);
  ops::check_row_dots(a, rows, b);
  std::vector<double> out(rows.size());
  bf16k::row_dots(U(a), a.size(1), rows.data(), U(b), int64_t(rows.size()), out.data());
  return out;
}

MemoryStats Bf16Backend::memory_stats() const { return host_memory_stats(); }
void Bf16Backend::reset_peak_memory() { reset_peak_host_memory(); }
double Bf16Backend::peak_tflops() const { return bf16k::bf16_gemm_peak_gflops() / 1e3; }

ops::Backend::Fp8Quantized Bf16Backend::quantize_fp8(const Tensor& src, fp8::Format format,
                                                     fp8::Granularity granularity, bool reduce_cols, float scale,
                                                     Tensor& dst, const Fp8AmaxOut& amax_out) {
  check_fp8_operands(src, dst);
  if (src.dtype() != DType::BF16 || src.device() != Device::CPU || dst.device() != Device::CPU)
    return Backend::quantize_fp8(src, format, granularity, reduce_cols, scale, dst, amax_out);
  static const Avx512Fp8Bands bands;
  return deliver_amax(ops::quantize_in_bands(src, {format, granularity, reduce_cols, scale}, dst, bands), amax_out);
}

}  // namespace primus::cpu
