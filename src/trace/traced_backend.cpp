#include "trace/traced_backend.h"

namespace primus::trace {
namespace {

double nbytes(const Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }
int64_t rows(const Tensor& t) { return t.dim() > 0 ? t.size(0) : 0; }
int64_t cols(const Tensor& t) { return t.dim() > 1 ? t.size(1) : 1; }

}  // namespace

void TracedBackend::finish(Event& e, Mark end, OpKind kind, const Tensor* weight, const char* module, DType dtype,
                           std::initializer_list<int64_t> dims, double flops, double bytes) {
  e.kind = kind;
  if (weight && weight->defined()) p_.resolve(weight->raw(), e.layer, e.module);
  if (!e.module && module) e.module = p_.intern(module);
  e.dtype = dtype;
  int i = 0;
  for (int64_t d : dims)
    if (i < 4) e.dims[i++] = d;
  e.flops = flops;
  e.bytes = bytes;
  p_.op_end(e, end);
}

// The pass of a GEMM from what it touches: writing a gradient buffer is W; reading a weight as
// B^T (y = x W^T) is the forward, as B (dx = dy W) the input gradient.
void TracedBackend::finish_gemm(Event& e, Mark end, bool trans_b, const Tensor& B, const Tensor& D, DType dtype,
                                std::initializer_list<int64_t> dims, double flops, double bytes) {
  int layer = -1;
  const std::string* module = nullptr;
  p_.resolve(D.raw(), layer, module);
  OpKind kind = OpKind::Forward;
  const Tensor* weight = &B;
  if (module) {
    kind = OpKind::WeightGrad;
    weight = &D;
  } else {
    p_.resolve(B.raw(), layer, module);
    if (module) kind = trans_b ? OpKind::Forward : OpKind::Backward;
    else weight = nullptr;
  }
  finish(e, end, kind, weight, nullptr, dtype, dims, flops, bytes);
  // A tied embedding used as the output layer is the output layer here.
  if (e.module && *e.module == "word_embeddings") e.module = p_.intern("output_layer");
}

void TracedBackend::gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
                         const Tensor& C, Tensor& D, const Tensor& bias) {
  if (!p_.active()) return be_.gemm(trans_a, trans_b, alpha, A, B, beta, C, D, bias);
  Event& e = p_.op_begin("gemm");
  be_.gemm(trans_a, trans_b, alpha, A, B, beta, C, D, bias);
  const Mark end = p_.clock().device(nullptr);
  const int64_t M = D.size(0), N = D.size(1), K = trans_a ? A.size(0) : A.size(1);
  const double bytes = nbytes(A) + nbytes(B) + nbytes(D) + (beta != 0 && C.defined() && C.raw() != D.raw() ? nbytes(C) : 0) +
                       nbytes(bias);
  finish_gemm(e, end, trans_b, B, D, A.dtype(), {M, N, K}, 2.0 * double(M) * double(N) * double(K), bytes);
}

void TracedBackend::grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                                 const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
  if (!p_.active() || A.empty() || A.size() != B.size() || A.size() != D.size())
    return be_.grouped_gemm(trans_a, trans_b, alpha, A, B, beta, D);
  Event& e = p_.op_begin("gemm");
  be_.grouped_gemm(trans_a, trans_b, alpha, A, B, beta, D);
  const Mark end = p_.clock().device(nullptr);
  int64_t M = 0, K = 0;
  double flops = 0, bytes = 0;
  for (size_t i = 0; i < A.size(); ++i) {
    const int64_t m = D[i].size(0), k = trans_a ? A[i].size(0) : A[i].size(1);
    M += m, K += k;
    flops += 2.0 * double(m) * double(D[i].size(1)) * double(k);
    bytes += nbytes(A[i]) + nbytes(B[i]) + nbytes(D[i]);
  }
  if (trans_a) M = D[0].size(0);  // weight gradients: one [M, N] each, over their own rows (K)
  else K = A[0].size(1);          // the rest: the experts' rows stacked
  finish_gemm(e, end, trans_b, B[0], D[0], A[0].dtype(), {M, D[0].size(1), K, int64_t(A.size())}, flops, bytes);
}

void TracedBackend::rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) {
  if (!p_.active()) return be_.rmsnorm_forward(x, w, y, rstd, eps);
  Event& e = p_.op_begin("rmsnorm_forward");
  be_.rmsnorm_forward(x, w, y, rstd, eps);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, &w, "norm", x.dtype(), {rows(x), cols(x)}, 4.0 * double(x.numel()),
         nbytes(x) + nbytes(w) + nbytes(y) + nbytes(rstd));
}

void TracedBackend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                           const Tensor& residual, Tensor& dx) {
  if (!p_.active()) return be_.rmsnorm_backward_input(dy, x, w, rstd, residual, dx);
  Event& e = p_.op_begin("rmsnorm_backward_input");
  be_.rmsnorm_backward_input(dy, x, w, rstd, residual, dx);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Backward, &w, "norm", x.dtype(), {rows(x), cols(x)}, 8.0 * double(x.numel()),
         nbytes(dy) + nbytes(x) + nbytes(w) + nbytes(rstd) + nbytes(residual) + nbytes(dx));
}

void TracedBackend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) {
  if (!p_.active()) return be_.rmsnorm_backward_weight(dy, x, rstd, dw);
  Event& e = p_.op_begin("rmsnorm_backward_weight");
  be_.rmsnorm_backward_weight(dy, x, rstd, dw);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::WeightGrad, &dw, "norm", x.dtype(), {rows(x), cols(x)}, 3.0 * double(x.numel()),
         nbytes(dy) + nbytes(x) + nbytes(rstd) + 2 * nbytes(dw));
}

void TracedBackend::swiglu_forward(const Tensor& gate_up, Tensor& act) {
  if (!p_.active()) return be_.swiglu_forward(gate_up, act);
  Event& e = p_.op_begin("swiglu_forward");
  be_.swiglu_forward(gate_up, act);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "mlp", act.dtype(), {rows(act), cols(act)}, 5.0 * double(act.numel()),
         nbytes(gate_up) + nbytes(act));
}

void TracedBackend::swiglu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up) {
  if (!p_.active()) return be_.swiglu_backward(dact, gate_up, dgate_up);
  Event& e = p_.op_begin("swiglu_backward");
  be_.swiglu_backward(dact, gate_up, dgate_up);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Backward, nullptr, "mlp", dact.dtype(), {rows(dact), cols(dact)}, 10.0 * double(dact.numel()),
         nbytes(dact) + nbytes(gate_up) + nbytes(dgate_up));
}

void TracedBackend::rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                               const Tensor& sin, bool inverse) {
  if (!p_.active()) return be_.rope_apply(x, heads, head_dim, seq, pos0, cos, sin, inverse);
  Event& e = p_.op_begin("rope_apply");
  be_.rope_apply(x, heads, head_dim, seq, pos0, cos, sin, inverse);
  const Mark end = p_.clock().device(nullptr);
  const double n = double(rows(x)) * double(heads) * double(head_dim);
  finish(e, end, inverse ? OpKind::Backward : OpKind::Forward, nullptr, "self_attention", x.dtype(),
         {rows(x), heads, head_dim}, 3.0 * n, 2.0 * n * double(dtype_size(x.dtype())));
}

void TracedBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_forward(qkv, out, lse, s);
  Event& e = p_.op_begin("attention_forward");
  be_.attention_forward(qkv, out, lse, s);
  const Mark end = p_.clock().device(nullptr);
  // Causal: QK^T and PV over half the positions, 2 s d FLOPs per query and key each.
  const double flops = 2.0 * double(s.batch) * double(s.heads) * double(s.seq) * double(s.seq) * double(s.head_dim);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", qkv.dtype(), {s.batch, s.seq, s.heads, s.head_dim}, flops,
         nbytes(qkv) + nbytes(out) + nbytes(lse));
}

void TracedBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       Tensor& dqkv, const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_backward(qkv, out, lse, dout, dqkv, s);
  Event& e = p_.op_begin("attention_backward");
  be_.attention_backward(qkv, out, lse, dout, dqkv, s);
  const Mark end = p_.clock().device(nullptr);
  const double flops = 4.0 * double(s.batch) * double(s.heads) * double(s.seq) * double(s.seq) * double(s.head_dim);
  finish(e, end, OpKind::Backward, nullptr, "self_attention", qkv.dtype(), {s.batch, s.seq, s.heads, s.head_dim},
         flops, nbytes(qkv) + nbytes(out) + nbytes(lse) + nbytes(dout) + nbytes(dqkv));
}

void TracedBackend::attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_decode(cache, first, out, s);
  Event& e = p_.op_begin("attention_decode");
  be_.attention_decode(cache, first, out, s);
  const Mark end = p_.clock().device(nullptr);
  const double q = double(s.seq - first);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", cache.dtype(), {s.batch, s.seq, s.heads, s.head_dim},
         4.0 * q * double(s.seq) * double(s.heads) * double(s.head_dim), nbytes(cache) + nbytes(out));
}

// Context-parallel blocks: a causal (diagonal) block does half a full block's work.
void TracedBackend::attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                            const ops::AttentionShape& s, bool causal) {
  if (!p_.active()) return be_.attention_block_forward(qkv, kv, out, lse, s, causal);
  Event& e = p_.op_begin("attention_block_forward");
  be_.attention_block_forward(qkv, kv, out, lse, s, causal);
  const Mark end = p_.clock().device(nullptr);
  const double flops = (causal ? 2.0 : 4.0) * double(s.batch) * double(s.heads) * double(s.seq) * double(s.seq) *
                       double(s.head_dim);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", qkv.dtype(), {s.batch, s.seq, s.heads, s.head_dim}, flops,
         nbytes(qkv) + nbytes(kv) + nbytes(out) + nbytes(lse));
}

void TracedBackend::attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                                    const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_merge(acc, lse, block_out, block_lse, s);
  Event& e = p_.op_begin("attention_merge");
  be_.attention_merge(acc, lse, block_out, block_lse, s);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", acc.dtype(), {s.batch, s.seq, s.heads, s.head_dim},
         4.0 * double(block_out.numel()), 2 * nbytes(acc) + nbytes(block_out) + 2 * nbytes(lse) + nbytes(block_lse));
}

void TracedBackend::attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                             const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc,
                                             const ops::AttentionShape& s, bool causal) {
  if (!p_.active()) return be_.attention_block_backward(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal);
  Event& e = p_.op_begin("attention_block_backward");
  be_.attention_block_backward(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal);
  const Mark end = p_.clock().device(nullptr);
  const double flops = (causal ? 4.0 : 8.0) * double(s.batch) * double(s.heads) * double(s.seq) * double(s.seq) *
                       double(s.head_dim);
  finish(e, end, OpKind::Backward, nullptr, "self_attention", qkv.dtype(), {s.batch, s.seq, s.heads, s.head_dim},
         flops, nbytes(qkv) + nbytes(kv) + nbytes(out) + nbytes(lse) + nbytes(dout) + nbytes(dq_acc) + nbytes(dkv_acc));
}

// MoE token permutation: memory-bound row moves.
void TracedBackend::gather_rows(const Tensor& x, const std::vector<int32_t>& index, const std::vector<double>& scale,
                                Tensor& out) {
  if (!p_.active()) return be_.gather_rows(x, index, scale, out);
  Event& e = p_.op_begin("gather_rows");
  be_.gather_rows(x, index, scale, out);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "moe", out.dtype(), {rows(out), cols(out)}, 0.0, 2 * nbytes(out));
}

void TracedBackend::scatter_add_rows(const Tensor& y, const std::vector<int32_t>& index,
                                     const std::vector<double>& scale, Tensor& out) {
  if (!p_.active()) return be_.scatter_add_rows(y, index, scale, out);
  Event& e = p_.op_begin("scatter_add_rows");
  be_.scatter_add_rows(y, index, scale, out);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "moe", y.dtype(), {rows(y), cols(y)}, 2.0 * double(y.numel()),
         3 * nbytes(y));
}

std::vector<double> TracedBackend::row_dots(const Tensor& a, const std::vector<int32_t>& index, const Tensor& b) {
  if (!p_.active()) return be_.row_dots(a, index, b);
  Event& e = p_.op_begin("row_dots");
  std::vector<double> d = be_.row_dots(a, index, b);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Backward, nullptr, "moe", b.dtype(), {rows(b), cols(b)}, 2.0 * double(b.numel()),
         2 * nbytes(b));
  return d;
}

ops::Backend::Fp8Quantized TracedBackend::quantize_fp8(const Tensor& src, fp8::Format format,
                                                       fp8::Granularity granularity, bool reduce_cols, float scale,
                                                       Tensor& dst) {
  if (!p_.active()) return be_.quantize_fp8(src, format, granularity, reduce_cols, scale, dst);
  Event& e = p_.op_begin("quantize_fp8");
  const Fp8Quantized q = be_.quantize_fp8(src, format, granularity, reduce_cols, scale, dst);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "fp8", src.dtype(), {rows(src), cols(src)}, double(src.numel()),
         nbytes(src) + nbytes(dst));
  return q;
}

void TracedBackend::embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) {
  if (!p_.active()) return be_.embedding_forward(tokens, table, out);
  Event& e = p_.op_begin("embedding_forward");
  be_.embedding_forward(tokens, table, out);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, &table, "embedding", out.dtype(), {rows(out), cols(out)}, 0.0,
         2 * nbytes(out) + nbytes(tokens));
}

void TracedBackend::embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) {
  if (!p_.active()) return be_.embedding_backward(host_tokens, dout, dtable);
  Event& e = p_.op_begin("embedding_backward");
  be_.embedding_backward(host_tokens, dout, dtable);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::WeightGrad, &dtable, "embedding", dout.dtype(), {rows(dout), cols(dout)},
         double(dout.numel()), nbytes(dout) + 2.0 * double(dout.numel()) * double(dtype_size(dtable.dtype())));
}

void TracedBackend::column_sum_accumulate(const Tensor& dy, Tensor& out) {
  if (!p_.active()) return be_.column_sum_accumulate(dy, out);
  Event& e = p_.op_begin("column_sum_accumulate");
  be_.column_sum_accumulate(dy, out);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::WeightGrad, &out, nullptr, dy.dtype(), {rows(dy), cols(dy)}, double(dy.numel()),
         nbytes(dy) + 2 * nbytes(out));
}

void TracedBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  if (!p_.active()) return be_.add(a, b, out);
  Event& e = p_.op_begin("add");
  be_.add(a, b, out);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Other, nullptr, "residual", out.dtype(), {rows(out), cols(out)}, double(out.numel()),
         nbytes(a) + nbytes(b) + nbytes(out));
}

void TracedBackend::ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  if (!p_.active()) return be_.ce_init(row_max, row_sum, target_logit);
  Event& e = p_.op_begin("ce_init");
  be_.ce_init(row_max, row_sum, target_logit);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", row_max.dtype(), {rows(row_max)}, 0.0,
         nbytes(row_max) + nbytes(row_sum) + nbytes(target_logit));
}

void TracedBackend::ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, Tensor& row_max,
                                     Tensor& row_sum, Tensor& target_logit) {
  if (!p_.active()) return be_.ce_chunk_forward(logits, targets, c0, row_max, row_sum, target_logit);
  Event& e = p_.op_begin("ce_chunk_forward");
  be_.ce_chunk_forward(logits, targets, c0, row_max, row_sum, target_logit);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", logits.dtype(), {rows(logits), cols(logits)},
         5.0 * double(logits.numel()), nbytes(logits) + nbytes(targets) + 3 * nbytes(row_max));
}

void TracedBackend::ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) {
  if (!p_.active()) return be_.ce_merge_max(row_max, row_sum, global_max);
  Event& e = p_.op_begin("ce_merge_max");
  be_.ce_merge_max(row_max, row_sum, global_max);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", row_max.dtype(), {rows(row_max)}, 3.0 * double(row_max.numel()),
         2 * nbytes(row_max) + 2 * nbytes(row_sum) + nbytes(global_max));
}

double TracedBackend::ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                                const Tensor& targets, Tensor& lse) {
  if (!p_.active()) return be_.ce_finish(row_max, row_sum, target_logit, targets, lse);
  Event& e = p_.op_begin("ce_finish");
  const double r = be_.ce_finish(row_max, row_sum, target_logit, targets, lse);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", lse.dtype(), {rows(lse)}, 3.0 * double(lse.numel()),
         nbytes(row_max) + nbytes(row_sum) + nbytes(target_logit) + nbytes(targets) + nbytes(lse));
  return r;
}

void TracedBackend::ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                      Tensor& dlogits) {
  if (!p_.active()) return be_.ce_chunk_backward(logits, lse, targets, c0, dlogits);
  Event& e = p_.op_begin("ce_chunk_backward");
  be_.ce_chunk_backward(logits, lse, targets, c0, dlogits);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Backward, nullptr, "cross_entropy", logits.dtype(), {rows(logits), cols(logits)},
         3.0 * double(logits.numel()), nbytes(logits) + nbytes(lse) + nbytes(targets) + nbytes(dlogits));
}

void TracedBackend::cast(const Tensor& src, Tensor& dst) {
  if (!p_.active()) return be_.cast(src, dst);
  Event& e = p_.op_begin("cast");
  be_.cast(src, dst);
  const Mark end = p_.clock().device(nullptr);
  finish(e, end, OpKind::Other, nullptr, "cast", src.dtype(), {src.numel()}, 0.0, nbytes(src) + nbytes(dst));
}

}  // namespace primus::trace
