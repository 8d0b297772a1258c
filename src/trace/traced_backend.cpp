#include "trace/traced_backend.h"

#include "kernels/op_call.h"

namespace primus::trace {
namespace {

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
  const ops::OpCall c = ops::gemm_call(trans_a, trans_b, A, B, beta, C, D, bias);
  finish_gemm(e, end, trans_b, B, D, c.dtype, {c.a, c.b, c.c}, c.flops, c.bytes);
}

void TracedBackend::grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                                 const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
  if (!p_.active() || A.empty() || A.size() != B.size() || A.size() != D.size())
    return be_.grouped_gemm(trans_a, trans_b, alpha, A, B, beta, D);
  Event& e = p_.op_begin("gemm");
  be_.grouped_gemm(trans_a, trans_b, alpha, A, B, beta, D);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::grouped_gemm_call(trans_a, trans_b, A, B, beta, D);
  finish_gemm(e, end, trans_b, B[0], D[0], c.dtype, {c.a, c.b, c.c, c.d}, c.flops, c.bytes);
}

void TracedBackend::gemm_fp8(const Fp8Pair& f, bool trans_a, bool trans_b, float alpha, const Tensor& A,
                             const Tensor& B, float beta, const Tensor& C, Tensor& D, const Tensor& bias) {
  if (!p_.active()) return be_.gemm_fp8(f, trans_a, trans_b, alpha, A, B, beta, C, D, bias);
  Event& e = p_.op_begin("gemm");
  be_.gemm_fp8(f, trans_a, trans_b, alpha, A, B, beta, C, D, bias);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::gemm_call(trans_a, trans_b, A, B, beta, C, D, bias);
  finish_gemm(e, end, trans_b, B, D, c.dtype, {c.a, c.b, c.c}, c.flops, c.bytes);
}

void TracedBackend::grouped_gemm_fp8(const std::vector<Fp8Pair>& f, bool trans_a, bool trans_b,
                                     const std::vector<float>& alpha, const std::vector<Tensor>& A,
                                     const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
  if (!p_.active() || A.empty() || A.size() != B.size() || A.size() != D.size())
    return be_.grouped_gemm_fp8(f, trans_a, trans_b, alpha, A, B, beta, D);
  Event& e = p_.op_begin("gemm");
  be_.grouped_gemm_fp8(f, trans_a, trans_b, alpha, A, B, beta, D);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::grouped_gemm_call(trans_a, trans_b, A, B, beta, D);
  finish_gemm(e, end, trans_b, B[0], D[0], c.dtype, {c.a, c.b, c.c, c.d}, c.flops, c.bytes);
}

void TracedBackend::rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) {
  if (!p_.active()) return be_.rmsnorm_forward(x, w, y, rstd, eps);
  Event& e = p_.op_begin("rmsnorm_forward");
  be_.rmsnorm_forward(x, w, y, rstd, eps);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::rmsnorm_forward_call(x, w, y, rstd);
  finish(e, end, OpKind::Forward, &w, "norm", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                           const Tensor& residual, Tensor& dx) {
  if (!p_.active()) return be_.rmsnorm_backward_input(dy, x, w, rstd, residual, dx);
  Event& e = p_.op_begin("rmsnorm_backward_input");
  be_.rmsnorm_backward_input(dy, x, w, rstd, residual, dx);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::rmsnorm_backward_input_call(dy, x, w, rstd, residual, dx);
  finish(e, end, OpKind::Backward, &w, "norm", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) {
  if (!p_.active()) return be_.rmsnorm_backward_weight(dy, x, rstd, dw);
  Event& e = p_.op_begin("rmsnorm_backward_weight");
  be_.rmsnorm_backward_weight(dy, x, rstd, dw);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::rmsnorm_backward_weight_call(dy, x, rstd, dw);
  finish(e, end, OpKind::WeightGrad, &dw, "norm", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::glu_forward(const Tensor& gate_up, Tensor& act, const ops::Glu& glu) {
  if (!p_.active()) return be_.glu_forward(gate_up, act, glu);
  Event& e = p_.op_begin("swiglu_forward");
  be_.glu_forward(gate_up, act, glu);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::swiglu_forward_call(gate_up, act);
  finish(e, end, OpKind::Forward, nullptr, "mlp", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const ops::Glu& glu) {
  if (!p_.active()) return be_.glu_backward(dact, gate_up, dgate_up, glu);
  Event& e = p_.op_begin("swiglu_backward");
  be_.glu_backward(dact, gate_up, dgate_up, glu);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::swiglu_backward_call(dact, gate_up, dgate_up);
  finish(e, end, OpKind::Backward, nullptr, "mlp", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                               const Tensor& sin, bool inverse) {
  if (!p_.active()) return be_.rope_apply(x, heads, head_dim, seq, pos0, cos, sin, inverse);
  Event& e = p_.op_begin("rope_apply");
  be_.rope_apply(x, heads, head_dim, seq, pos0, cos, sin, inverse);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::rope_call(x, heads, head_dim, seq, inverse);
  finish(e, end, inverse ? OpKind::Backward : OpKind::Forward, nullptr, "self_attention", c.dtype, {c.a, c.c, c.d},
         c.flops, c.bytes);
}

void TracedBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_forward(qkv, out, lse, s);
  Event& e = p_.op_begin("attention_forward");
  be_.attention_forward(qkv, out, lse, s);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::attention_forward_call(qkv, out, lse, s);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", c.dtype, {s.batch, s.seq, s.heads, s.head_dim}, c.flops,
         c.bytes);
}

void TracedBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       Tensor& dqkv, const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_backward(qkv, out, lse, dout, dqkv, s);
  Event& e = p_.op_begin("attention_backward");
  be_.attention_backward(qkv, out, lse, dout, dqkv, s);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::attention_backward_call(qkv, out, lse, dout, dqkv, s);
  finish(e, end, OpKind::Backward, nullptr, "self_attention", c.dtype, {s.batch, s.seq, s.heads, s.head_dim}, c.flops,
         c.bytes);
}

void TracedBackend::attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                                            const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_sink_backward(out, lse, dout, dsinks, s);
  Event& e = p_.op_begin("attention_sink_backward");
  be_.attention_sink_backward(out, lse, dout, dsinks, s);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::attention_sink_backward_call(out, lse, dout, dsinks, s);
  finish(e, end, OpKind::Backward, nullptr, "self_attention", c.dtype, {s.batch, s.seq, s.heads, s.head_dim}, c.flops,
         c.bytes);
}

void TracedBackend::attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_decode(cache, first, out, s);
  Event& e = p_.op_begin("attention_decode");
  be_.attention_decode(cache, first, out, s);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::attention_decode_call(cache, first, out, s);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", c.dtype, {s.batch, s.seq, s.heads, s.head_dim}, c.flops,
         c.bytes);
}

// Context-parallel blocks: a causal (diagonal) block does half a full block's work.
void TracedBackend::attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                            const ops::AttentionShape& s, bool causal) {
  if (!p_.active()) return be_.attention_block_forward(qkv, kv, out, lse, s, causal);
  Event& e = p_.op_begin("attention_block_forward");
  be_.attention_block_forward(qkv, kv, out, lse, s, causal);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::attention_block_forward_call(qkv, kv, out, lse, s, causal);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", c.dtype, {s.batch, s.seq, s.heads, s.head_dim}, c.flops,
         c.bytes);
}

void TracedBackend::attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                                    const ops::AttentionShape& s) {
  if (!p_.active()) return be_.attention_merge(acc, lse, block_out, block_lse, s);
  Event& e = p_.op_begin("attention_merge");
  be_.attention_merge(acc, lse, block_out, block_lse, s);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::attention_merge_call(acc, lse, block_out, block_lse, s);
  finish(e, end, OpKind::Forward, nullptr, "self_attention", acc.dtype(), {s.batch, s.seq, s.heads, s.head_dim},
         c.flops, c.bytes);
}

void TracedBackend::attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                             const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc,
                                             const ops::AttentionShape& s, bool causal) {
  if (!p_.active()) return be_.attention_block_backward(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal);
  Event& e = p_.op_begin("attention_block_backward");
  be_.attention_block_backward(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::attention_block_backward_call(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal);
  finish(e, end, OpKind::Backward, nullptr, "self_attention", c.dtype, {s.batch, s.seq, s.heads, s.head_dim}, c.flops,
         c.bytes);
}

// MoE token permutation: memory-bound row moves.
void TracedBackend::gather_rows(const Tensor& x, const std::vector<int32_t>& index, const std::vector<double>& scale,
                                Tensor& out) {
  if (!p_.active()) return be_.gather_rows(x, index, scale, out);
  Event& e = p_.op_begin("gather_rows");
  be_.gather_rows(x, index, scale, out);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::gather_rows_call(x, index.size(), out);
  finish(e, end, OpKind::Forward, nullptr, "moe", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::scatter_add_rows(const Tensor& y, const std::vector<int32_t>& index,
                                     const std::vector<double>& scale, Tensor& out) {
  if (!p_.active()) return be_.scatter_add_rows(y, index, scale, out);
  Event& e = p_.op_begin("scatter_add_rows");
  be_.scatter_add_rows(y, index, scale, out);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::scatter_add_rows_call(y, out);
  finish(e, end, OpKind::Forward, nullptr, "moe", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

std::vector<double> TracedBackend::row_dots(const Tensor& a, const std::vector<int32_t>& index, const Tensor& b) {
  if (!p_.active()) return be_.row_dots(a, index, b);
  Event& e = p_.op_begin("row_dots");
  std::vector<double> d = be_.row_dots(a, index, b);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::row_dots_call(a, b);
  finish(e, end, OpKind::Backward, nullptr, "moe", c.dtype, {c.a, c.b}, c.flops, c.bytes);
  return d;
}

ops::Backend::Fp8Quantized TracedBackend::quantize_fp8(const Tensor& src, fp8::Format format,
                                                       fp8::Granularity granularity, bool reduce_cols, float scale,
                                                       Tensor& dst, const Fp8AmaxOut& amax_out) {
  if (!p_.active()) return be_.quantize_fp8(src, format, granularity, reduce_cols, scale, dst, amax_out);
  Event& e = p_.op_begin("quantize_fp8");
  const Fp8Quantized q = be_.quantize_fp8(src, format, granularity, reduce_cols, scale, dst, amax_out);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::quantize_fp8_call(src, dst);
  finish(e, end, OpKind::Forward, nullptr, "fp8", c.dtype, {c.a, c.b}, c.flops, c.bytes);
  return q;
}

void TracedBackend::embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) {
  if (!p_.active()) return be_.embedding_forward(tokens, table, out);
  Event& e = p_.op_begin("embedding_forward");
  be_.embedding_forward(tokens, table, out);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::embedding_forward_call(tokens, table, out);
  finish(e, end, OpKind::Forward, &table, "embedding", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) {
  if (!p_.active()) return be_.embedding_backward(host_tokens, dout, dtable);
  Event& e = p_.op_begin("embedding_backward");
  be_.embedding_backward(host_tokens, dout, dtable);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::embedding_backward_call(dout, dtable);
  finish(e, end, OpKind::WeightGrad, &dtable, "embedding", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::column_sum_accumulate(const Tensor& dy, Tensor& out) {
  if (!p_.active()) return be_.column_sum_accumulate(dy, out);
  Event& e = p_.op_begin("column_sum_accumulate");
  be_.column_sum_accumulate(dy, out);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::column_sum_accumulate_call(dy, out);
  finish(e, end, OpKind::WeightGrad, &out, nullptr, c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  if (!p_.active()) return be_.add(a, b, out);
  Event& e = p_.op_begin("add");
  be_.add(a, b, out);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::add_call(a, b, out);
  finish(e, end, OpKind::Other, nullptr, "residual", c.dtype, {rows(out), cols(out)}, c.flops, c.bytes);
}

void TracedBackend::dropout(const Tensor& x, Tensor& y, double p, uint64_t seed) {
  if (!p_.active()) return be_.dropout(x, y, p, seed);
  Event& e = p_.op_begin("dropout");
  be_.dropout(x, y, p, seed);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::dropout_call(x, y);
  finish(e, end, OpKind::Other, nullptr, "lora", c.dtype, {rows(y), cols(y)}, c.flops, c.bytes);
}

void TracedBackend::ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  if (!p_.active()) return be_.ce_init(row_max, row_sum, target_logit);
  Event& e = p_.op_begin("ce_init");
  be_.ce_init(row_max, row_sum, target_logit);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::ce_init_call(row_max, row_sum, target_logit);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", c.dtype, {c.a}, c.flops, c.bytes);
}

void TracedBackend::ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                     Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  if (!p_.active()) return be_.ce_chunk_forward(logits, targets, c0, softcap, row_max, row_sum, target_logit);
  Event& e = p_.op_begin("ce_chunk_forward");
  be_.ce_chunk_forward(logits, targets, c0, softcap, row_max, row_sum, target_logit);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::ce_chunk_forward_call(logits, targets, row_max);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

void TracedBackend::ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) {
  if (!p_.active()) return be_.ce_merge_max(row_max, row_sum, global_max);
  Event& e = p_.op_begin("ce_merge_max");
  be_.ce_merge_max(row_max, row_sum, global_max);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::ce_merge_max_call(row_max, row_sum, global_max);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", c.dtype, {c.a}, c.flops, c.bytes);
}

double TracedBackend::ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                                const Tensor& targets, Tensor& lse) {
  if (!p_.active()) return be_.ce_finish(row_max, row_sum, target_logit, targets, lse);
  Event& e = p_.op_begin("ce_finish");
  const double r = be_.ce_finish(row_max, row_sum, target_logit, targets, lse);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::ce_finish_call(row_max, row_sum, target_logit, targets, lse);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", c.dtype, {c.a}, c.flops, c.bytes);
  return r;
}

void TracedBackend::ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                      double softcap, Tensor& dlogits) {
  if (!p_.active()) return be_.ce_chunk_backward(logits, lse, targets, c0, softcap, dlogits);
  Event& e = p_.op_begin("ce_chunk_backward");
  be_.ce_chunk_backward(logits, lse, targets, c0, softcap, dlogits);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::ce_chunk_backward_call(logits, lse, targets, dlogits);
  finish(e, end, OpKind::Backward, nullptr, "cross_entropy", c.dtype, {c.a, c.b}, c.flops, c.bytes);
}

double TracedBackend::ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                          Tensor& lse, Tensor& dlogits) {
  if (!p_.active()) return be_.ce_forward_backward(logits, targets, c0, softcap, lse, dlogits);
  Event& e = p_.op_begin("ce_forward_backward");
  const double r = be_.ce_forward_backward(logits, targets, c0, softcap, lse, dlogits);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::ce_forward_backward_call(logits, targets, lse, dlogits);
  finish(e, end, OpKind::Forward, nullptr, "cross_entropy", c.dtype, {c.a, c.b}, c.flops, c.bytes);
  return r;
}

void TracedBackend::cast(const Tensor& src, Tensor& dst) {
  if (!p_.active()) return be_.cast(src, dst);
  Event& e = p_.op_begin("cast");
  be_.cast(src, dst);
  const Mark end = p_.clock().device(nullptr);
  const ops::OpCall c = ops::cast_call(src, dst);
  finish(e, end, OpKind::Other, nullptr, "cast", c.dtype, {src.numel()}, c.flops, c.bytes);
}

}  // namespace primus::trace
