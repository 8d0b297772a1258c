#include "projection/workload.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/backend.h"

namespace primus::projection {
namespace {

// The sizes every part needs, for one rank of tp.
// Under MLA (model/mla.h) the attention op runs on packed heads: groups = heads, D = W (the
// widest head part), Q = the packed [q | k | v] width, QS = the padded output width; P is
// linear_proj's input (heads x v_head_dim), and the ml* fields the latent projections' widths.
struct Dims {
  int64_t N, Nl, C, hl, gl, D, Q, QS, P, Fl, Vl, b, s;  // N, Nl: this cp rank's tokens
  bool mla = false, mla_norms = false;
  bool qk_norm = false;  // qk_layernorm on standard attention (model/qk_norm.h)
  int64_t Dq = 0, dn = 0, dr = 0, dv = 0, Rq = 0, R = 0;  // MLA: q head, its parts, v head, q and kv latents
  double a, st;  // bytes of an activation and of a statistic
  DType act;
  bool tp, sp;
  int cp;
  bool a2a;
};

Dims dims_of(const ModelSpec& m, const WorkloadShape& w) {
  Dims d;
  d.b = w.micro_batch_size;
  d.s = w.seq_length;
  d.cp = std::max(w.cp, 1);
  d.a2a = w.cp_a2a;
  d.N = d.b * d.s / d.cp;
  d.Nl = w.sequence_parallel && w.tp > 1 ? d.N / w.tp : d.N;
  d.C = m.hidden_size;
  d.hl = m.num_attention_heads / w.tp;
  d.gl = m.query_groups() / w.tp;
  d.D = m.head_dim();
  d.Q = (d.hl + 2 * d.gl) * d.D;
  d.QS = d.hl * d.D;
  d.P = d.QS;
  d.qk_norm = m.qk_layernorm && !m.multi_latent_attention;
  if (m.multi_latent_attention) {
    d.mla = true;
    d.mla_norms = m.qk_layernorm;
    d.dn = m.qk_head_dim, d.dr = m.qk_pos_emb_head_dim, d.dv = m.v_head_dim;
    d.Dq = d.dn + d.dr;
    d.Rq = m.q_lora_rank, d.R = m.kv_lora_rank;
    d.D = std::max(d.Dq, d.dv);
    d.gl = d.hl;
    d.Q = 3 * d.hl * d.D;
    d.QS = d.hl * d.D;
    d.P = d.hl * d.dv;
  }
  d.Fl = m.ffn_hidden_size / w.tp;
  d.Vl = m.vocab_size / w.tp;
  d.act = activation_dtype(w.precision);
  d.a = double(dtype_size(d.act));
  d.st = double(dtype_size(ops::stat_dtype(d.act)));
  d.tp = w.tp > 1;
  d.sp = w.sequence_parallel && w.tp > 1;
  return d;
}

OpSpec gemm(const Dims& d, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, bool out_stat, bool acc) {
  OpSpec o;
  o.op = "gemm";
  o.a = m, o.b = n, o.c = k;
  o.trans_a = trans_a, o.trans_b = trans_b, o.out_stat = out_stat, o.accumulate = acc;
  o.dtype = d.act;
  o.flops = 2.0 * double(m) * double(n) * double(k);
  o.bytes = (double(m) * double(k) + double(k) * double(n)) * d.a + double(m) * double(n) * (out_stat ? 4.0 : d.a);
  return o;
}

OpSpec elementwise(const Dims& d, const char* op, int64_t rows, int64_t cols, double flops_per, double bytes_per) {
  OpSpec o;
  o.op = op;
  o.a = rows, o.b = cols;
  o.dtype = d.act;
  o.flops = flops_per * double(rows) * double(cols);
  o.bytes = bytes_per * double(rows) * double(cols);
  return o;
}

OpSpec attention(const Dims& d, bool backward) {
  OpSpec o;
  o.op = backward ? "attention_backward" : "attention_forward";
  o.a = d.b, o.b = d.s, o.c = d.hl, o.d = d.gl, o.e = d.D;
  o.dtype = d.act;
  o.flops = (backward ? 4.0 : 2.0) * double(d.b) * double(d.hl) * double(d.s) * double(d.s) * double(d.D);
  o.bytes = (backward ? 2.0 : 1.0) * (double(d.N) * double(d.Q + d.QS) * d.a) + double(d.N * d.hl) * d.st;
  return o;
}

// One block of ring attention (context_parallel.cpp): a query chunk of the rank against a key chunk,
// [batch, seq / (2 cp)] rows each; the diagonal block is causal, the others full.
OpSpec attention_block(const Dims& d, bool backward, bool causal) {
  const int64_t ch = d.s / (2 * d.cp), rows = d.b * ch;
  OpSpec o;
  o.op = backward ? "attention_block_backward" : "attention_block_forward";
  o.a = d.b, o.b = ch, o.c = d.hl, o.d = d.gl, o.e = d.D;
  o.causal = causal;
  o.dtype = d.act;
  o.flops = (backward ? 2.0 : 1.0) * (causal ? 2.0 : 4.0) * double(d.b) * double(d.hl) * double(ch) * double(ch) *
            double(d.D);
  o.bytes = (backward ? 2.0 : 1.0) * double(rows) * double(d.Q + d.QS) * d.a + double(rows * d.hl) * d.st;
  return o;
}

// Attention over this rank's tokens and every earlier position: one op without context parallel;
// under cp the all-to-all around the whole-sequence kernel (a2a), or the ring's blocks, merges and
// transfers, step by step (p2p), as context_parallel.cpp runs them.
void attention_ops(const Dims& d, PassWork& p, bool backward) {
  if (d.cp == 1) {
    p.ops.push_back(attention(d, backward));
    return;
  }
  const double qkv = double(d.N) * double(d.Q) * d.a, out = double(d.N) * double(d.QS) * d.a;
  if (d.a2a) {  // every rank: the whole sequence for heads / cp
    Dims h = d;
    h.N = d.b * d.s, h.hl = d.hl / d.cp, h.gl = d.gl / d.cp, h.Q = (h.hl + 2 * h.gl) * d.D, h.QS = h.hl * d.D;
    p.comms.push_back({"all_to_all", backward ? out : qkv, true});
    p.ops.push_back(attention(h, backward));
    p.comms.push_back({"all_to_all", backward ? qkv : out, true});
    return;
  }
  const int64_t rows = d.b * (d.s / (2 * d.cp)), KV = 2 * d.gl * d.D;
  const double kv = double(2 * rows * KV) * d.a, dkv = double(2 * rows * KV) * d.st;
  int prev_first = -1, prev_end = -1;  // the previous step's ops (backward: its key/value gradient is in flight)
  for (int i = 0; i < d.cp; ++i) {
    const int first = int(p.ops.size());
    if (i == 0) {  // the rank's own chunks: two diagonals and the late queries against the early keys
      p.ops.push_back(attention_block(d, backward, true));
      p.ops.push_back(attention_block(d, backward, false));
      p.ops.push_back(attention_block(d, backward, true));
    } else {  // two full blocks
      p.ops.push_back(attention_block(d, backward, false));
      p.ops.push_back(attention_block(d, backward, false));
    }
    if (!backward) {
      for (int m = 0; m < (i == 0 ? 1 : 2); ++m) {
        OpSpec merge;
        merge.op = "attention_merge";
        merge.a = d.b, merge.b = d.s / (2 * d.cp), merge.c = d.hl, merge.d = d.gl, merge.e = d.D;
        merge.dtype = d.act;
        merge.flops = 0;
        merge.bytes = double(rows * d.QS) * (2 * d.st + d.a) + 3.0 * double(rows * d.hl) * d.st;
        p.ops.push_back(merge);
      }
    } else if (i > 0) {
      p.ops.push_back(elementwise(d, "add", 2 * rows, KV, 1, 3 * d.st));
      p.ops.back().dtype = ops::stat_dtype(d.act);
    }
    const int end = int(p.ops.size());
    if (i + 1 < d.cp) p.comms.push_back({"p2p", kv, true, false, first, end});  // the next key/value block
    if (backward && i > 0) p.comms.push_back({"p2p", dkv, true, false, prev_first, prev_end});
    prev_first = first, prev_end = end;
  }
  if (backward) p.comms.push_back({"p2p", dkv, true, 0, 0});  // the rank's own gradient, after the last step
}

OpSpec rope(const Dims& d, bool inverse) {
  OpSpec o = elementwise(d, "rope_apply", d.N, (d.hl + d.gl) * d.D, 3.0, 2.0 * d.a);
  o.b = d.Q;  // rows of the fused qkv; the first hl + gl heads rotate
  o.c = d.hl + d.gl;
  o.d = d.D;
  o.e = d.s;
  o.inverse = inverse;
  return o;
}

double bytes(double rows, double cols, double size) { return rows * cols * size; }

// A device copy of a [rows, cols] block (MLA's packing of heads, model/mla.cpp copy_block).
OpSpec copy(const Dims& d, int64_t rows, int64_t cols) { return elementwise(d, "copy", rows, cols, 0, 2 * d.a); }

OpSpec rope_part(const Dims& d, int64_t heads, bool inverse) {  // MLA's rotary parts: heads x dr columns
  OpSpec o = elementwise(d, "rope_apply", d.N, heads * d.dr, 3.0, 2.0 * d.a);
  o.b = heads * d.dr, o.c = heads, o.d = d.dr, o.e = d.s;
  o.inverse = inverse;
  return o;
}

// QK-norm (QkNorm): per head, the q heads' and the k groups' columns copied out of the fused qkv,
// normalized (forward) or back-propagated, and copied back; the weights' gradients in W.
void qk_norm_ops(const Dims& d, PassWork& p, const char* op, double flops, double bytes_per) {
  for (const int64_t heads : {d.hl, d.gl}) {
    p.ops.push_back(copy(d, d.N, heads * d.D));
    p.ops.push_back(elementwise(d, op, d.N * heads, d.D, flops, bytes_per * d.a));
    p.ops.push_back(copy(d, d.N, heads * d.D));
  }
}

// MLA's forward up to the packed qkv (Mla::forward): the q path (one projection, or down, norm,
// up), the kv latent with the shared rotary key, its norm and up projection, the rotary parts,
// and the packing into [N, 3 heads W] (zeroed, then the parts copied in).
void mla_forward_ops(const Dims& d, PassWork& p) {
  if (d.Rq > 0) {
    p.ops.push_back(gemm(d, d.N, d.Rq, d.C, false, true, false, false));
    if (d.mla_norms) p.ops.push_back(elementwise(d, "rmsnorm_forward", d.N, d.Rq, 4, 2 * d.a));
    p.ops.push_back(gemm(d, d.N, d.hl * d.Dq, d.Rq, false, true, false, false));
  } else {
    p.ops.push_back(gemm(d, d.N, d.hl * d.Dq, d.C, false, true, false, false));
  }
  p.ops.push_back(gemm(d, d.N, d.R + d.dr, d.C, false, true, false, false));
  p.ops.push_back(copy(d, d.N, d.R + d.dr));
  p.ops.push_back(rope_part(d, 1, false));
  if (d.mla_norms) p.ops.push_back(elementwise(d, "rmsnorm_forward", d.N, d.R, 4, 2 * d.a));
  p.ops.push_back(gemm(d, d.N, d.hl * (d.dn + d.dv), d.R, false, true, false, false));
  p.ops.push_back(copy(d, d.N, d.hl * d.dr));
  p.ops.push_back(rope_part(d, d.hl, false));
  p.ops.push_back(copy(d, d.N, d.Q));  // zeroed (about a copy's cost), then the parts copied in
  p.ops.push_back(copy(d, d.N, d.hl * (2 * d.Dq + d.dv)));
}

// MLA's backward from the attention's output gradient to dh1 (Mla::backward_input): the padded
// output gradient, the attention op (the caller's), then the parts out of dqkv, the rotary parts
// rotated back, the shared key's gradient summed over the heads, and the projections' input
// gradients.
void mla_backward_input_ops(const Dims& d, PassWork& p) {
  p.ops.push_back(gemm(d, d.N, d.R, d.hl * (d.dn + d.dv), false, false, false, false));
  if (d.mla_norms) p.ops.push_back(elementwise(d, "rmsnorm_backward_input", d.N, d.R, 8, 4 * d.a));
  p.ops.push_back(copy(d, d.N, d.R + d.dr));
  p.ops.push_back(gemm(d, d.N, d.C, d.R + d.dr, false, false, false, false));
  if (d.Rq > 0) {
    p.ops.push_back(gemm(d, d.N, d.Rq, d.hl * d.Dq, false, false, false, false));
    if (d.mla_norms) p.ops.push_back(elementwise(d, "rmsnorm_backward_input", d.N, d.Rq, 8, 4 * d.a));
    p.ops.push_back(gemm(d, d.N, d.C, d.Rq, false, false, false, true));
  } else {
    p.ops.push_back(gemm(d, d.N, d.C, d.hl * d.Dq, false, false, false, true));
  }
}
void mla_unpack_ops(const Dims& d, PassWork& p) {  // between the attention op and the projections
  p.ops.push_back(copy(d, d.N, d.hl * (d.Dq + d.dr)));
  p.ops.push_back(rope_part(d, d.hl, true));
  p.ops.push_back(copy(d, d.N, d.hl * (d.dn + d.dv + d.dr)));
  for (int64_t h = 1; h < d.hl; ++h) p.ops.push_back(elementwise(d, "add", d.N, d.dr, 1, 3 * d.a));
  p.ops.push_back(rope_part(d, 1, true));
}

void mla_backward_weight_ops(const Dims& d, PassWork& p) {
  if (d.Rq > 0) {
    p.ops.push_back(gemm(d, d.hl * d.Dq, d.Rq, d.N, true, false, true, true));
    if (d.mla_norms) p.ops.push_back(elementwise(d, "rmsnorm_backward_weight", d.N, d.Rq, 3, 2 * d.a));
    p.ops.push_back(gemm(d, d.Rq, d.C, d.N, true, false, true, true));
  } else {
    p.ops.push_back(gemm(d, d.hl * d.Dq, d.C, d.N, true, false, true, true));
  }
  p.ops.push_back(gemm(d, d.hl * (d.dn + d.dv), d.R, d.N, true, false, true, true));
  if (d.mla_norms) p.ops.push_back(elementwise(d, "rmsnorm_backward_weight", d.N, d.R, 3, 2 * d.a));
  p.ops.push_back(gemm(d, d.R + d.dr, d.C, d.N, true, false, true, true));
}

// The forward of a block, as block_rebuild runs it from an empty context (an MoE block stops
// before the MLP: moe_forward runs it).
void block_forward_ops(const Dims& d, PassWork& p, bool qkv_bias, bool moe) {
  const double ab = double(d.N) * double(d.C) * d.a;  // a gathered / reduced [N, C] activation
  p.ops.push_back(elementwise(d, "rmsnorm_forward", d.Nl, d.C, 4, 2 * d.a));
  if (d.sp) p.comms.push_back({"all_gather", ab});
  if (d.mla) {
    mla_forward_ops(d, p);
  } else {
    OpSpec qkv = gemm(d, d.N, d.Q, d.C, false, true, false, false);
    if (qkv_bias) qkv.bytes += double(d.Q) * d.a;
    p.ops.push_back(qkv);
    if (d.qk_norm) qk_norm_ops(d, p, "rmsnorm_forward", 4, 2);
    p.ops.push_back(rope(d, false));
  }
  attention_ops(d, p, false);
  if (d.mla) p.ops.push_back(copy(d, d.N, d.P));  // the values out of the padded heads
  p.ops.push_back(gemm(d, d.N, d.C, d.P, false, true, false, !d.tp));
  if (d.tp) {
    p.comms.push_back({d.sp ? "reduce_scatter" : "all_reduce", ab});
    p.ops.push_back(elementwise(d, "add", d.Nl, d.C, 1, 3 * d.a));
  }
  p.ops.push_back(elementwise(d, "rmsnorm_forward", d.Nl, d.C, 4, 2 * d.a));
  if (moe) return;
  if (d.sp) p.comms.push_back({"all_gather", ab});
  p.ops.push_back(gemm(d, d.N, 2 * d.Fl, d.C, false, true, false, false));
  p.ops.push_back(elementwise(d, "swiglu_forward", d.N, d.Fl, 5, 3 * d.a));
}

// The MoE block of one rank (model/moe.cpp): Nm tokens, M = Nm topk kept rows (dropless,
// balanced), El local experts of M / El rows each on the expert side (ep ranks send each other
// their rows). Whole experts (etp 1) run on the rank's rows (its sequence-parallel share under
// tp); split ones (etp = tp) on all N rows, gathered under sequence parallelism, with F / tp of
// each expert's ffn, and the router's input and weight gradients over the rank's Nl rows.
struct MoeDims {
  int64_t Nm, Nl, M, E, El, Me, F, Fs, k;
  int ep, etp;
  bool allgather, gate;
};

MoeDims moe_dims(const ModelSpec& m, const Dims& d, const WorkloadShape& w) {
  MoeDims e;
  e.etp = d.tp ? std::max(w.etp, 1) : 1;
  e.Nm = e.etp > 1 ? d.N : d.Nl;
  e.Nl = d.Nl;
  e.k = m.moe_router_topk;
  e.M = e.Nm * e.k;
  e.E = m.num_experts;
  e.ep = std::max(w.ep, 1);
  e.El = e.E / e.ep;
  e.Me = std::max<int64_t>(1, e.M / std::max<int64_t>(e.El, 1));
  e.F = m.expert_ffn() / e.etp;
  e.Fs = m.moe_shared_expert_intermediate_size / e.etp;
  e.allgather = w.ep_allgather;
  e.gate = m.moe_shared_expert_gate;
  return e;
}

OpSpec row_op(const Dims& d, const char* op, int64_t rows, int64_t cols, int64_t source_rows) {
  OpSpec o = elementwise(d, op, rows, cols, 1, 3 * d.a);
  o.c = source_rows;
  return o;
}

// Rows to their experts' ranks (dispatch) or back (combine), over the expert-parallel group.
void moe_exchange(const Dims& d, const MoeDims& e, PassWork& p, bool dispatch) {
  if (e.ep == 1) return;
  const double rows = double(e.M) * double(d.C) * d.a;
  if (e.allgather)  // every rank's rows gathered; back by a reduce-scatter of outputs at the rows' places
    p.comms.push_back({dispatch ? "all_gather" : "reduce_scatter", rows * e.ep, false, false, 0, 0});
  else
    p.comms.push_back({"all_to_all", rows, false, false, 0, 0});
  p.comms.back().ep = true;
}

// Split experts: the rows gathered (sequence parallelism) before, the partial outputs summed over
// tp after (or the input gradient's, backward).
void moe_split_gather(const Dims& d, const MoeDims& e, PassWork& p) {
  if (e.etp > 1 && d.sp) p.comms.push_back({"all_gather", double(d.N) * double(d.C) * d.a});
}
void moe_split_reduce(const Dims& d, const MoeDims& e, PassWork& p, bool add_residual) {
  if (e.etp == 1) return;
  p.comms.push_back({d.sp ? "reduce_scatter" : "all_reduce", double(d.N) * double(d.C) * d.a});
  if (add_residual) p.ops.push_back(elementwise(d, "add", d.Nl, d.C, 1, 3 * d.a));
}

void moe_forward_ops(const Dims& d, const MoeDims& e, PassWork& p) {
  moe_split_gather(d, e, p);
  p.ops.push_back(gemm(d, e.Nm, e.E, d.C, false, true, true, false));  // router logits (stat dtype)
  p.ops.push_back(elementwise(d, "copy", e.Nm, d.C, 0, 2 * d.a));       // out = residual (or zeros)
  p.ops.push_back(row_op(d, "gather_rows", e.M, d.C, e.Nm));
  moe_exchange(d, e, p, true);
  for (int64_t x = 0; x < e.El; ++x) p.ops.push_back(gemm(d, e.Me, 2 * e.F, d.C, false, true, false, false));
  p.ops.push_back(elementwise(d, "swiglu_forward", e.M, e.F, 5, 3 * d.a));
  for (int64_t x = 0; x < e.El; ++x) p.ops.push_back(gemm(d, e.Me, d.C, e.F, false, true, false, false));
  moe_exchange(d, e, p, false);
  p.ops.push_back(row_op(d, "scatter_add_rows", e.M, d.C, e.Nm));
  if (e.Fs > 0) {
    p.ops.push_back(gemm(d, e.Nm, 2 * e.Fs, d.C, false, true, false, false));
    p.ops.push_back(elementwise(d, "swiglu_forward", e.Nm, e.Fs, 5, 3 * d.a));
    p.ops.push_back(gemm(d, e.Nm, d.C, e.Fs, false, true, false, !e.gate));
    if (e.gate) {
      p.ops.push_back(row_op(d, "row_dots", e.Nm, d.C, 1));
      p.ops.push_back(row_op(d, "scatter_add_rows", e.Nm, d.C, e.Nm));
    }
  }
  moe_split_reduce(d, e, p, true);
}

void moe_backward_input_ops(const Dims& d, const MoeDims& e, PassWork& p) {
  moe_split_gather(d, e, p);
  p.ops.push_back(row_op(d, "row_dots", e.M, d.C, e.Nm));  // the routing weights' gradient
  if (e.gate) p.ops.push_back(row_op(d, "row_dots", e.Nm, d.C, e.Nm));  // the shared gate's
  if (e.etp > 1) p.comms.push_back({"all_reduce", double(e.M + (e.gate ? e.Nm : 0)) * 8});  // both, over tp
  p.ops.push_back(row_op(d, "gather_rows", e.M, d.C, e.Nm));  // weighted dy rows
  moe_exchange(d, e, p, true);
  for (int64_t x = 0; x < e.El; ++x) p.ops.push_back(gemm(d, e.Me, e.F, d.C, false, false, false, false));
  p.ops.push_back(elementwise(d, "swiglu_backward", e.M, e.F, 10, 5 * d.a));
  for (int64_t x = 0; x < e.El; ++x) p.ops.push_back(gemm(d, e.Me, d.C, 2 * e.F, false, false, false, false));
  moe_exchange(d, e, p, false);
  p.ops.push_back(row_op(d, "scatter_add_rows", e.M, d.C, e.Nm));
  if (e.Fs > 0) {
    if (e.gate) p.ops.push_back(row_op(d, "gather_rows", e.Nm, d.C, e.Nm));
    p.ops.push_back(gemm(d, e.Nm, e.Fs, d.C, false, false, false, false));
    p.ops.push_back(elementwise(d, "swiglu_backward", e.Nm, e.Fs, 10, 5 * d.a));
    p.ops.push_back(gemm(d, e.Nm, d.C, 2 * e.Fs, false, false, false, true));
  }
  moe_split_reduce(d, e, p, false);
  p.ops.push_back(gemm(d, e.Nl, d.C, e.E, false, false, false, true));  // the router's input gradient
  if (e.gate) p.ops.push_back(gemm(d, e.Nl, d.C, 1, false, false, false, true));
}

void moe_backward_weight_ops(const Dims& d, const MoeDims& e, PassWork& p) {
  for (int64_t x = 0; x < e.El; ++x) {
    p.ops.push_back(gemm(d, d.C, e.F, e.Me, true, false, true, true));
    p.ops.push_back(gemm(d, 2 * e.F, d.C, e.Me, true, false, true, true));
  }
  p.ops.push_back(gemm(d, e.E, d.C, e.Nl, true, false, true, true));
  if (e.Fs > 0) {
    p.ops.push_back(gemm(d, d.C, e.Fs, e.Nm, true, false, true, true));
    p.ops.push_back(gemm(d, 2 * e.Fs, d.C, e.Nm, true, false, true, true));
    if (e.gate) p.ops.push_back(gemm(d, 1, d.C, e.Nl, true, false, true, true));
  }
}

void block_row_parallel_fc2(const Dims& d, PassWork& p) {
  const double ab = double(d.N) * double(d.C) * d.a;
  p.ops.push_back(gemm(d, d.N, d.C, d.Fl, false, true, false, !d.tp));
  if (d.tp) {
    p.comms.push_back({d.sp ? "reduce_scatter" : "all_reduce", ab});
    p.ops.push_back(elementwise(d, "add", d.Nl, d.C, 1, 3 * d.a));
  }
}

}  // namespace

std::string OpSpec::key() const {
  return fmt::format("{}:{}x{}x{}x{}x{}:{}{}{}{}{}{}:{}", op, a, b, c, d, e, trans_a, trans_b, out_stat, accumulate,
                     inverse, causal, dtype_name(dtype));
}

double PassWork::flops() const {
  double f = 0;
  for (const auto& o : ops) f += o.flops;
  return f;
}

PartWork layer_work(const ModelSpec& m, const WorkloadShape& w, bool moe) {
  const Dims d = dims_of(m, w);
  PartWork p;
  p.name = "layer";
  const MoeDims e = moe_dims(m, d, w);
  // F: the whole block.
  block_forward_ops(d, p.f, m.add_qkv_bias, moe);
  if (moe)
    moe_forward_ops(d, e, p.f);
  else
    block_row_parallel_fc2(d, p.f);
  // B: what recompute dropped, rebuilt, then the input gradients.
  if (w.recompute == Recompute::Full) {
    block_forward_ops(d, p.b, m.add_qkv_bias, moe);
  } else if (w.recompute == Recompute::Selective) {
    const double ab = double(d.N) * double(d.C) * d.a;
    p.b.ops.push_back(elementwise(d, "rmsnorm_forward", d.Nl, d.C, 4, 2 * d.a));
    if (d.sp) p.b.comms.push_back({"all_gather", ab});
    attention_ops(d, p.b, false);
    if (d.mla) p.b.ops.push_back(copy(d, d.N, d.P));
    p.b.ops.push_back(elementwise(d, "rmsnorm_forward", d.Nl, d.C, 4, 2 * d.a));
    if (!moe) {
      if (d.sp) p.b.comms.push_back({"all_gather", ab});
      p.b.ops.push_back(elementwise(d, "swiglu_forward", d.N, d.Fl, 5, 3 * d.a));
    }
  }
  const double ab = double(d.N) * double(d.C) * d.a;
  if (d.sp) p.b.comms.push_back({"all_gather", ab});
  if (moe) {
    moe_backward_input_ops(d, e, p.b);
  } else {
    p.b.ops.push_back(gemm(d, d.N, d.Fl, d.C, false, false, false, false));
    p.b.ops.push_back(elementwise(d, "swiglu_backward", d.N, d.Fl, 10, 5 * d.a));
    p.b.ops.push_back(gemm(d, d.N, d.C, 2 * d.Fl, false, false, false, false));
    if (d.tp) p.b.comms.push_back({d.sp ? "reduce_scatter" : "all_reduce", ab});
  }
  p.b.ops.push_back(elementwise(d, "rmsnorm_backward_input", d.Nl, d.C, 8, 4 * d.a));
  if (d.sp) p.b.comms.push_back({"all_gather", ab});
  p.b.ops.push_back(gemm(d, d.N, d.P, d.C, false, false, false, false));
  if (d.mla) {  // the output gradient into the padded heads
    p.b.ops.push_back(copy(d, d.N, d.QS));  // zeroed
    p.b.ops.push_back(copy(d, d.N, d.P));
  }
  attention_ops(d, p.b, true);
  if (d.mla) {
    mla_unpack_ops(d, p.b);
    mla_backward_input_ops(d, p.b);
  } else {
    p.b.ops.push_back(rope(d, true));
    if (d.qk_norm) qk_norm_ops(d, p.b, "rmsnorm_backward_input", 8, 4);
    p.b.ops.push_back(gemm(d, d.N, d.C, d.Q, false, false, false, false));
  }
  if (d.tp) p.b.comms.push_back({d.sp ? "reduce_scatter" : "all_reduce", ab});
  p.b.ops.push_back(elementwise(d, "rmsnorm_backward_input", d.Nl, d.C, 8, 4 * d.a));
  // W: dW += dy^T x, fp32 gradients.
  if (moe) {
    moe_backward_weight_ops(d, e, p.w);
  } else {
    p.w.ops.push_back(gemm(d, d.C, d.Fl, d.N, true, false, true, true));
    p.w.ops.push_back(gemm(d, 2 * d.Fl, d.C, d.N, true, false, true, true));
  }
  p.w.ops.push_back(elementwise(d, "rmsnorm_backward_weight", d.Nl, d.C, 3, 2 * d.a));
  p.w.ops.push_back(gemm(d, d.C, d.P, d.N, true, false, true, true));
  if (d.mla)
    mla_backward_weight_ops(d, p.w);
  else
    p.w.ops.push_back(gemm(d, d.Q, d.C, d.N, true, false, true, true));
  if (d.qk_norm)
    for (const int64_t heads : {d.hl, d.gl})
      p.w.ops.push_back(elementwise(d, "rmsnorm_backward_weight", d.N * heads, d.D, 3, 2 * d.a));
  if (m.add_qkv_bias) p.w.ops.push_back(elementwise(d, "column_sum_accumulate", d.N, d.Q, 1, d.a));
  p.w.ops.push_back(elementwise(d, "rmsnorm_backward_weight", d.Nl, d.C, 3, 2 * d.a));

  // Memory. The block holds its input x (the previous part's output) from its F to its W.
  const double x = bytes(d.Nl, d.C, d.a), full_nc = bytes(d.N, d.C, d.a);
  const double h1 = full_nc, rstd = bytes(d.Nl, 1, d.st), qkv = bytes(d.N, d.Q, d.a), attn = bytes(d.N, d.P, d.a);
  // MLA's own saves (MlaContext): the q and kv latents (and their norms' outputs and rstd), the
  // padded attention output; for W its B's gradients: dq, the q latent's, dkv and the kv
  // latent's with the rotary key.
  // QK-norm's saves (QkNormContext): the rows before the norm and their rstd; for W its B's
  // gradients of the normalized rows.
  const double qk_saved = d.qk_norm ? bytes(d.N, (d.hl + d.gl) * d.D, d.a) + bytes(d.N, d.hl + d.gl, d.st) : 0;
  const double qk_b_kept = d.qk_norm ? bytes(d.N, (d.hl + d.gl) * d.D, d.a) : 0;
  const double n_q = d.mla_norms ? 2 : 1;
  const double mla_saved = !d.mla ? 0
                                   : bytes(d.N, d.Rq, d.a) * (d.Rq > 0 ? n_q : 0) + bytes(d.N, d.R, d.a) * n_q +
                                         (d.mla_norms ? bytes(d.N, (d.Rq > 0 ? 1 : 0) + 1, d.st) : 0) +
                                         bytes(d.N, d.QS, d.a);
  const double mla_b_kept = !d.mla ? 0
                                   : bytes(d.N, d.hl * d.Dq, d.a) + bytes(d.N, d.Rq, d.a) * (d.Rq > 0 ? n_q : 0) +
                                         bytes(d.N, d.hl * (d.dn + d.dv), d.a) +
                                         bytes(d.N, d.R, d.a) * (d.mla_norms ? 1 : 0) + bytes(d.N, d.R + d.dr, d.a);
  const double lse = bytes(d.N, d.hl, d.st), x2 = x, h2 = full_nc;
  const double gate_up = moe ? 0 : bytes(d.N, 2 * d.Fl, d.a), act = moe ? 0 : bytes(d.N, d.Fl, d.a);
  // The MoE block's context (MoeContext): the expert side's xp, gate_up, act, yp, the token side's
  // combined yp under ep, the shared expert's gate_up, act (and output when gated).
  const double nm_c = bytes(e.Nm, d.C, d.a), m_c = bytes(e.M, d.C, d.a);
  const double shared = e.Fs > 0 ? bytes(e.Nm, 3 * e.Fs, d.a) + (e.gate ? nm_c : 0) : 0;
  const double gathered = e.etp > 1 && d.sp ? nm_c : 0;  // split experts' all rows of the input
  const double moe_ctx = moe ? m_c + bytes(e.M, 3 * e.F, d.a) + m_c + (e.ep > 1 ? m_c : 0) + shared + gathered : 0;
  // Its B: the rows' output gradient (kept), da, dgate_up (kept), dxp, the router logits'
  // gradient (kept), and the shared expert's dact and dgate_up (kept); under ep the token side's
  // copies of the exchanged rows as well.
  const double moe_b_kept = moe ? m_c + bytes(e.M, 2 * e.F, d.a) + bytes(e.Nl, e.E, d.a) +
                                      (e.Fs > 0 ? bytes(e.Nm, 2 * e.Fs, d.a) + (e.gate ? nm_c : 0) : 0)
                                : 0;
  const double moe_b_tmp = moe ? bytes(e.M, e.F, d.a) + m_c + (e.Fs > 0 ? bytes(e.Nm, e.Fs, d.a) : 0) +
                                     (e.ep > 1 ? 2 * m_c : 0)
                               : 0;
  // a2a keeps the whole sequence's qkv and output of the rank's heads (as many bytes as its own);
  // the ring holds the travelling key/value blocks and the fp32 running outputs while it runs.
  const double cp_saved = d.cp > 1 && d.a2a ? qkv + attn : 0;
  const int64_t KV = 2 * d.gl * d.D;
  const double ring_f = d.cp > 1 && !d.a2a ? 2 * bytes(d.N, KV, d.a) + bytes(d.N, d.QS, d.st) : 0;
  const double ring_b = d.cp > 1 && !d.a2a ? 2 * bytes(d.N, KV, d.a) + bytes(d.N, d.QS, d.st) + 2 * bytes(d.N, KV, d.st) : 0;
  const double context =
      x + h1 + rstd + qkv + attn + lse + x2 + h2 + rstd + gate_up + act + moe_ctx + cp_saved + mla_saved + qk_saved;
  // Recompute rebuilds the block up to the MLP; the MoE block's context is kept (block_rebuild
  // does not run it again).
  p.kept_after_f = w.recompute == Recompute::None        ? context
                   : w.recompute == Recompute::Selective ? x + qkv + x2 + gate_up + moe_ctx + mla_saved + qk_saved
                                                         : x + moe_ctx;
  // At the end of F everything exists at once (recompute drops it afterwards), with the output
  // and, under tp, fc2's partial sum.
  p.peak_in_f = context + x + (d.tp && !moe ? full_nc : 0) + ring_f;
  // B: the incoming dy (held as c.dy; gathered anew under sp), da, dgate_up, the reduced dh2
  // (partial and reduced under sp), dx2 (and its gathered copy under sp), dattn, dqkv, dh1, dx.
  const double dy_in = x, dy_g = d.sp ? full_nc : 0;
  const double da = act, dgu = gate_up, dh2 = full_nc + (d.sp ? x : 0), dx2 = x + (d.sp ? full_nc : 0);
  const double dattn = attn, dqkv = qkv, dh1 = full_nc + (d.sp ? x : 0), dx = x;
  p.peak_in_b = context + dy_in + dy_g + da + dgu + moe_b_kept + moe_b_tmp + dh2 + dx2 + dattn + dqkv + dh1 + dx + ring_b +
                (d.mla ? mla_b_kept + bytes(d.N, d.QS, d.a) : 0) + 2 * qk_b_kept;  // MLA: its gradients and the padded dout
  // Kept for W: the context less qkv, lse, gate_up (and a2a's saves), and dy, dqkv, dh1, dx2,
  // dgate_up (or the MoE block's gradients), dh2 as the context holds them (reduced and gathered
  // where those differ).
  const double kept_dh = d.sp ? x : full_nc, kept_dx2 = d.sp ? full_nc : x;
  // (MLA: its B frees the padded output and keeps its gradients, mla_b_kept, in place of dqkv.)
  p.kept_after_b = context - qkv - lse - gate_up - cp_saved + dy_in + dy_g + (d.mla ? mla_b_kept - bytes(d.N, d.QS, d.a) : dqkv) +
                   kept_dh + kept_dx2 + dgu + moe_b_kept + kept_dh + qk_b_kept;
  return p;
}

PartWork embedding_work(const ModelSpec& m, const WorkloadShape& w) {
  const Dims d = dims_of(m, w);
  PartWork p;
  p.name = "embedding";
  OpSpec e = elementwise(d, "embedding_forward", d.N, d.C, 0, 2 * d.a);
  e.c = d.Vl;
  p.f.ops.push_back(e);
  const double ab = double(d.N) * double(d.C) * d.a;
  if (d.tp) p.f.comms.push_back({d.sp ? "reduce_scatter" : "all_reduce", ab});
  if (d.sp) p.w.comms.push_back({"all_gather", ab});
  OpSpec eb = elementwise(d, "embedding_backward", d.N, d.C, 1, d.a + 8);
  eb.c = d.Vl;
  p.w.ops.push_back(eb);
  const double tokens = 2.0 * double(d.N) * 4;  // the shard's token ids and the targets, int32 on the device
  p.kept_after_f = tokens;                      // its output is layer 0's input
  p.peak_in_f = tokens + ab + (d.sp ? bytes(d.Nl, d.C, d.a) : 0);
  p.kept_after_b = tokens + bytes(d.Nl, d.C, d.a);  // the gradient reaching it, until its W
  p.peak_in_b = p.kept_after_b;
  return p;
}

PartWork head_work(const ModelSpec& m, const WorkloadShape& w) {
  const Dims d = dims_of(m, w);
  PartWork p;
  p.name = "head";
  const bool keeps = head_keeps_logits(w.options, w.precision, d.N, d.Vl);
  const int64_t vc = keeps ? d.Vl : std::min<int64_t>(w.options.vocab_chunk, d.Vl);
  const int64_t chunks = keeps ? 1 : (d.Vl + vc - 1) / vc;
  const double ab = double(d.N) * double(d.C) * d.a;
  // F
  p.f.ops.push_back(elementwise(d, "rmsnorm_forward", d.Nl, d.C, 4, 2 * d.a));
  if (d.sp) p.f.comms.push_back({"all_gather", ab});
  p.f.ops.push_back(elementwise(d, "ce_init", d.N, 1, 0, 3 * d.st));
  for (int64_t c = 0; c < chunks; ++c) {
    p.f.ops.push_back(gemm(d, d.N, vc, d.C, false, true, true, false));
    p.f.ops.push_back(elementwise(d, "ce_chunk_forward", d.N, vc, 5, d.st));
  }
  if (d.tp)
    for (int i = 0; i < 3; ++i) p.f.comms.push_back({"all_reduce", double(d.N) * d.st});
  p.f.ops.push_back(elementwise(d, "ce_finish", d.N, 1, 3, 5 * d.st));
  if (keeps) p.f.ops.push_back(elementwise(d, "ce_chunk_backward", d.N, d.Vl, 3, d.st + d.a));
  // B
  for (int64_t c = 0; c < chunks; ++c) {
    if (!keeps) {
      p.b.ops.push_back(gemm(d, d.N, vc, d.C, false, true, true, false));
      p.b.ops.push_back(elementwise(d, "ce_chunk_backward", d.N, vc, 3, d.st + d.a));
    }
    OpSpec g = gemm(d, d.N, d.C, vc, false, false, true, true);
    p.b.ops.push_back(g);
  }
  if (d.tp) p.b.comms.push_back({d.sp ? "reduce_scatter" : "all_reduce", double(d.N) * double(d.C) * d.st});
  if (d.act != ops::stat_dtype(d.act)) p.b.ops.push_back(elementwise(d, "cast", d.Nl, d.C, 0, d.st + d.a));
  p.b.ops.push_back(elementwise(d, "rmsnorm_backward_input", d.Nl, d.C, 8, 3 * d.a));
  // W
  p.w.ops.push_back(elementwise(d, "rmsnorm_backward_weight", d.Nl, d.C, 3, 2 * d.a));
  for (int64_t c = 0; c < chunks; ++c) {
    if (!keeps) {
      p.w.ops.push_back(gemm(d, d.N, vc, d.C, false, true, true, false));
      p.w.ops.push_back(elementwise(d, "ce_chunk_backward", d.N, vc, 3, d.st + d.a));
    }
    p.w.ops.push_back(gemm(d, vc, d.C, d.N, true, false, true, true));
  }
  // Memory: its input x, hn (gathered), rstd, lse and the logits' gradient when it keeps it.
  const double x = bytes(d.Nl, d.C, d.a), hn = ab, rstd = bytes(d.Nl, 1, d.st), lse = bytes(d.N, 1, d.st);
  const bool bf16 = d.act != ops::stat_dtype(d.act);
  const double dlogits = keeps ? bytes(d.N, d.Vl, bf16 ? d.a : d.st) : 0;
  const double logits = bytes(d.N, vc, d.st);
  p.kept_after_f = x + hn + rstd + lse + dlogits + double(d.N) * 4;  // and the targets
  p.peak_in_f = x + hn + (d.sp ? x : 0) + rstd + 3 * lse + logits + (bf16 || !keeps ? bytes(d.N, vc, d.a) : 0) +
                double(d.N) * 4;
  const double dhn = bytes(d.N, d.C, d.st);
  const double chunk_tmp = keeps ? 0 : logits + (bf16 ? bytes(d.N, vc, d.a) : 0);
  const double dhn_kept = bf16 ? bytes(d.sp ? d.Nl : d.N, d.C, d.a) : (d.sp ? bytes(d.Nl, d.C, d.st) : dhn);
  p.peak_in_b = p.kept_after_f + dhn + chunk_tmp + (d.sp || bf16 ? dhn_kept : 0) + x;
  p.kept_after_b = p.kept_after_f + dhn_kept;
  return p;
}

int64_t layer_parameters(const ModelSpec& m, int tp, bool moe, int ep, int etp) {
  const int64_t C = m.hidden_size;
  int64_t n = 2 * C;                          // the two norms, whole on every rank
  if (m.multi_latent_attention) {             // model/mla.h: the up projections split by heads
    const int64_t H = m.num_attention_heads / tp, qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    const int64_t Rq = m.q_lora_rank, R = m.kv_lora_rank;
    n += Rq > 0 ? Rq * C + H * qk * Rq + (m.qk_layernorm ? Rq : 0) : H * qk * C;
    n += (R + m.qk_pos_emb_head_dim) * C + H * (m.qk_head_dim + m.v_head_dim) * R + (m.qk_layernorm ? R : 0);
  } else {
    n += m.qkv_size() * C / tp;               // linear_qkv
    if (m.add_qkv_bias) n += m.qkv_size() / tp;
    if (m.qk_layernorm) n += 2 * m.head_dim();  // q_layernorm, k_layernorm: whole on every rank
  }
  n += C * m.attention_out_size() / tp;       // linear_proj
  if (!moe) return n + 3 * m.ffn_hidden_size * C / tp;  // linear_fc1 (gate and up), linear_fc2
  // The MoE block: router (and expert bias) and the shared gate on every rank, experts over ep,
  // the routed and shared experts' ffn over etp.
  etp = tp > 1 ? std::max(etp, 1) : 1;
  n += m.num_experts * C + (m.moe_router_enable_expert_bias ? m.num_experts : 0);
  n += m.num_experts / ep * 3 * (m.expert_ffn() / etp) * C;
  if (m.moe_shared_expert_intermediate_size > 0)
    n += 3 * (m.moe_shared_expert_intermediate_size / etp) * C + (m.moe_shared_expert_gate ? C : 0);
  return n;
}

int64_t layer_tensors(const ModelSpec& m, bool moe, int ep) {
  int64_t t = (m.add_qkv_bias ? 5 : 4) + (m.qk_layernorm ? 2 : 0);  // norms, qkv (and bias), proj, QK norms
  if (m.multi_latent_attention)  // norms, proj, q (one or down and up), kv down and up, the latent norms
    t = 3 + (m.q_lora_rank > 0 ? 2 : 1) + 2 + (m.qk_layernorm ? (m.q_lora_rank > 0 ? 2 : 1) : 0);
  if (!moe) return t + 2;
  t += 1 + (m.moe_router_enable_expert_bias ? 1 : 0) + 2 * (m.num_experts / ep);
  if (m.moe_shared_expert_intermediate_size > 0) t += 2 + (m.moe_shared_expert_gate ? 1 : 0);
  return t;
}

int64_t embedding_parameters(const ModelSpec& m, int tp) { return m.vocab_size / tp * m.hidden_size; }

int64_t head_parameters(const ModelSpec& m, int tp) {
  return m.hidden_size + (m.untie_embeddings_and_output_weights ? m.vocab_size / tp * m.hidden_size : 0);
}

}  // namespace primus::projection
