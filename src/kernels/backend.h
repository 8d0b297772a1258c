// The op set of training, one interface for every device and precision (docs/architecture.md: one model
// over the op set). The Llama model (model/llama.h) is written once against it, so the same model
// code runs on:
//   - cpu::CpuBackend (kernels/cpu/cpu_backend.h): fp32 (and fp64, for the finite-difference
//     tests) on OpenBLAS and this project's CPU kernels;
//   - cpu::ReferenceBackend (kernels/cpu/reference_backend.h): bf16 mixed precision on the CPU,
//     the fp32 kernels with each result rounded to bf16 once. It defines what every bf16 op must
//     compute and is the reference of the GPU tests;
//   - cuda::CudaBackend (kernels/cuda/cuda_backend.h): bf16 on cuBLASLt, flash attention and
//     fused kernels;
//   - ops::MetaBackend (kernels/meta/meta_backend.h): the shape-only backend, tensors without
//     values on Device::Meta; it records every call (kernels/op_call.h) instead of computing it.
//
// Types. A run computes in one activation dtype (bf16, fp32 or fp64), which fixes the others:
//   activations, the weights' working copy, dlogits      the activation dtype
//   statistics: norm rstd, log-sum-exps, logits,         fp32 (fp64 when activations are fp64):
//     cross-entropy rows, rope tables                    the "stat dtype" below
//   weight gradients (accumulated, +=)                   the master dtype: fp32 (fp64 for fp64)
// Every tensor lives on device() and is contiguous row-major; 2-D unless said otherwise. Token
// ids and targets are int32 tensors on device(); a negative target masks its token out of the
// loss, a negative token id embeds as a zero row (a token another vocabulary shard holds).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/fp8.h"

namespace primus::ops {

using Glu = cpu::Glu;

// The sizes of an attention call (kernels/cpu/attention.h: batch sequences of seq rows, heads,
// query groups, head_dim) and, when documents are packed into its sequences, where each query
// row's document starts (kernels/cpu/attention.h, Documents: attention stays inside each
// document, and the kernels skip the key tiles no query of a tile sees):
//   doc_start  int32 [batch * seq] on device(), the position at which each query row's document
//              begins, non-decreasing within a sequence; undefined: no documents
//   key_pos0   the position of the key rows' first row (ring attention's key blocks; 0 otherwise)
// Every attention op but decode honours it (model/documents.h builds it). Two more properties of
// gpt-oss's attention (kernels/cpu/attention.h says what they compute):
//   window     (cpu::AttentionShape) a sliding window of keys; attention_forward, _backward and
//              _decode honour it, the ring's block ops refuse it
//   sinks      stat dtype [heads] on device(): one learned logit per head in every row's softmax
//              denominator; undefined: none. attention_forward and _decode honour it; the backward
//              needs nothing more (lse holds it) but the sinks' own gradient,
//              attention_sink_backward. The ring's block ops refuse it.
struct AttentionShape : cpu::AttentionShape {
  Tensor doc_start{};
  int64_t key_pos0 = 0;
  Tensor sinks{};
};
// The kernels' view of s's documents, on `device` (null start: none). Checks doc_start's dtype,
// size and device; one place for every backend.
cpu::Documents documents_of(const AttentionShape& s, Device device);
// s.sinks checked (`stat` dtype, [heads], on `device`); null when s has none.
const void* sinks_of(const AttentionShape& s, Device device, DType stat);
// Fails unless s has neither a window nor sinks: `op` (the ring's block ops) supports neither.
void refuse_window_and_sinks(const AttentionShape& s, const char* op);

// fp32 statistics for bf16/fp32 activations, fp64 for fp64.
inline DType stat_dtype(DType activation) { return activation == DType::F64 ? DType::F64 : DType::F32; }

// Where Backend::quantize_fp8 leaves amax |src|. By default it returns it (Fp8Quantized::amax), for
// which a GPU backend waits for the device. With `acc` (fp32, on the backend's device) it folds it
// into acc[index] instead, as fp8::fold_amax folds (the larger; a NaN sticks), and returns 0 without
// waiting: delayed scaling's amaxes, read back once per step (model/linears.h). `needed` false: the
// caller does not use it (returned 0, no wait).
struct Fp8AmaxOut {
  Tensor acc{};
  int64_t index = 0;
  bool needed = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cpu-reference", "cuda (NVIDIA H100 80GB HBM3)"
  // Whether this backend computes with activations of `dtype`.
  virtual bool computes_in(DType activation) const = 0;

  Tensor empty(const Shape& shape, DType dtype) const { return Tensor::empty(shape, dtype, device()); }
  Tensor zeros(const Shape& shape, DType dtype) const { return Tensor::zeros(shape, dtype, device()); }

  // D = alpha * op(A) op(B) + beta * C (+ bias[n] on every row); op = transpose when trans_*.
  // A and B have the activation dtype (rows of a larger tensor are fine: slices along dim 0 stay
  // contiguous). C and D both have the activation dtype, or both the gradient dtype (a weight
  // gradient, a logits chunk). C may be D (accumulate) or another tensor (a residual); C is not
  // read when beta == 0 (pass an undefined tensor). bias has the activation dtype, [n], or is
  // undefined.
  virtual void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
                    const Tensor& C, Tensor& D, const Tensor& bias) = 0;

  // Grouped GEMM (mixture of experts: one product per expert, over that expert's rows). For
  // each i, D[i] = alpha[i] * op(A[i]) op(B[i]) + beta * D[i]: gemm() with C = D[i] (not read when
  // beta == 0) and no bias. The problems share the transposes, beta and the dtypes, not their
  // shapes or alphas (FP8's per-expert scales: model/linears.h); their D's must not overlap. The
  // default runs gemm() for each; a backend overrides it to run them as one operation
  // (kernels/grouped_gemm.cpp says which do). alpha holds one value per problem.
  virtual void grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                            const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D);
  // The same alpha for every problem.
  void grouped_gemm(bool trans_a, bool trans_b, float alpha, const std::vector<Tensor>& A,
                    const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
    grouped_gemm(trans_a, trans_b, std::vector<float>(A.size(), alpha), A, B, beta, D);
  }

  // RMSNorm over rows: y = x * rstd * w; rstd [n] in the stat dtype.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) = 0;
  // dx = residual + d(norm)/dx; residual is undefined (0), dx itself, or another tensor.
  virtual void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                      const Tensor& residual, Tensor& dx) = 0;
  virtual void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) = 0;

  // The gated linear unit on a fused [gate | up] row of 2f values (kernels/cpu/elementwise.h, Glu):
  // act = g sigmoid(alpha g) (u + offset) with the gate and up clamped by limit; SwiGLU (act =
  // silu(gate) * up) with the default Glu.
  virtual void glu_forward(const Tensor& gate_up, Tensor& act, const Glu& glu) = 0;
  virtual void glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const Glu& glu) = 0;
  void swiglu_forward(const Tensor& gate_up, Tensor& act) { glu_forward(gate_up, act, Glu{}); }
  void swiglu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up) {
    glu_backward(dact, gate_up, dgate_up, Glu{});
  }

  // In place on x [rows, stride]: the first `heads` heads of head_dim of each row; row r has
  // position pos0 + r % seq; cos/sin [positions, head_dim/2] in the stat dtype; inverse for the
  // backward.
  virtual void rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                          const Tensor& sin, bool inverse) = 0;

  // Causal attention on the fused qkv layout of kernels/cpu/attention.h, within each document
  // when s.doc_start is defined. lse [batch, heads, seq].
  virtual void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionShape& s) = 0;
  virtual void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  Tensor& dqkv, const AttentionShape& s) = 0;
  // The gradient of s.sinks (defined): dsinks (gradient dtype [heads]) += -sum over rows of
  // exp(sinks[h] - lse) * rowsum(dout * out), each head summed in a fixed order.
  virtual void attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                                       const AttentionShape& s) = 0;
  // Context parallelism (model/context_parallel.h): attention of a block of queries against a
  // block of keys and values that may come from another rank, the blocks merged by log-sum-exp
  // (the layouts are kernels/cpu/attention.h's). A pair has s.seq query and s.seq key rows per
  // sequence; causal masks keys after the query (the diagonal block), else every key is seen.
  //   qkv [batch*seq, qkv_stride] (its q columns), kv [batch*seq, 2*groups*head_dim] [k | v],
  //   out, dout [batch*seq, heads*head_dim]: the activation dtype
  //   lse, block_lse [batch, heads, seq]; acc, dq_acc, dkv_acc: the stat dtype
  // block_forward: this block's attention alone. merge: folds a block into the running acc, lse
  // (start: acc 0, lse -inf). block_backward: with the MERGED out and lse, adds the block's dq to
  // dq_acc [batch*seq, heads*head_dim] and its [dk | dv] to dkv_acc.
  virtual void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                       const AttentionShape& s, bool causal) = 0;
  virtual void attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                               const AttentionShape& s) = 0;
  virtual void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                        const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const AttentionShape& s,
                                        bool causal) = 0;
  // Decoding with a key/value cache: cache [length, qkv_stride] holds the (rotated) qkv rows of
  // positions 0 .. length-1 of one sequence (s.batch = 1, s.seq = length); out [length - first,
  // heads * head_dim] receives the causal attention of the queries of rows first .. length-1.
  virtual void attention_decode(const Tensor& cache, int64_t first, Tensor& out, const AttentionShape& s) = 0;

  // out[i] = table[tokens[i]], a zero row for a negative id (tokens int32 [n], ids checked by
  // the caller against the table).
  virtual void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) = 0;
  // dtable (gradient dtype [vocab, c]) += dout rows at their tokens, negative ids skipped.
  // host_tokens: the same ids on the host, which lets a device group positions by token for a
  // deterministic sum.
  virtual void embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) = 0;

  // out (gradient dtype [m]) += column sums of dy ([n, m]): a bias gradient.
  virtual void column_sum_accumulate(const Tensor& dy, Tensor& out) = 0;

  // out = a + b, all of one dtype and shape; out may be a or b.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;

  // Dropout (LoRA's, model/linears.h): y = x / (1 - p) where kernels/dropout_mask.h keeps the
  // element (its flat index under `seed`), 0 elsewhere; p in [0, 1). The mask depends on the seed
  // and the index alone, the same on every backend, so a backward redraws its forward's. x and y
  // share a dtype (bf16, fp32 or fp64) and a size; y may be x. The default (kernels/dropout.cpp)
  // computes on the host, the CPU backends' implementation (through a copy for a device's
  // tensors); the CUDA backend overrides it with a kernel that gives the same bits.
  virtual void dropout(const Tensor& x, Tensor& y, double p, uint64_t seed);

  // Cross-entropy over vocabulary chunks (row statistics [n] in the stat dtype, targets int32
  // [n]). Chunk columns are global vocabulary ids c0 .. c0 + vc: a chunk of a vocabulary shard
  // passes its shard's offset in c0. softcap > 0 soft-caps the logits first (kernels/softcap.h,
  // Megatron's final_logit_softcapping): the loss is that of cap * tanh(logits / cap), and the
  // backward's dlogits are w.r.t. the logits as given (the cap's slope included); 0: none.
  virtual void ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) = 0;
  virtual void ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                Tensor& row_max, Tensor& row_sum, Tensor& target_logit) = 0;
  // Re-bases row_sum from row_max to global_max (>= row_max, e.g. the max over vocabulary
  // shards): row_sum *= exp(row_max - global_max); row_max = global_max.
  virtual void ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) = 0;
  // Fills lse and returns the sum over unmasked rows of lse - target_logit (waits for the device).
  virtual double ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                           const Tensor& targets, Tensor& lse) = 0;
  // dlogits ([n, vc], activation dtype) = softmax - onehot for the chunk's columns (times the
  // cap's slope 1 - (z / cap)^2 with softcap > 0, z the capped logit); masked rows 0. dlogits may be
  // logits itself when their dtypes agree.
  virtual void ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                 double softcap, Tensor& dlogits) = 0;
  // The whole cross-entropy of logits that hold every vocabulary column of the row (no shards to
  // combine): lse and dlogits as ce_init, ce_chunk_forward, ce_finish then ce_chunk_backward give
  // them, bit for bit, and ce_finish's sum. The default (kernels/cross_entropy.cpp) runs those four;
  // the CPU bf16 backend reads each row from memory once instead of twice.
  virtual double ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                     Tensor& lse, Tensor& dlogits);

  // ---- Token routing (mixture of experts, kernels/row_ops.cpp). Row lists live on the host, as
  // the router decides them there; `scale` is empty (1) or one factor per listed row. The default
  // implementations compute in double on the host (through a copy for a device's tensors) and
  // round each result once to the destination dtype, in list order: deterministic everywhere.
  // The CUDA backend overrides them with device kernels that give the same bits (row_dots: up to
  // the order of its double sum).
  // out[i] = scale[i] * x[rows[i]] (out: [rows.size(), C], x's dtype).
  virtual void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                           Tensor& out);
  // out[rows[i]] += scale[i] * y[i]: out's value plus the contributions to its row in list order
  // (fused multiply-adds in double), rounded once (out: y's dtype).
  virtual void scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                                Tensor& out);
  // dots[i] = <a[rows[i]], b[i]> in double (the gradient of a routing weight).
  virtual std::vector<double> row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b);
  // A backend without values (kernels/meta/meta_backend.h, the shape-only walk) decides the MoE
  // router's choices itself: the rows each expert gets when `tokens` token rows choose `topk` of
  // `experts` each, in the MoE block of decoder layer `layer` (model/moe.h routes by them). Empty,
  // as every backend with values returns: the router decides from the logits.
  virtual std::vector<int64_t> router_load(int64_t /*layer*/, int64_t /*tokens*/, int64_t /*topk*/,
                                           int64_t /*experts*/) const {
    return {};
  }

  // ---- FP8 (kernels/fp8.h, docs/fp8.md). An FP8 GEMM runs on quantized operands:
  // dst (src's shape and dtype: the activation dtype, which holds every FP8 value exactly)
  // receives src quantized as fp8::quantize does it for a GEMM that reduces over src's columns
  // (reduce_cols) or rows. Tensor granularity: `scale` multiplies before rounding (0: current
  // scaling, max / amax of src), and the GEMM's alpha carries 1 / scale. Blocks: dst holds the FP8
  // values times their block's inverse scale (the exact emulation). Returns amax |src| (unless
  // amax_out sends it elsewhere) and the scale used (1 for blocks, whose scales are folded into
  // dst), and, where the backend runs block-scaled
  // FP8 GEMMs (the CUDA backend: cuBLASLt's VEC128_32F / BLK128x128_32F, for 1 x 128 tiles and
  // 128 x 128 blocks), each block's dequantization scale (1 / its scale, fp32) in the layout its
  // gemm_fp8 reads (docs/cuda.md); undefined elsewhere. The default runs fp8::quantize on the host,
  // through a copy for a device's tensors, and hands out no block scales.
  struct Fp8Quantized {
    float amax = 0, scale = 1;
    Tensor block_scales{};
  };
  // Where quantize_fp8 leaves amax |src| (ops::Fp8AmaxOut, above the class).
  using Fp8AmaxOut = ops::Fp8AmaxOut;
  virtual Fp8Quantized quantize_fp8(const Tensor& src, fp8::Format format, fp8::Granularity granularity,
                                    bool reduce_cols, float scale, Tensor& dst, const Fp8AmaxOut& amax_out = {});
  // q as quantize_fp8 returns it under amax_out: its amax folded into amax_out.acc (through a copy
  // for a device's tensor) or dropped where amax_out says so. The host backends' last step.
  static Fp8Quantized deliver_amax(Fp8Quantized q, const Fp8AmaxOut& amax_out);
  // What an amax_out with an accumulator must be: fp32, its index within it.
  static void check_fp8_amax_out(const Fp8AmaxOut& amax_out);
  // An FP8 GEMM: gemm() (grouped_gemm()) of quantize_fp8's output, in the activation dtype: operands
  // that hold FP8 values (tensor granularity, the tensor scales carried in alpha) or FP8 values times
  // their blocks' inverse scales (blocks). The defaults are gemm() and grouped_gemm() themselves:
  // exact, as every such value is a bf16 value (the CPU backends' emulation). The CUDA backend runs
  // cuBLASLt's FP8 GEMMs where the GPU and the problem allow it, tensor-scaled or block-scaled with
  // the operands' block scales (docs/cuda.md), with the same result up to the order of the fp32 sums.
  // An operand's format, granularity and (blocks) quantize_fp8's block_scales; a format alone is a
  // tensor-scaled operand.
  struct Fp8Operand {
    fp8::OperandKind kind{};  // its format and scaling granularity
    Tensor block_scales{};
    // NOLINTNEXTLINE(google-explicit-constructor): a format alone is a tensor-scaled operand
    Fp8Operand(fp8::Format f = fp8::Format::E4M3) : kind{f, fp8::Granularity::Tensor} {}
    Fp8Operand(fp8::Format f, fp8::Granularity g, Tensor scales) : kind{f, g}, block_scales(scales) {}
  };
  struct Fp8Pair {
    Fp8Operand a, b;
  };
  virtual void gemm_fp8(const Fp8Pair& f, bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B,
                        float beta, const Tensor& C, Tensor& D, const Tensor& bias) {
    (void)f;
    gemm(trans_a, trans_b, alpha, A, B, beta, C, D, bias);
  }
  // f holds each problem's operands (their block scales are the problem's own).
  virtual void grouped_gemm_fp8(const std::vector<Fp8Pair>& f, bool trans_a, bool trans_b,
                                const std::vector<float>& alpha, const std::vector<Tensor>& A,
                                const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
    (void)f;
    grouped_gemm(trans_a, trans_b, alpha, A, B, beta, D);
  }
  // What every quantize_fp8 asks of its operands (2-D, contiguous, dst of src's shape and dtype).
  static void check_fp8_operands(const Tensor& src, const Tensor& dst);

  // Between the master, stat and activation dtypes, same number of elements.
  virtual void cast(const Tensor& src, Tensor& dst) = 0;

  virtual void synchronize() {}
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() = 0;
  // Dense peak of the device in TFLOP/s for the activation dtype, the denominator of MFU (the
  // CPU backends report the measured fp32 SGEMM peak).
  virtual double peak_tflops() const = 0;
};

}  // namespace primus::ops
