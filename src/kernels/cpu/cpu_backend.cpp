#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cross_entropy.h"

namespace primus::cpu {

// Declared in cpu_backend.h (shared by the CPU backends).
void check_host(const Tensor& t, const char* what) {
  PRIMUS_CHECK(t.defined(), "{} is undefined", what);
  PRIMUS_CHECK(t.device() == Device::CPU && t.is_contiguous(), "{} must be a contiguous host tensor", what);
}

namespace {

// Loops over fewer elements than this run on one thread.
constexpr int64_t kParallelMin = 1 << 15;

// The element type every floating tensor of an op shares: fp32 or fp64.
DType real_type(const Tensor& t, const char* what) {
  check_host(t, what);
  PRIMUS_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, "{} is {}: the CPU backend computes in fp32 or fp64",
               what, dtype_name(t.dtype()));
  return t.dtype();
}

void same_type(DType t, const Tensor& x, const char* what) {
  check_host(x, what);
  PRIMUS_CHECK(x.dtype() == t, "{} is {}, expected {}", what, dtype_name(x.dtype()), dtype_name(t));
}

template <typename T>
T* P(const Tensor& t) {
  return t.data<T>();
}

// Calls f.template operator()<T>() with T the C++ type of dtype (float or double).
template <typename F>
void dispatch(DType dtype, F&& f) {
  if (dtype == DType::F64)
    f.template operator()<double>();
  else
    f.template operator()<float>();
}

bool same_buffer(const Tensor& a, const Tensor& b) { return a.defined() && b.defined() && a.raw() == b.raw(); }

}  // namespace

CpuBackend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

void CpuBackend::gemm(bool ta, bool tb, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
                      Tensor& D, const Tensor& bias) {
  PRIMUS_CHECK(A.dim() == 2 && B.dim() == 2 && D.dim() == 2, "gemm takes 2-d tensors");
  const DType t = real_type(A, "gemm A");
  same_type(t, B, "gemm B");
  same_type(t, D, "gemm D");
  const int64_t M = ta ? A.size(1) : A.size(0), K = ta ? A.size(0) : A.size(1);
  const int64_t N = tb ? B.size(0) : B.size(1);
  PRIMUS_CHECK((tb ? B.size(1) : B.size(0)) == K, "gemm inner dimensions {} and {} differ", K,
               tb ? B.size(1) : B.size(0));
  PRIMUS_CHECK(D.size(0) == M && D.size(1) == N, "gemm output {} for a [{}, {}] product", D.shape_str(), M, N);
  if (beta != 0.0f) {
    same_type(t, C, "gemm C");
    PRIMUS_CHECK(C.shape() == D.shape(), "gemm C {} must match D {}", C.shape_str(), D.shape_str());
  }
  if (bias.defined()) {
    same_type(t, bias, "gemm bias");
    PRIMUS_CHECK(bias.numel() == N, "gemm bias has {} elements for {} columns", bias.numel(), N);
  }
  dispatch(t, [&]<typename T>() {
    T b = T(beta);
    if (bias.defined()) {  // D = beta C + bias first, so that one GEMM adds onto it
      const T* bv = P<T>(bias);
      const T* c = beta != 0.0f ? P<T>(C) : nullptr;
      T* d = P<T>(D);
#pragma omp parallel for schedule(static) if(M * N >= kParallelMin)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) d[i * N + j] = (c ? T(beta) * c[i * N + j] : T(0)) + bv[j];
      b = T(1);
    } else if (beta != 0.0f && !same_buffer(C, D)) {  // e.g. a residual: D starts as a copy of it
      D.copy_from(C);
    }
    cpu::gemm<T>(ta, tb, M, N, K, T(alpha), P<T>(A), A.size(1), P<T>(B), B.size(1), b, P<T>(D), N);
  });
}

void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) {
  const DType t = real_type(x, "rmsnorm x");
  same_type(t, w, "rmsnorm w");
  same_type(t, y, "rmsnorm y");
  same_type(t, rstd, "rmsnorm rstd");
  const int64_t n = x.size(0), c = x.size(1);
  PRIMUS_CHECK(y.numel() == n * c && rstd.numel() == n && w.numel() == c, "rmsnorm shapes x {} w {} y {} rstd {}",
               x.shape_str(), w.shape_str(), y.shape_str(), rstd.shape_str());
  dispatch(t, [&]<typename T>() { cpu::rmsnorm_forward<T>(P<T>(x), P<T>(w), P<T>(y), P<T>(rstd), n, c, eps); });
}

void CpuBackend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                        const Tensor& residual, Tensor& dx) {
  const DType t = real_type(x, "rmsnorm x");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&dy, &w, &rstd, &dx}) same_type(t, *u, "rmsnorm operand");
  const int64_t n = x.size(0), c = x.size(1);
  PRIMUS_CHECK(dy.numel() == n * c && dx.numel() == n * c, "rmsnorm backward: dy {} dx {} for x {}", dy.shape_str(),
               dx.shape_str(), x.shape_str());
  if (residual.defined() && !same_buffer(residual, dx)) {
    same_type(t, residual, "rmsnorm residual");
    dx.copy_from(residual);
  }
  dispatch(t, [&]<typename T>() {
    cpu::rmsnorm_backward_input<T>(P<T>(dy), P<T>(x), P<T>(w), P<T>(rstd), P<T>(dx), n, c, residual.defined());
  });
}

void CpuBackend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) {
  const DType t = real_type(x, "rmsnorm x");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&dy, &rstd, &dw}) same_type(t, *u, "rmsnorm operand");
  const int64_t n = x.size(0), c = x.size(1);
  PRIMUS_CHECK(dw.numel() == c, "rmsnorm dw {} for rows of {}", dw.shape_str(), c);
  dispatch(t, [&]<typename T>() { cpu::rmsnorm_backward_weight<T>(P<T>(dy), P<T>(x), P<T>(rstd), P<T>(dw), n, c); });
}

void CpuBackend::glu_forward(const Tensor& gate_up, Tensor& act, const ops::Glu& glu) {
  const DType t = real_type(gate_up, "swiglu gate_up");
  same_type(t, act, "swiglu act");
  const int64_t n = act.size(0), f = act.size(1);
  PRIMUS_CHECK(gate_up.numel() == 2 * n * f, "swiglu gate_up {} for act {}", gate_up.shape_str(), act.shape_str());
  dispatch(t, [&]<typename T>() { cpu::swiglu_forward<T>(P<T>(gate_up), P<T>(act), n, f, glu); });
}

void CpuBackend::glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const ops::Glu& glu) {
  const DType t = real_type(gate_up, "swiglu gate_up");
  same_type(t, dact, "swiglu dact");
  same_type(t, dgate_up, "swiglu dgate_up");
  const int64_t n = dact.size(0), f = dact.size(1);
  PRIMUS_CHECK(gate_up.numel() == 2 * n * f && dgate_up.numel() == 2 * n * f, "swiglu backward shapes");
  dispatch(t, [&]<typename T>() { cpu::swiglu_backward<T>(P<T>(dact), P<T>(gate_up), P<T>(dgate_up), n, f, glu); });
}

void CpuBackend::rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                            const Tensor& sin, bool inverse) {
  const DType t = real_type(x, "rope x");
  same_type(t, cos, "rope cos");
  same_type(t, sin, "rope sin");
  PRIMUS_CHECK(heads * head_dim <= x.size(1) && cos.size(1) * 2 == head_dim && pos0 + std::min(seq, x.size(0)) <= cos.size(0),
               "rope of {} heads of {} at positions from {} on rows of {} with tables {}", heads, head_dim, pos0,
               x.size(1), cos.shape_str());
  dispatch(t, [&]<typename T>() {
    cpu::rope_apply<T>(P<T>(x), x.size(0), x.size(1), heads, head_dim, seq, pos0, P<T>(cos), P<T>(sin), inverse);
  });
}

void CpuBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) {
  const DType t = real_type(qkv, "attention qkv");
  same_type(t, out, "attention out");
  same_type(t, lse, "attention lse");
  PRIMUS_CHECK(qkv.numel() == s.batch * s.seq * s.qkv_stride() && out.numel() == s.batch * s.seq * s.heads * s.head_dim &&
                   lse.numel() == s.batch * s.heads * s.seq,
               "attention shapes qkv {} out {} lse {}", qkv.shape_str(), out.shape_str(), lse.shape_str());
  const cpu::Documents docs = ops::documents_of(s, device());
  const void* sinks = ops::sinks_of(s, device(), t);
  dispatch(t, [&]<typename T>() {
    cpu::attention_forward<T>(P<T>(qkv), P<T>(out), P<T>(lse), s, docs, static_cast<const T*>(sinks));
  });
}

void CpuBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    Tensor& dqkv, const ops::AttentionShape& s) {
  const DType t = real_type(qkv, "attention qkv");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&out, &lse, &dout, &dqkv}) same_type(t, *u, "attention operand");
  PRIMUS_CHECK(dqkv.numel() == qkv.numel() && dout.numel() == out.numel(), "attention backward shapes");
  const cpu::Documents docs = ops::documents_of(s, device());
  dispatch(t, [&]<typename T>() {
    cpu::attention_backward<T>(P<T>(qkv), P<T>(out), P<T>(lse), P<T>(dout), P<T>(dqkv), s, docs);
  });
}

void CpuBackend::attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                                         const ops::AttentionShape& s) {
  const DType t = real_type(out, "attention out");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&lse, &dout, &dsinks}) same_type(t, *u, "attention sink operand");
  PRIMUS_CHECK(s.sinks.defined() && dout.numel() == out.numel() && out.numel() == s.batch * s.seq * s.heads * s.head_dim &&
                   lse.numel() == s.batch * s.heads * s.seq && dsinks.numel() == s.heads,
               "attention sink backward: out {} dout {} lse {} dsinks {} for {} heads", out.shape_str(), dout.shape_str(),
               lse.shape_str(), dsinks.shape_str(), s.heads);
  const void* sinks = ops::sinks_of(s, device(), t);
  dispatch(t, [&]<typename T>() {
    cpu::attention_sink_backward<T>(P<T>(out), P<T>(dout), P<T>(lse), static_cast<const T*>(sinks), P<T>(dsinks), s);
  });
}

// Shapes of a context-parallel block pair (backend.h).
static void check_block_shapes(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                        const ops::AttentionShape& s) {
  const int64_t rows = s.batch * s.seq;
  PRIMUS_CHECK(qkv.numel() == rows * s.qkv_stride() && kv.numel() == rows * 2 * s.groups * s.head_dim &&
                   out.numel() == rows * s.heads * s.head_dim && lse.numel() == s.batch * s.heads * s.seq,
               "attention block shapes qkv {} kv {} out {} lse {} for batch {} x seq {}", qkv.shape_str(),
               kv.shape_str(), out.shape_str(), lse.shape_str(), s.batch, s.seq);
}

void CpuBackend::attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                         const ops::AttentionShape& s, bool causal) {
  const DType t = real_type(qkv, "attention qkv");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&kv, &out, &lse}) same_type(t, *u, "attention operand");
  check_block_shapes(qkv, kv, out, lse, s);
  ops::refuse_window_and_sinks(s, "attention_block_forward");
  const cpu::Documents docs = ops::documents_of(s, device());
  dispatch(t, [&]<typename T>() {
    cpu::attention_block_forward<T>(P<T>(qkv), P<T>(kv), P<T>(out), P<T>(lse), s, causal, docs);
  });
}

void CpuBackend::attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                                 const ops::AttentionShape& s) {
  const DType t = real_type(acc, "attention acc");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&lse, &block_out, &block_lse})
    same_type(t, *u, "attention merge operand");
  PRIMUS_CHECK(acc.numel() == s.batch * s.seq * s.heads * s.head_dim && block_out.numel() == acc.numel() &&
                   lse.numel() == s.batch * s.heads * s.seq && block_lse.numel() == lse.numel(),
               "attention merge shapes acc {} lse {} block {} {}", acc.shape_str(), lse.shape_str(),
               block_out.shape_str(), block_lse.shape_str());
  dispatch(t, [&]<typename T>() { cpu::attention_merge<T>(P<T>(acc), P<T>(lse), P<T>(block_out), P<T>(block_lse), s); });
}

void CpuBackend::attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                          const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc,
                                          const ops::AttentionShape& s, bool causal) {
  const DType t = real_type(qkv, "attention qkv");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&kv, &out, &lse, &dout, &dq_acc, &dkv_acc})
    same_type(t, *u, "attention operand");
  check_block_shapes(qkv, kv, out, lse, s);
  PRIMUS_CHECK(dout.numel() == out.numel() && dq_acc.numel() == out.numel() && dkv_acc.numel() == kv.numel(),
               "attention block backward shapes dout {} dq {} dkv {}", dout.shape_str(), dq_acc.shape_str(),
               dkv_acc.shape_str());
  ops::refuse_window_and_sinks(s, "attention_block_backward");
  const cpu::Documents docs = ops::documents_of(s, device());
  dispatch(t, [&]<typename T>() {
    cpu::attention_block_backward<T>(P<T>(qkv), P<T>(kv), P<T>(out), P<T>(lse), P<T>(dout), P<T>(dq_acc),
                                     P<T>(dkv_acc), s, causal, docs);
  });
}

void CpuBackend::attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) {
  const DType t = real_type(cache, "attention cache");
  same_type(t, out, "attention out");
  PRIMUS_CHECK(s.batch == 1 && first >= 0 && first < s.seq && cache.size(0) >= s.seq &&
                   cache.size(1) == s.qkv_stride() && out.numel() == (s.seq - first) * s.heads * s.head_dim,
               "attention decode of rows {}..{} on a cache {} into {}", first, s.seq, cache.shape_str(),
               out.shape_str());
  const void* sinks = ops::sinks_of(s, device(), t);
  dispatch(t, [&]<typename T>() {
    cpu::attention_decode<T>(P<T>(cache), first, P<T>(out), s, static_cast<const T*>(sinks));
  });
}

void CpuBackend::embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) {
  const DType t = real_type(table, "embedding table");
  same_type(t, out, "embedding out");
  check_host(tokens, "embedding tokens");
  const int64_t n = out.size(0), c = out.size(1);
  PRIMUS_CHECK(tokens.numel() == n && table.size(1) == c, "embedding: {} tokens, table {}, out {}", tokens.numel(),
               table.shape_str(), out.shape_str());
  dispatch(t, [&]<typename T>() {
    cpu::embedding_forward<T>(tokens.data<int32_t>(), P<T>(table), P<T>(out), n, table.size(0), c);
  });
}

void CpuBackend::embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) {
  const DType t = real_type(dout, "embedding dout");
  same_type(t, dtable, "embedding dtable");
  const int64_t n = dout.size(0), c = dout.size(1);
  PRIMUS_CHECK(int64_t(host_tokens.size()) == n && dtable.size(1) == c, "embedding backward: {} tokens, dout {}, dtable {}",
               host_tokens.size(), dout.shape_str(), dtable.shape_str());
  dispatch(t, [&]<typename T>() {
    cpu::embedding_backward_weight<T>(host_tokens.data(), P<T>(dout), P<T>(dtable), n, dtable.size(0), c);
  });
}

void CpuBackend::column_sum_accumulate(const Tensor& dy, Tensor& out) {
  const DType t = real_type(dy, "column sum dy");
  same_type(t, out, "column sum out");
  const int64_t n = dy.size(0), m = dy.size(1);
  PRIMUS_CHECK(out.numel() == m, "column sum out {} for {} columns", out.shape_str(), m);
  dispatch(t, [&]<typename T>() {
    const T* d = P<T>(dy);
    T* o = P<T>(out);
#pragma omp parallel for schedule(static) if(n * m >= kParallelMin)
    for (int64_t j = 0; j < m; ++j) {
      T s = 0;
      for (int64_t i = 0; i < n; ++i) s += d[i * m + j];
      o[j] += s;
    }
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const DType t = real_type(a, "add a");
  same_type(t, b, "add b");
  same_type(t, out, "add out");
  const int64_t n = out.numel();
  PRIMUS_CHECK(a.numel() == n && b.numel() == n, "add of {} and {} into {}", a.shape_str(), b.shape_str(),
               out.shape_str());
  dispatch(t, [&]<typename T>() {
    const T *x = P<T>(a), *y = P<T>(b);
    T* o = P<T>(out);
#pragma omp parallel for simd schedule(static) if(n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  });
}

void CpuBackend::ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  const DType t = real_type(row_max, "ce row_max");
  same_type(t, row_sum, "ce row_sum");
  same_type(t, target_logit, "ce target_logit");
  dispatch(t, [&]<typename T>() {
    std::fill_n(P<T>(row_max), row_max.numel(), -std::numeric_limits<T>::infinity());
    std::fill_n(P<T>(row_sum), row_sum.numel(), T(0));
    std::fill_n(P<T>(target_logit), target_logit.numel(), T(0));
  });
}

// Per row: the running max over this chunk, the running sum of exp(z - max) re-based to it, and
// the target's logit when the target falls in the chunk.
void CpuBackend::ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                  Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  const DType t = real_type(logits, "ce logits");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&row_max, &row_sum, &target_logit}) same_type(t, *u, "ce row statistics");
  check_host(targets, "ce targets");
  const int64_t n = logits.size(0), vc = logits.size(1);
  PRIMUS_CHECK(targets.numel() == n && row_max.numel() == n, "ce chunk: logits {}, {} targets", logits.shape_str(),
               targets.numel());
  dispatch(t, [&]<typename T>() {
    cpu::ce_chunk_forward<T>(P<T>(logits), targets.data<int32_t>(), n, vc, c0, T(softcap), P<T>(row_max), P<T>(row_sum),
                             P<T>(target_logit));
  });
}

void CpuBackend::ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) {
  const DType t = real_type(row_max, "ce row_max");
  same_type(t, row_sum, "ce row_sum");
  same_type(t, global_max, "ce global_max");
  dispatch(t, [&]<typename T>() {
    T *m = P<T>(row_max), *s = P<T>(row_sum);
    const T* g = P<T>(global_max);
    for (int64_t i = 0; i < row_max.numel(); ++i) {
      s[i] *= std::exp(m[i] - g[i]);
      m[i] = g[i];
    }
  });
}

double CpuBackend::ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                             const Tensor& targets, Tensor& lse) {
  const DType t = real_type(row_max, "ce row_max");
  for (const Tensor* u : std::initializer_list<const Tensor*>{&row_sum, &target_logit, &lse}) same_type(t, *u, "ce row statistics");
  double total = 0;
  dispatch(t, [&]<typename T>() {
    const T *m = P<T>(row_max), *s = P<T>(row_sum), *zt = P<T>(target_logit);
    T* l = P<T>(lse);
    for (int64_t i = 0; i < row_max.numel(); ++i) l[i] = ops::ce_log_sum_exp(m[i], s[i]);
    total = ops::ce_loss_sum(l, zt, targets.data<int32_t>(), row_max.numel());
  });
  return total;
}

void CpuBackend::ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                   double softcap, Tensor& dlogits) {
  const DType t = real_type(logits, "ce logits");
  same_type(t, lse, "ce lse");
  same_type(t, dlogits, "ce dlogits");
  const int64_t n = logits.size(0), vc = logits.size(1);
  PRIMUS_CHECK(dlogits.numel() == n * vc && targets.numel() == n, "ce chunk backward shapes");
  dispatch(t, [&]<typename T>() {
    cpu::ce_chunk_backward<T>(P<T>(logits), P<T>(lse), targets.data<int32_t>(), n, vc, c0, T(softcap), P<T>(dlogits));
  });
}

void cast_host(const Tensor& src, Tensor& dst) {
  check_host(src, "cast source");
  check_host(dst, "cast destination");
  PRIMUS_CHECK(src.numel() == dst.numel(), "cast of {} elements into {}", src.numel(), dst.numel());
  const int64_t n = src.numel();
  auto load = [&](int64_t i) -> double {
    switch (src.dtype()) {
      case DType::F32: return src.data<float>()[i];
      case DType::F64: return src.data<double>()[i];
      case DType::BF16: return src.data<bf16>()[i].to_float();
      default: fail("cast from {} is not an op", dtype_name(src.dtype()));
    }
  };
  PRIMUS_CHECK(src.dtype() == DType::F32 || src.dtype() == DType::F64 || src.dtype() == DType::BF16,
               "cast from {}", dtype_name(src.dtype()));
  switch (dst.dtype()) {
    case DType::F32: {
      float* d = dst.data<float>();
#pragma omp parallel for schedule(static) if(n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) d[i] = float(load(i));
      break;
    }
    case DType::F64: {
      double* d = dst.data<double>();
#pragma omp parallel for schedule(static) if(n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) d[i] = load(i);
      break;
    }
    case DType::BF16: {
      bf16* d = dst.data<bf16>();
      PRIMUS_CHECK(src.dtype() != DType::F64, "cast from fp64 to bf16 is not an op");
#pragma omp parallel for schedule(static) if(n >= kParallelMin)
      for (int64_t i = 0; i < n; ++i) d[i] = bf16::from_float(float(load(i)));
      break;
    }
    default: fail("cast to {} is not an op", dtype_name(dst.dtype()));
  }
}

void CpuBackend::cast(const Tensor& src, Tensor& dst) { cast_host(src, dst); }

MemoryStats CpuBackend::memory_stats() const { return host_memory_stats(); }
void CpuBackend::reset_peak_memory() { reset_peak_host_memory(); }
double CpuBackend::peak_tflops() const { return sgemm_peak_gflops() / 1e3; }

}  // namespace primus::cpu
