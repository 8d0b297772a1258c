// The op set of mixed-precision training, one interface for every device (DESIGN.md: one
// interface per op family). The mixed-precision Llama model (model/llama_mixed.h) is written
// against it, so the same model code runs on:
//   - cuda::CudaBackend (kernels/cuda/cuda_backend.h): cuBLASLt, flash attention, fused kernels;
//   - cpu::ReferenceBackend (kernels/cpu/reference_backend.h): the fp32 CPU kernels on bf16
//     tensors, each result rounded to bf16 once. It defines what every op must compute, is the
//     reference of the GPU tests, and lets the model's bf16 path be tested without a GPU.
//
// Types: activations and the weights' working copy are bf16; norm statistics, log-sum-exps,
// logits and loss are fp32; weight gradients are fp32 and accumulated (+=). Every tensor lives on
// device() and is contiguous row-major; 2-D unless said otherwise. Token ids and targets are
// int32 tensors on device(); a negative target masks its token out of the loss.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "kernels/cpu/attention.h"

namespace primus::ops {

using AttentionShape = cpu::AttentionShape;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu-reference", "cuda (NVIDIA H100 80GB HBM3)"

  Tensor empty(const Shape& shape, DType dtype) const { return Tensor::empty(shape, dtype, device()); }
  Tensor zeros(const Shape& shape, DType dtype) const { return Tensor::zeros(shape, dtype, device()); }

  // D = alpha * op(A) op(B) + beta * C (+ bias[n] on every row); op = transpose when trans_*.
  // A, B bf16 (rows of a larger tensor are fine: slices along dim 0 stay contiguous). C and D
  // are both bf16 or both fp32; C may be D (accumulate) or a residual; C is not read when
  // beta == 0 (pass an undefined tensor). bias is bf16 [n] or undefined.
  virtual void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
                    const Tensor& C, Tensor& D, const Tensor& bias) = 0;

  // RMSNorm over rows: y = x * rstd * w; rstd [n] fp32.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) = 0;
  // dx = residual + d(norm)/dx; residual undefined (0) or equal to dx.
  virtual void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                      const Tensor& residual, Tensor& dx) = 0;
  virtual void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) = 0;

  virtual void swiglu_forward(const Tensor& gate_up, Tensor& act) = 0;
  virtual void swiglu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up) = 0;

  // In place on x [rows, stride]: the first `heads` heads of head_dim of each row; row r has
  // position r % seq; cos/sin fp32 [positions, head_dim/2]; inverse for the backward.
  virtual void rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, const Tensor& cos,
                          const Tensor& sin, bool inverse) = 0;

  // Causal attention on the fused qkv layout of kernels/cpu/attention.h. lse [batch, heads, seq].
  virtual void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionShape& s) = 0;
  virtual void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  Tensor& dqkv, const AttentionShape& s) = 0;

  // out[i] = table[tokens[i]] (tokens int32 [n], checked by the caller).
  virtual void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) = 0;
  // dtable (fp32 [vocab, c]) += dout rows at their tokens. host_tokens: the same ids on the host,
  // which lets a device group positions by token for a deterministic sum.
  virtual void embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) = 0;

  // out (fp32 [m]) += column sums of dy (bf16 [n, m]): a bias gradient.
  virtual void column_sum_accumulate(const Tensor& dy, Tensor& out) = 0;

  // Cross-entropy over vocabulary chunks (fp32 row statistics [n], targets int32 [n]).
  virtual void ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) = 0;
  virtual void ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, Tensor& row_max,
                                Tensor& row_sum, Tensor& target_logit) = 0;
  // Fills lse and returns the sum over unmasked rows of lse - target_logit (waits for the device).
  virtual double ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                           const Tensor& targets, Tensor& lse) = 0;
  // dlogits (bf16 [n, vc]) = softmax - onehot for the chunk's columns; masked rows 0.
  virtual void ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                 Tensor& dlogits) = 0;

  // fp32 <-> bf16 of the same shape.
  virtual void cast(const Tensor& src, Tensor& dst) = 0;

  virtual void synchronize() {}
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() = 0;
  // Dense bf16 peak of the device in TFLOP/s, the denominator of MFU (the CPU reference
  // backend reports the measured fp32 SGEMM peak).
  virtual double peak_tflops() const = 0;
};

}  // namespace primus::ops
