#include "kernels/meta/meta_backend.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace primus::ops {

std::vector<int64_t> RouterLoad::counts(int64_t layer, int64_t tokens, int64_t topk, int64_t experts) const {
  PRIMUS_CHECK(experts > 0 && tokens >= 0 && topk > 0, "router load of {} tokens, top-{} of {} experts", tokens, topk,
               experts);
  const auto it = per_layer.find(layer);
  const std::vector<double>& w = it != per_layer.end() ? it->second : shares;
  const int64_t total = tokens * topk;
  std::vector<int64_t> n(static_cast<size_t>(experts), 0);
  if (w.empty()) {  // balanced
    for (int64_t e = 0; e < experts; ++e) n[size_t(e)] = total / experts + (e < total % experts ? 1 : 0);
    return n;
  }
  if (int64_t(w.size()) != experts)
    fail("the router load has {} expert shares for a model with {} experts (layer {})", w.size(), experts, layer);
  double sum = 0;
  for (double x : w) {
    if (!(x >= 0)) fail("the router load's expert shares must be non-negative numbers, got {}", x);
    sum += x;
  }
  if (sum <= 0) fail("the router load's expert shares for layer {} are all zero", layer);
  // Largest remainder: the floors, then one more row for the largest fractional parts.
  std::vector<double> frac(static_cast<size_t>(experts));
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const double exact = double(total) * w[size_t(e)] / sum;
    n[size_t(e)] = int64_t(exact);
    frac[size_t(e)] = exact - double(n[size_t(e)]);
    given += n[size_t(e)];
  }
  std::vector<int64_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return frac[size_t(a)] > frac[size_t(b)]; });
  for (int64_t i = 0; given < total; ++i, ++given) ++n[size_t(order[size_t(i % experts)])];
  return n;
}

MetaBackend::MetaBackend(RouterLoad load) : load_(std::move(load)) { set_meta_observer(this); }

MetaBackend::~MetaBackend() { set_meta_observer(nullptr); }

std::vector<OpCall> MetaBackend::take_calls() {
  std::vector<OpCall> out;
  out.swap(calls_);
  return out;
}

void MetaBackend::on_copy(size_t width, size_t rows, size_t dpitch, size_t spitch, CopyKind kind) {
  // Copies between the host and the device are transfers, not device work: only device copies
  // count as ops.
  if (kind == CopyKind::DeviceToDevice && width * rows > 0) record(copy_call(width, rows, dpitch, spitch));
}

void MetaBackend::on_zero(size_t bytes) {
  if (bytes > 0) record(zero_call(bytes));
}

void MetaBackend::gemm(bool trans_a, bool trans_b, float, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
                       Tensor& D, const Tensor& bias) {
  record(gemm_call(trans_a, trans_b, A, B, beta, C, D, bias));
}

void MetaBackend::grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>&, const std::vector<Tensor>& A,
                               const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
  PRIMUS_CHECK(A.size() == B.size() && A.size() == D.size(), "grouped_gemm of {} A, {} B and {} D", A.size(), B.size(),
               D.size());
  if (!A.empty()) record(grouped_gemm_call(trans_a, trans_b, A, B, beta, D));
}

void MetaBackend::gemm_fp8(const Fp8Pair& f, bool trans_a, bool trans_b, float, const Tensor& A, const Tensor& B,
                           float beta, const Tensor& C, Tensor& D, const Tensor& bias) {
  ops::OpCall c = gemm_call(trans_a, trans_b, A, B, beta, C, D, bias);
  c.fp8 = ops::OpCall::Fp8Operands{f.a.kind, f.b.kind};
  c.weight = origin(c.weight);
  record(c);
}

void MetaBackend::grouped_gemm_fp8(const std::vector<Fp8Pair>& f, bool trans_a, bool trans_b,
                                   const std::vector<float>&, const std::vector<Tensor>& A,
                                   const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
  PRIMUS_CHECK(A.size() == B.size() && A.size() == D.size() && f.size() == A.size(),
               "grouped_gemm_fp8 of {} A, {} B, {} D and {} operand pairs", A.size(), B.size(), D.size(), f.size());
  if (A.empty()) return;
  ops::OpCall c = grouped_gemm_call(trans_a, trans_b, A, B, beta, D);
  ops::OpCall::Fp8Operands o{f[0].a.kind, f[0].b.kind};
  for (const Fp8Pair& p : f) {
    o.a.granularity = fp8::coarsest(o.a.granularity, p.a.kind.granularity);
    o.b.granularity = fp8::coarsest(o.b.granularity, p.b.kind.granularity);
  }
  c.fp8 = o;
  c.weight = origin(c.weight);
  record(c);
}

void MetaBackend::rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float) {
  record(rmsnorm_forward_call(x, w, y, rstd));
}

void MetaBackend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                         const Tensor& residual, Tensor& dx) {
  record(rmsnorm_backward_input_call(dy, x, w, rstd, residual, dx));
}

void MetaBackend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) {
  record(rmsnorm_backward_weight_call(dy, x, rstd, dw));
}

void MetaBackend::glu_forward(const Tensor& gate_up, Tensor& act, const Glu&) { record(swiglu_forward_call(gate_up, act)); }

void MetaBackend::glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const Glu&) {
  record(swiglu_backward_call(dact, gate_up, dgate_up));
}

void MetaBackend::rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t, const Tensor&,
                             const Tensor&, bool inverse) {
  record(rope_call(x, heads, head_dim, seq, inverse));
}

void MetaBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionShape& s) {
  record(attention_forward_call(qkv, out, lse, s));
}

void MetaBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     Tensor& dqkv, const AttentionShape& s) {
  record(attention_backward_call(qkv, out, lse, dout, dqkv, s));
}

void MetaBackend::attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                                          const AttentionShape& s) {
  record(attention_sink_backward_call(out, lse, dout, dsinks, s));
}

void MetaBackend::attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                          const AttentionShape& s, bool causal) {
  record(attention_block_forward_call(qkv, kv, out, lse, s, causal));
}

void MetaBackend::attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                                  const AttentionShape& s) {
  record(attention_merge_call(acc, lse, block_out, block_lse, s));
}

void MetaBackend::attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                           const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const AttentionShape& s,
                                           bool causal) {
  record(attention_block_backward_call(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal));
}

void MetaBackend::attention_decode(const Tensor& cache, int64_t first, Tensor& out, const AttentionShape& s) {
  record(attention_decode_call(cache, first, out, s));
}

void MetaBackend::embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) {
  record(embedding_forward_call(tokens, table, out));
}

void MetaBackend::embedding_backward(const std::vector<int32_t>&, const Tensor& dout, Tensor& dtable) {
  record(embedding_backward_call(dout, dtable));
}

void MetaBackend::column_sum_accumulate(const Tensor& dy, Tensor& out) { record(column_sum_accumulate_call(dy, out)); }

void MetaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) { record(add_call(a, b, out)); }

void MetaBackend::dropout(const Tensor& x, Tensor& y, double, uint64_t) { record(dropout_call(x, y)); }

void MetaBackend::ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  record(ce_init_call(row_max, row_sum, target_logit));
}

void MetaBackend::ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t, double, Tensor& row_max,
                                   Tensor&, Tensor&) {
  record(ce_chunk_forward_call(logits, targets, row_max));
}

void MetaBackend::ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) {
  record(ce_merge_max_call(row_max, row_sum, global_max));
}

double MetaBackend::ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                              const Tensor& targets, Tensor& lse) {
  record(ce_finish_call(row_max, row_sum, target_logit, targets, lse));
  return 0.0;
}

void MetaBackend::ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t, double,
                                    Tensor& dlogits) {
  record(ce_chunk_backward_call(logits, lse, targets, dlogits));
}

double MetaBackend::ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t, double, Tensor& lse,
                                        Tensor& dlogits) {
  record(ce_forward_backward_call(logits, targets, lse, dlogits));
  return 0.0;
}

void MetaBackend::gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>&,
                              Tensor& out) {
  record(gather_rows_call(x, rows.size(), out));
}

void MetaBackend::scatter_add_rows(const Tensor& y, const std::vector<int32_t>&, const std::vector<double>&,
                                   Tensor& out) {
  record(scatter_add_rows_call(y, out));
}

std::vector<double> MetaBackend::row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) {
  record(row_dots_call(a, b));
  return std::vector<double>(rows.size(), 0.0);
}

std::vector<int64_t> MetaBackend::router_load(int64_t layer, int64_t tokens, int64_t topk, int64_t experts) const {
  return load_.counts(layer, tokens, topk, experts);
}

void MetaBackend::cast(const Tensor& src, Tensor& dst) { record(cast_call(src, dst)); }

Backend::Fp8Quantized MetaBackend::quantize_fp8(const Tensor& src, fp8::Format, fp8::Granularity granularity, bool,
                                                float scale, Tensor& dst, const Fp8AmaxOut&) {
  record(quantize_fp8_call(src, dst));
  quantized_from_[dst.raw()] = origin(src.raw());
  return {0.0f, granularity == fp8::Granularity::Tensor && scale > 0 ? scale : 1.0f};
}

}  // namespace primus::ops
