// One call of an op of the op set (backend.h) described by its shapes: the op, its dtypes, its
// dimensions, its FLOPs and the bytes it moves. The shape-only backend (kernels/meta) records
// every call as one; the projection times them (projection/op_timing.h); the profiler's decorator
// (trace/traced_backend.h) takes their FLOPs and bytes for its events. The cost rules live here
// once: GEMM 2 M N K FLOPs and the bytes of A, B, D (and C when it is another tensor, and the
// bias), as TraceLens counts them; causal attention 2 b h s^2 d forward and twice that backward
// (a context-parallel block that is not on the diagonal, twice that again), as model_stats counts;
// elementwise ops a few FLOPs per element and the bytes of every operand.
//
// Dimensions, by op:
//   gemm                      a M, b N, c K (D [M, N] = op(A) op(B))
//   grouped_gemm              problems: each one's {M, N, K}; a the number of problems
//   attention_*               a batch, b seq, c heads, d groups, e head_dim (causal: a diagonal block),
//                             window the sliding window (-1: none; its FLOPs count the keys it sees)
//   rope_apply                a rows, b row width, c heads rotated, d head_dim, e positions per sequence
//   embedding_*               a rows, b columns, c rows of the table
//   gather_rows, scatter_add_rows, row_dots   a rows listed, b columns, c rows of the other side
//   copy                      a rows, b bytes per row, c and d the destination's and source's pitch
//   zero                      a bytes
//   every other op            a rows, b columns (1 for row statistics)
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/attention.h"
#include "kernels/fp8.h"

namespace primus::ops {

struct OpCall {
  const char* op = "";       // the backend op: "gemm", "rmsnorm_forward", ... (a literal)
  DType dtype = DType::F32;  // what it reads: the activation dtype, or a GEMM's A
  DType out = DType::F32;    // what it writes: a GEMM's D, a cast's destination (else dtype)
  int64_t a = 0, b = 0, c = 0, d = 0, e = 0;
  int64_t window = -1;  // attention's sliding window
  bool trans_a = false, trans_b = false;
  bool accumulate = false;  // gemm: C is read (beta != 0); rmsnorm_backward_input: a residual
  bool bias = false, inverse = false, causal = false;
  std::vector<std::array<int64_t, 3>> problems;  // grouped_gemm
  // An FP8 GEMM (gemm_fp8, grouped_gemm_fp8): its operands' kinds, A's and B's (grouped: the first
  // problem's formats, each operand's coarsest scaling over the problems); none otherwise.
  struct Fp8Operands {
    fp8::OperandKind a, b;
    // The scaling a device's matrix units must take for it (the projection's FP8 peak).
    fp8::Granularity coarsest() const { return fp8::coarsest(a.granularity, b.granularity); }
  };
  std::optional<Fp8Operands> fp8;
  double flops = 0, bytes = 0;
  // The weight (or weight gradient) the op reads (writes): a GEMM's B, or its D when A is
  // transposed (dW += dy^T x); a norm's weight or gradient; the embedding table. Identifies the
  // parameter, never dereferenced; null when none.
  const void* weight = nullptr;
  // The same calls share one key (the projection times each key once).
  std::string key() const;
};

// The calls of the ops of backend.h, from the operands they are given.
OpCall gemm_call(bool trans_a, bool trans_b, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
                 const Tensor& D, const Tensor& bias);
OpCall grouped_gemm_call(bool trans_a, bool trans_b, const std::vector<Tensor>& A, const std::vector<Tensor>& B,
                         float beta, const std::vector<Tensor>& D);
OpCall rmsnorm_forward_call(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd);
OpCall rmsnorm_backward_input_call(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                   const Tensor& residual, const Tensor& dx);
OpCall rmsnorm_backward_weight_call(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& dw);
OpCall swiglu_forward_call(const Tensor& gate_up, const Tensor& act);
OpCall swiglu_backward_call(const Tensor& dact, const Tensor& gate_up, const Tensor& dgate_up);
OpCall rope_call(const Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, bool inverse);
OpCall attention_forward_call(const Tensor& qkv, const Tensor& out, const Tensor& lse, const cpu::AttentionShape& s);
OpCall attention_backward_call(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                               const Tensor& dqkv, const cpu::AttentionShape& s);
OpCall attention_sink_backward_call(const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dsinks,
                                    const cpu::AttentionShape& s);
OpCall attention_decode_call(const Tensor& cache, int64_t first, const Tensor& out, const cpu::AttentionShape& s);
OpCall attention_block_forward_call(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                    const cpu::AttentionShape& s, bool causal);
OpCall attention_merge_call(const Tensor& acc, const Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                            const cpu::AttentionShape& s);
OpCall attention_block_backward_call(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                     const Tensor& dout, const Tensor& dq_acc, const Tensor& dkv_acc,
                                     const cpu::AttentionShape& s, bool causal);
OpCall gather_rows_call(const Tensor& x, size_t rows, const Tensor& out);
OpCall scatter_add_rows_call(const Tensor& y, const Tensor& out);
OpCall row_dots_call(const Tensor& a, const Tensor& b);
OpCall embedding_forward_call(const Tensor& tokens, const Tensor& table, const Tensor& out);
OpCall embedding_backward_call(const Tensor& dout, const Tensor& dtable);
OpCall column_sum_accumulate_call(const Tensor& dy, const Tensor& out);
OpCall add_call(const Tensor& a, const Tensor& b, const Tensor& out);
OpCall dropout_call(const Tensor& x, const Tensor& y);
OpCall ce_init_call(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit);
OpCall ce_chunk_forward_call(const Tensor& logits, const Tensor& targets, const Tensor& row_max);
OpCall ce_merge_max_call(const Tensor& row_max, const Tensor& row_sum, const Tensor& global_max);
OpCall ce_finish_call(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit, const Tensor& targets,
                      const Tensor& lse);
OpCall ce_chunk_backward_call(const Tensor& logits, const Tensor& lse, const Tensor& targets, const Tensor& dlogits);
OpCall ce_forward_backward_call(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogits);
OpCall cast_call(const Tensor& src, const Tensor& dst);
OpCall quantize_fp8_call(const Tensor& src, const Tensor& dst);
// Device copies and zeroing (not ops of the op set, but device work all the same: the model's
// copies of row blocks, its zeroed buffers).
OpCall copy_call(size_t width, size_t rows, size_t dpitch, size_t spitch);
OpCall zero_call(size_t bytes);

}  // namespace primus::ops
