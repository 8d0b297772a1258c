#include "kernels/op_call.h"

#include <algorithm>

#include <fmt/format.h>

namespace primus::ops {
namespace {

double nbytes(const Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }
int64_t rows(const Tensor& t) { return t.dim() > 0 ? t.size(0) : 0; }
int64_t cols(const Tensor& t) { return t.dim() > 1 ? t.size(1) : 1; }

OpCall call(const char* op, DType dtype, int64_t a, int64_t b, double flops, double bytes,
            const void* weight = nullptr) {
  OpCall c;
  c.op = op;
  c.dtype = c.out = dtype;
  c.a = a, c.b = b;
  c.flops = flops;
  c.bytes = bytes;
  c.weight = weight;
  return c;
}

OpCall attention(const char* op, DType dtype, const cpu::AttentionShape& s, double flops, double bytes) {
  OpCall c = call(op, dtype, s.batch, s.seq, flops, bytes);
  c.c = s.heads, c.d = s.groups, c.e = s.head_dim;
  c.window = s.window;
  return c;
}

// Causal attention over s positions: QK^T and PV over half the pairs (s^2 / 2), 4 d FLOPs per
// query and key. A sliding window of w leaves out the (s - w - 1)(s - w) / 2 pairs behind it.
double causal_flops(const cpu::AttentionShape& s) {
  const double S = double(s.seq), W = double(s.window);
  const double behind = s.window >= 0 && s.window + 1 < s.seq ? (S - W - 1) * (S - W) / 2 : 0.0;
  return 4.0 * double(s.batch) * double(s.heads) * (S * S / 2 - behind) * double(s.head_dim);
}

}  // namespace

std::string OpCall::key() const {
  std::string k = fmt::format("{}:{}>{}:{}x{}x{}x{}x{}:{}{}{}{}{}{}", op, dtype_name(dtype), dtype_name(out), a, b, c,
                              d, e, trans_a, trans_b, accumulate, bias, inverse, causal);
  for (const auto& p : problems) k += fmt::format(":{}x{}x{}", p[0], p[1], p[2]);
  if (window >= 0) k += fmt::format(":w{}", window);
  if (fp8) k += fmt::format(":fp8 {}", fp8::granularity_name(fp8->coarsest()));
  return k;
}

OpCall gemm_call(bool trans_a, bool trans_b, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
                 const Tensor& D, const Tensor& bias) {
  const int64_t M = D.size(0), N = D.size(1), K = trans_a ? A.size(0) : A.size(1);
  const bool reads_c = beta != 0 && C.defined();
  OpCall g = call("gemm", A.dtype(), M, N, 2.0 * double(M) * double(N) * double(K),
                  nbytes(A) + nbytes(B) + nbytes(D) + (reads_c && C.raw() != D.raw() ? nbytes(C) : 0) + nbytes(bias),
                  trans_a ? D.raw() : B.raw());
  g.c = K;
  g.out = D.dtype();
  g.trans_a = trans_a, g.trans_b = trans_b;
  g.accumulate = reads_c;
  g.bias = bias.defined();
  return g;
}

// One call for the group: its FLOPs and bytes summed, a..d the one GEMM it equals (the problems'
// rows stacked; for weight gradients their K), and the problems.
OpCall grouped_gemm_call(bool trans_a, bool trans_b, const std::vector<Tensor>& A, const std::vector<Tensor>& B,
                         float beta, const std::vector<Tensor>& D) {
  OpCall g = call("grouped_gemm", A.empty() ? DType::F32 : A[0].dtype(), 0, 0, 0, 0);
  int64_t M = 0, K = 0;
  for (size_t i = 0; i < A.size(); ++i) {
    const int64_t m = D[i].size(0), n = D[i].size(1), k = trans_a ? A[i].size(0) : A[i].size(1);
    g.problems.push_back({m, n, k});
    M += m, K += k;
    g.flops += 2.0 * double(m) * double(n) * double(k);
    g.bytes += nbytes(A[i]) + nbytes(B[i]) + nbytes(D[i]);
  }
  if (A.empty()) return g;
  g.a = trans_a ? D[0].size(0) : M;  // weight gradients: one [M, N] each, over their own rows (K)
  g.b = D[0].size(1);
  g.c = trans_a ? K : A[0].size(1);
  g.d = int64_t(A.size());
  g.out = D[0].dtype();
  g.trans_a = trans_a, g.trans_b = trans_b;
  g.accumulate = beta != 0;
  g.weight = trans_a ? D[0].raw() : B[0].raw();
  return g;
}

OpCall rmsnorm_forward_call(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd) {
  return call("rmsnorm_forward", x.dtype(), rows(x), cols(x), 4.0 * double(x.numel()),
              nbytes(x) + nbytes(w) + nbytes(y) + nbytes(rstd), w.raw());
}

OpCall rmsnorm_backward_input_call(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                   const Tensor& residual, const Tensor& dx) {
  OpCall c = call("rmsnorm_backward_input", x.dtype(), rows(x), cols(x), 8.0 * double(x.numel()),
                  nbytes(dy) + nbytes(x) + nbytes(w) + nbytes(rstd) + nbytes(residual) + nbytes(dx), w.raw());
  c.accumulate = residual.defined();
  return c;
}

OpCall rmsnorm_backward_weight_call(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& dw) {
  return call("rmsnorm_backward_weight", x.dtype(), rows(x), cols(x), 3.0 * double(x.numel()),
              nbytes(dy) + nbytes(x) + nbytes(rstd) + 2 * nbytes(dw), dw.raw());
}

OpCall swiglu_forward_call(const Tensor& gate_up, const Tensor& act) {
  return call("swiglu_forward", act.dtype(), rows(act), cols(act), 5.0 * double(act.numel()),
              nbytes(gate_up) + nbytes(act));
}

OpCall swiglu_backward_call(const Tensor& dact, const Tensor& gate_up, const Tensor& dgate_up) {
  return call("swiglu_backward", dact.dtype(), rows(dact), cols(dact), 10.0 * double(dact.numel()),
              nbytes(dact) + nbytes(gate_up) + nbytes(dgate_up));
}

OpCall rope_call(const Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, bool inverse) {
  const double n = double(rows(x)) * double(heads) * double(head_dim);
  OpCall c = call("rope_apply", x.dtype(), rows(x), cols(x), 3.0 * n, 2.0 * n * double(dtype_size(x.dtype())));
  c.c = heads, c.d = head_dim, c.e = seq;
  c.inverse = inverse;
  return c;
}

OpCall attention_forward_call(const Tensor& qkv, const Tensor& out, const Tensor& lse, const cpu::AttentionShape& s) {
  return attention("attention_forward", qkv.dtype(), s, causal_flops(s), nbytes(qkv) + nbytes(out) + nbytes(lse));
}

OpCall attention_backward_call(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                               const Tensor& dqkv, const cpu::AttentionShape& s) {
  return attention("attention_backward", qkv.dtype(), s, 2.0 * causal_flops(s),
                   nbytes(qkv) + nbytes(out) + nbytes(lse) + nbytes(dout) + nbytes(dqkv));
}

OpCall attention_sink_backward_call(const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dsinks,
                                    const cpu::AttentionShape& s) {
  OpCall c = attention("attention_sink_backward", out.dtype(), s, 2.0 * double(out.numel()) + 3.0 * double(lse.numel()),
                       nbytes(out) + nbytes(dout) + nbytes(lse) + 2 * nbytes(dsinks));
  c.out = dsinks.dtype();
  return c;
}

OpCall attention_decode_call(const Tensor& cache, int64_t first, const Tensor& out, const cpu::AttentionShape& s) {
  const double q = double(s.seq - first);
  const double keys = s.window >= 0 ? std::min(double(s.seq), double(s.window + 1)) : double(s.seq);
  return attention("attention_decode", cache.dtype(), s, 4.0 * q * keys * double(s.heads) * double(s.head_dim),
                   nbytes(cache) + nbytes(out));
}

// Context-parallel blocks: a causal (diagonal) block does half a full block's work.
OpCall attention_block_forward_call(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                    const cpu::AttentionShape& s, bool causal) {
  OpCall c = attention("attention_block_forward", qkv.dtype(), s, (causal ? 1.0 : 2.0) * causal_flops(s),
                       nbytes(qkv) + nbytes(kv) + nbytes(out) + nbytes(lse));
  c.causal = causal;
  return c;
}

OpCall attention_merge_call(const Tensor& acc, const Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                            const cpu::AttentionShape& s) {
  OpCall c = attention("attention_merge", block_out.dtype(), s, 4.0 * double(block_out.numel()),
                       2 * nbytes(acc) + nbytes(block_out) + 2 * nbytes(lse) + nbytes(block_lse));
  c.out = acc.dtype();
  return c;
}

OpCall attention_block_backward_call(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                     const Tensor& dout, const Tensor& dq_acc, const Tensor& dkv_acc,
                                     const cpu::AttentionShape& s, bool causal) {
  OpCall c = attention("attention_block_backward", qkv.dtype(), s, (causal ? 2.0 : 4.0) * causal_flops(s),
                       nbytes(qkv) + nbytes(kv) + nbytes(out) + nbytes(lse) + nbytes(dout) + nbytes(dq_acc) +
                           nbytes(dkv_acc));
  c.causal = causal;
  c.out = dq_acc.dtype();
  return c;
}

// MoE token permutation: memory-bound row moves.
OpCall gather_rows_call(const Tensor& x, size_t listed, const Tensor& out) {
  OpCall c = call("gather_rows", out.dtype(), int64_t(listed), cols(out), 0.0, 2 * nbytes(out));
  c.c = rows(x);
  return c;
}

OpCall scatter_add_rows_call(const Tensor& y, const Tensor& out) {
  OpCall c = call("scatter_add_rows", y.dtype(), rows(y), cols(y), 2.0 * double(y.numel()), 3 * nbytes(y));
  c.c = rows(out);
  return c;
}

OpCall row_dots_call(const Tensor& a, const Tensor& b) {
  OpCall c = call("row_dots", b.dtype(), rows(b), cols(b), 2.0 * double(b.numel()), 2 * nbytes(b));
  c.c = rows(a);
  return c;
}

OpCall embedding_forward_call(const Tensor& tokens, const Tensor& table, const Tensor& out) {
  OpCall c = call("embedding_forward", out.dtype(), rows(out), cols(out), 0.0, 2 * nbytes(out) + nbytes(tokens),
                  table.raw());
  c.c = rows(table);
  return c;
}

OpCall embedding_backward_call(const Tensor& dout, const Tensor& dtable) {
  OpCall c = call("embedding_backward", dout.dtype(), rows(dout), cols(dout), double(dout.numel()),
                  nbytes(dout) + 2.0 * double(dout.numel()) * double(dtype_size(dtable.dtype())), dtable.raw());
  c.c = rows(dtable);
  c.out = dtable.dtype();
  return c;
}

OpCall column_sum_accumulate_call(const Tensor& dy, const Tensor& out) {
  OpCall c = call("column_sum_accumulate", dy.dtype(), rows(dy), cols(dy), double(dy.numel()),
                  nbytes(dy) + 2 * nbytes(out), out.raw());
  c.out = out.dtype();
  return c;
}

OpCall add_call(const Tensor& a, const Tensor& b, const Tensor& out) {
  return call("add", out.dtype(), rows(out), out.numel() / std::max<int64_t>(rows(out), 1), double(out.numel()),
              nbytes(a) + nbytes(b) + nbytes(out));
}

OpCall dropout_call(const Tensor& x, const Tensor& y) {
  return call("dropout", y.dtype(), rows(y), y.numel() / std::max<int64_t>(rows(y), 1), double(y.numel()),
              nbytes(x) + nbytes(y));
}

OpCall ce_init_call(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit) {
  return call("ce_init", row_max.dtype(), rows(row_max), 1, 0.0,
              nbytes(row_max) + nbytes(row_sum) + nbytes(target_logit));
}

OpCall ce_chunk_forward_call(const Tensor& logits, const Tensor& targets, const Tensor& row_max) {
  return call("ce_chunk_forward", logits.dtype(), rows(logits), cols(logits), 5.0 * double(logits.numel()),
              nbytes(logits) + nbytes(targets) + 3 * nbytes(row_max));
}

OpCall ce_merge_max_call(const Tensor& row_max, const Tensor& row_sum, const Tensor& global_max) {
  return call("ce_merge_max", row_max.dtype(), rows(row_max), 1, 3.0 * double(row_max.numel()),
              2 * nbytes(row_max) + 2 * nbytes(row_sum) + nbytes(global_max));
}

OpCall ce_finish_call(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit, const Tensor& targets,
                      const Tensor& lse) {
  return call("ce_finish", lse.dtype(), rows(lse), 1, 3.0 * double(lse.numel()),
              nbytes(row_max) + nbytes(row_sum) + nbytes(target_logit) + nbytes(targets) + nbytes(lse));
}

OpCall ce_chunk_backward_call(const Tensor& logits, const Tensor& lse, const Tensor& targets, const Tensor& dlogits) {
  OpCall c = call("ce_chunk_backward", logits.dtype(), rows(logits), cols(logits), 3.0 * double(logits.numel()),
                  nbytes(logits) + nbytes(lse) + nbytes(targets) + nbytes(dlogits));
  c.out = dlogits.dtype();
  return c;
}

// The statistics' and the gradient's arithmetic (ce_chunk_forward's 5 and ce_chunk_backward's 3
// per logit); the logits read once.
OpCall ce_forward_backward_call(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogits) {
  OpCall c = call("ce_forward_backward", logits.dtype(), rows(logits), cols(logits), 8.0 * double(logits.numel()),
                  nbytes(logits) + nbytes(targets) + nbytes(lse) + nbytes(dlogits));
  c.out = dlogits.dtype();
  return c;
}

OpCall cast_call(const Tensor& src, const Tensor& dst) {
  OpCall c = call("cast", src.dtype(), rows(src), src.numel() / std::max<int64_t>(rows(src), 1), 0.0,
                  nbytes(src) + nbytes(dst));
  c.out = dst.dtype();
  return c;
}

// FP8 quantization of a GEMM operand (backend.h quantize_fp8): an operation per value, the
// operand read and its quantized copy written.
OpCall quantize_fp8_call(const Tensor& src, const Tensor& dst) {
  return call("quantize_fp8", src.dtype(), rows(src), cols(src), double(src.numel()), nbytes(src) + nbytes(dst));
}

OpCall copy_call(size_t width, size_t rows, size_t dpitch, size_t spitch) {
  OpCall c = call("copy", DType::F32, int64_t(rows), int64_t(width), 0.0, 2.0 * double(width) * double(rows));
  c.c = int64_t(dpitch), c.d = int64_t(spitch);
  return c;
}

OpCall zero_call(size_t bytes) { return call("zero", DType::F32, int64_t(bytes), 1, 0.0, double(bytes)); }

}  // namespace primus::ops
