#include "kernels/cpu/reference_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cross_entropy.h"
#include "kernels/softcap.h"

namespace primus::cpu {

namespace {

// A tensor's values as fp32 (bf16 widened, fp32 copied).
std::vector<float> read(const Tensor& t, const char* what) {
  check_host(t, what);
  const int64_t n = t.numel();
  std::vector<float> v(n);
  if (t.dtype() == DType::BF16) {
    const bf16* p = t.data<bf16>();
    for (int64_t i = 0; i < n; ++i) v[i] = p[i].to_float();
  } else {
    const float* p = t.data<float>();
    std::copy(p, p + n, v.begin());
  }
  return v;
}

// Writes fp32 values into t, rounding once when t is bf16.
void write(Tensor& t, const float* v, const char* what) {
  check_host(t, what);
  const int64_t n = t.numel();
  if (t.dtype() == DType::BF16) {
    bf16* p = t.data<bf16>();
    for (int64_t i = 0; i < n; ++i) p[i] = bf16::from_float(v[i]);
  } else {
    std::copy(v, v + n, t.data<float>());
  }
}

void expect(const Tensor& t, DType dtype, const Shape& shape, const char* what) {
  check_host(t, what);
  PRIMUS_CHECK(t.dtype() == dtype && t.shape() == shape, "{} is {} {}, expected {} [{}]", what, dtype_name(t.dtype()),
               t.shape_str(), dtype_name(dtype), fmt::join(shape, ", "));
}

}  // namespace

void ReferenceBackend::gemm(bool ta, bool tb, float alpha, const Tensor& A, const Tensor& B, float beta,
                            const Tensor& C, Tensor& D, const Tensor& bias) {
  PRIMUS_CHECK(A.dim() == 2 && B.dim() == 2 && D.dim() == 2, "gemm takes 2-d tensors");
  const int64_t M = ta ? A.size(1) : A.size(0), K = ta ? A.size(0) : A.size(1);
  const int64_t N = tb ? B.size(0) : B.size(1);
  PRIMUS_CHECK((tb ? B.size(1) : B.size(0)) == K, "gemm inner dimensions {} and {} differ", K,
               tb ? B.size(1) : B.size(0));
  PRIMUS_CHECK(D.size(0) == M && D.size(1) == N, "gemm output {} for a [{}, {}] product", D.shape_str(), M, N);
  PRIMUS_CHECK(A.dtype() == B.dtype(), "gemm inputs {} and {}", dtype_name(A.dtype()), dtype_name(B.dtype()));
  const std::vector<float> a = read(A, "gemm A"), b = read(B, "gemm B");
  std::vector<float> d(M * N, 0.0f);
  if (beta != 0.0f) {
    PRIMUS_CHECK(C.defined() && C.shape() == D.shape() && C.dtype() == D.dtype(), "gemm C must match D");
    d = read(C, "gemm C");
  }
  cpu::gemm<float>(ta, tb, M, N, K, alpha, a.data(), A.size(1), b.data(), B.size(1), beta, d.data(), N);
  if (bias.defined()) {
    const std::vector<float> bv = read(bias, "gemm bias");
    PRIMUS_CHECK(int64_t(bv.size()) == N, "gemm bias has {} elements for {} columns", bv.size(), N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) d[i * N + j] += bv[j];
  }
  write(D, d.data(), "gemm D");
}

void ReferenceBackend::rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) {
  const int64_t n = x.size(0), c = x.size(1);
  expect(rstd, DType::F32, {n}, "rmsnorm rstd");
  const std::vector<float> xv = read(x, "rmsnorm x"), wv = read(w, "rmsnorm w");
  std::vector<float> yv(n * c);
  cpu::rmsnorm_forward<float>(xv.data(), wv.data(), yv.data(), rstd.data<float>(), n, c, eps);
  write(y, yv.data(), "rmsnorm y");
}

void ReferenceBackend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                              const Tensor& residual, Tensor& dx) {
  const int64_t n = x.size(0), c = x.size(1);
  const std::vector<float> dyv = read(dy, "rmsnorm dy"), xv = read(x, "rmsnorm x"), wv = read(w, "rmsnorm w");
  std::vector<float> dxv = residual.defined() ? read(residual, "rmsnorm residual") : std::vector<float>(n * c, 0.0f);
  cpu::rmsnorm_backward_input<float>(dyv.data(), xv.data(), wv.data(), rstd.data<float>(), dxv.data(), n, c, true);
  write(dx, dxv.data(), "rmsnorm dx");
}

void ReferenceBackend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) {
  const int64_t n = x.size(0), c = x.size(1);
  expect(dw, DType::F32, {c}, "rmsnorm dw");
  const std::vector<float> dyv = read(dy, "rmsnorm dy"), xv = read(x, "rmsnorm x");
  cpu::rmsnorm_backward_weight<float>(dyv.data(), xv.data(), rstd.data<float>(), dw.data<float>(), n, c);
}

void ReferenceBackend::glu_forward(const Tensor& gate_up, Tensor& act, const ops::Glu& glu) {
  const int64_t n = act.size(0), f = act.size(1);
  const std::vector<float> g = read(gate_up, "swiglu gate_up");
  std::vector<float> a(n * f);
  cpu::swiglu_forward<float>(g.data(), a.data(), n, f, glu);
  write(act, a.data(), "swiglu act");
}

void ReferenceBackend::glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const ops::Glu& glu) {
  const int64_t n = dact.size(0), f = dact.size(1);
  const std::vector<float> da = read(dact, "swiglu dact"), g = read(gate_up, "swiglu gate_up");
  std::vector<float> dg(n * 2 * f);
  cpu::swiglu_backward<float>(da.data(), g.data(), dg.data(), n, f, glu);
  write(dgate_up, dg.data(), "swiglu dgate_up");
}

void ReferenceBackend::rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0,
                                  const Tensor& cos, const Tensor& sin, bool inverse) {
  std::vector<float> v = read(x, "rope x");
  check_host(cos, "rope cos");
  check_host(sin, "rope sin");
  PRIMUS_CHECK(heads * head_dim <= x.size(1) && cos.size(1) * 2 == head_dim && pos0 + std::min(seq, x.size(0)) <= cos.size(0),
               "rope of {} heads of {} at positions from {} on rows of {} with tables {}", heads, head_dim, pos0,
               x.size(1), cos.shape_str());
  cpu::rope_apply<float>(v.data(), x.size(0), x.size(1), heads, head_dim, seq, pos0, cos.data<float>(),
                         sin.data<float>(), inverse);
  write(x, v.data(), "rope x");
}

void ReferenceBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) {
  expect(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention lse");
  const std::vector<float> q = read(qkv, "attention qkv");
  std::vector<float> o(out.numel());
  cpu::attention_forward<float>(q.data(), o.data(), lse.data<float>(), s, ops::documents_of(s, device()),
                                static_cast<const float*>(ops::sinks_of(s, device(), DType::F32)));
  write(out, o.data(), "attention out");
}

void ReferenceBackend::attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                                               const ops::AttentionShape& s) {
  expect(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention lse");
  expect(dsinks, DType::F32, {s.heads}, "attention dsinks");
  PRIMUS_CHECK(s.sinks.defined(), "attention sink backward without sinks");
  const std::vector<float> o = read(out, "attention out"), d = read(dout, "attention dout");
  cpu::attention_sink_backward<float>(o.data(), d.data(), lse.data<float>(),
                                      static_cast<const float*>(ops::sinks_of(s, device(), DType::F32)),
                                      dsinks.data<float>(), s);
}

void ReferenceBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                          Tensor& dqkv, const ops::AttentionShape& s) {
  const std::vector<float> q = read(qkv, "attention qkv"), o = read(out, "attention out"),
                           d = read(dout, "attention dout");
  std::vector<float> dq(dqkv.numel());
  cpu::attention_backward<float>(q.data(), o.data(), lse.data<float>(), d.data(), dq.data(), s, ops::documents_of(s, device()));
  write(dqkv, dq.data(), "attention dqkv");
}

void ReferenceBackend::attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                               const ops::AttentionShape& s, bool causal) {
  expect(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention block lse");
  PRIMUS_CHECK(kv.numel() == s.batch * s.seq * 2 * s.groups * s.head_dim && qkv.numel() == s.batch * s.seq * s.qkv_stride(),
               "attention block shapes qkv {} kv {}", qkv.shape_str(), kv.shape_str());
  ops::refuse_window_and_sinks(s, "attention_block_forward");
  const std::vector<float> q = read(qkv, "attention qkv"), k = read(kv, "attention kv");
  std::vector<float> o(out.numel());
  cpu::attention_block_forward<float>(q.data(), k.data(), o.data(), lse.data<float>(), s, causal,
                                      ops::documents_of(s, device()));
  write(out, o.data(), "attention block out");
}

void ReferenceBackend::attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                                       const ops::AttentionShape& s) {
  const Shape rows = {s.batch * s.seq, s.heads * s.head_dim}, stats = {s.batch, s.heads, s.seq};
  expect(acc, DType::F32, rows, "attention merge acc");
  expect(lse, DType::F32, stats, "attention merge lse");
  expect(block_lse, DType::F32, stats, "attention merge block lse");
  const std::vector<float> o = read(block_out, "attention merge block out");
  PRIMUS_CHECK(int64_t(o.size()) == acc.numel(), "attention merge: block out {} for acc {}", block_out.shape_str(),
               acc.shape_str());
  cpu::attention_merge<float>(acc.data<float>(), lse.data<float>(), o.data(), block_lse.data<float>(), s);
}

void ReferenceBackend::attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                                const Tensor& lse, const Tensor& dout, Tensor& dq_acc,
                                                Tensor& dkv_acc, const ops::AttentionShape& s, bool causal) {
  expect(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention block lse");
  expect(dq_acc, DType::F32, {s.batch * s.seq, s.heads * s.head_dim}, "attention block dq_acc");
  expect(dkv_acc, DType::F32, {s.batch * s.seq, 2 * s.groups * s.head_dim}, "attention block dkv_acc");
  PRIMUS_CHECK(kv.numel() == dkv_acc.numel() && qkv.numel() == s.batch * s.seq * s.qkv_stride(),
               "attention block shapes qkv {} kv {}", qkv.shape_str(), kv.shape_str());
  ops::refuse_window_and_sinks(s, "attention_block_backward");
  const std::vector<float> q = read(qkv, "attention qkv"), k = read(kv, "attention kv"), o = read(out, "attention out"),
                           d = read(dout, "attention dout");
  cpu::attention_block_backward<float>(q.data(), k.data(), o.data(), lse.data<float>(), d.data(),
                                       dq_acc.data<float>(), dkv_acc.data<float>(), s, causal, ops::documents_of(s, device()));
}

void ReferenceBackend::attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) {
  PRIMUS_CHECK(s.batch == 1 && first >= 0 && first < s.seq && cache.size(0) >= s.seq &&
                   cache.size(1) == s.qkv_stride() && out.numel() == (s.seq - first) * s.heads * s.head_dim,
               "attention decode of rows {}..{} on a cache {} into {}", first, s.seq, cache.shape_str(),
               out.shape_str());
  const std::vector<float> c = read(cache.slice(0, 0, s.seq), "attention cache");
  std::vector<float> o(out.numel());
  cpu::attention_decode<float>(c.data(), first, o.data(), s, static_cast<const float*>(ops::sinks_of(s, device(), DType::F32)));
  write(out, o.data(), "attention out");
}

void ReferenceBackend::embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) {
  check_host(tokens, "embedding tokens");
  const int64_t n = out.size(0), c = out.size(1), vocab = table.size(0);
  const std::vector<float> t = read(table, "embedding table");
  std::vector<float> o(n * c);
  cpu::embedding_forward<float>(tokens.data<int32_t>(), t.data(), o.data(), n, vocab, c);
  write(out, o.data(), "embedding out");
}

void ReferenceBackend::embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout,
                                          Tensor& dtable) {
  const int64_t n = dout.size(0), c = dout.size(1), vocab = dtable.size(0);
  PRIMUS_CHECK(int64_t(host_tokens.size()) == n, "{} tokens for {} gradient rows", host_tokens.size(), n);
  expect(dtable, DType::F32, {vocab, c}, "embedding dtable");
  const std::vector<float> d = read(dout, "embedding dout");
  cpu::embedding_backward_weight<float>(host_tokens.data(), d.data(), dtable.data<float>(), n, vocab, c);
}

void ReferenceBackend::column_sum_accumulate(const Tensor& dy, Tensor& out) {
  const int64_t n = dy.size(0), m = dy.size(1);
  expect(out, DType::F32, {m}, "column sum out");
  const std::vector<float> d = read(dy, "column sum dy");
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) o[j] += d[i * m + j];
}

void ReferenceBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  PRIMUS_CHECK(a.numel() == out.numel() && b.numel() == out.numel() && a.dtype() == out.dtype() &&
                   b.dtype() == out.dtype(),
               "add of {} {} and {} {} into {} {}", dtype_name(a.dtype()), a.shape_str(), dtype_name(b.dtype()),
               b.shape_str(), dtype_name(out.dtype()), out.shape_str());
  std::vector<float> x = read(a, "add a");
  const std::vector<float> y = read(b, "add b");
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  write(out, x.data(), "add out");
}

void ReferenceBackend::ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  check_host(row_max, "ce row_max");
  std::fill_n(row_max.data<float>(), row_max.numel(), -std::numeric_limits<float>::infinity());
  std::fill_n(row_sum.data<float>(), row_sum.numel(), 0.0f);
  std::fill_n(target_logit.data<float>(), target_logit.numel(), 0.0f);
}

void ReferenceBackend::ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                        Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  const int64_t n = logits.size(0), vc = logits.size(1);
  check_host(logits, "ce logits");
  const float* z = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  float *m = row_max.data<float>(), *s = row_sum.data<float>(), *zt = target_logit.data<float>();
  const float cap = float(softcap);
  std::vector<float> zc(static_cast<size_t>(vc));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < vc; ++j) zc[size_t(j)] = ops::softcap(z[i * vc + j], cap);
    float mx = m[i];
    for (int64_t j = 0; j < vc; ++j) mx = std::max(mx, zc[size_t(j)]);
    float sum = 0;
    for (int64_t j = 0; j < vc; ++j) sum += std::exp(zc[size_t(j)] - mx);
    s[i] = s[i] * std::exp(m[i] - mx) + sum;
    m[i] = mx;
    if (t[i] >= c0 && t[i] < c0 + vc) zt[i] = zc[size_t(t[i] - c0)];
  }
}

void ReferenceBackend::ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) {
  expect(row_sum, DType::F32, row_max.shape(), "ce row_sum");
  expect(global_max, DType::F32, row_max.shape(), "ce global_max");
  float *m = row_max.data<float>(), *s = row_sum.data<float>();
  const float* g = global_max.data<float>();
  for (int64_t i = 0; i < row_max.numel(); ++i) {
    s[i] *= std::exp(m[i] - g[i]);
    m[i] = g[i];
  }
}

double ReferenceBackend::ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                                   const Tensor& targets, Tensor& lse) {
  const int64_t n = row_max.numel();
  const float *m = row_max.data<float>(), *s = row_sum.data<float>(), *zt = target_logit.data<float>();
  const int32_t* t = targets.data<int32_t>();
  float* l = lse.data<float>();
  for (int64_t i = 0; i < n; ++i) l[i] = ops::ce_log_sum_exp(m[i], s[i]);
  return ops::ce_loss_sum(l, zt, t, n);
}

void ReferenceBackend::ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                         double softcap, Tensor& dlogits) {
  const int64_t n = logits.size(0), vc = logits.size(1);
  const float *z = logits.data<float>(), *l = lse.data<float>();
  const int32_t* t = targets.data<int32_t>();
  const float cap = float(softcap);
  std::vector<float> d(n * vc, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] < 0) continue;
    for (int64_t j = 0; j < vc; ++j) {
      const float zc = ops::softcap(z[i * vc + j], cap);
      const float onehot = t[i] == c0 + j ? 1.0f : 0.0f;
      d[i * vc + j] = (std::exp(zc - l[i]) - onehot) * ops::softcap_slope(zc, cap);
    }
  }
  write(dlogits, d.data(), "ce dlogits");
}

void ReferenceBackend::cast(const Tensor& src, Tensor& dst) { cast_host(src, dst); }

MemoryStats ReferenceBackend::memory_stats() const { return host_memory_stats(); }
void ReferenceBackend::reset_peak_memory() { reset_peak_host_memory(); }
double ReferenceBackend::peak_tflops() const { return sgemm_peak_gflops() / 1e3; }

}  // namespace primus::cpu
