// The op set of kernels/backend.h on an NVIDIA GPU: GEMMs through cuBLASLt (gemm.h, with the
// tuning cache), this project's flash attention (flash_attention.h) and fused kernels (fused.h).
// Every op is queued on the compute stream (runtime.h) and returns without waiting, except
// ce_finish, which reads the loss back.
#pragma once

#include "kernels/backend.h"

namespace primus::cuda {

class CudaBackend final : public ops::Backend {
 public:
  // Initialises the GPU (cuda::init) when that has not happened yet.
  explicit CudaBackend(int device = 0);

  Device device() const override { return Device::CUDA; }
  std::string name() const override;
  bool computes_in(DType activation) const override { return activation == DType::BF16; }

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
            Tensor& D, const Tensor& bias) override;
  // bf16 outputs (the experts' forward and input-gradient GEMMs): one cuBLAS grouped call
  // (grouped_gemm.h); fp32 outputs (their weight gradients): one cuBLASLt GEMM each.
  using ops::Backend::grouped_gemm;
  void grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                    const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) override;
  // cuBLASLt's FP8 GEMM (gemm.h): the bf16 operands' FP8 values packed into bytes in its TN layout
  // (fp8_pack, the inner dimension padded to a multiple of 16), fp32 accumulation; tensor-scaled
  // operands on sm_89 and later with the scales in alpha, blockwise's (1 x 128 tiles with 1 x 128
  // tiles or 128 x 128 blocks) on sm_90 with cuBLASLt 12.9 or later in its block-scaled modes, each
  // value divided by its block's scale on the way and the scales (quantize_fp8's block_scales) read
  // by cuBLASLt. gemm() itself (exact) where the GPU, the operands or the shapes rule it out, said
  // once in the log per reason. The grouped form runs one FP8 GEMM per problem (cuBLAS's grouped
  // call has no FP8 types), the problems that run emulated as one grouped_gemm().
  void gemm_fp8(const Fp8Pair& f, bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
                const Tensor& C, Tensor& D, const Tensor& bias) override;
  void grouped_gemm_fp8(const std::vector<Fp8Pair>& f, bool trans_a, bool trans_b, const std::vector<float>& alpha,
                        const std::vector<Tensor>& A, const std::vector<Tensor>& B, float beta,
                        std::vector<Tensor>& D) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) override;
  void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                              const Tensor& residual, Tensor& dx) override;
  void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) override;
  void glu_forward(const Tensor& gate_up, Tensor& act, const ops::Glu& glu) override;
  void glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const ops::Glu& glu) override;
  void rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                  const Tensor& sin, bool inverse) override;
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) override;
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                          const ops::AttentionShape& s) override;
  void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse, const ops::AttentionShape& s,
                               bool causal) override;
  void attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                       const ops::AttentionShape& s) override;
  void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const ops::AttentionShape& s,
                                bool causal) override;
  void attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                               const ops::AttentionShape& s) override;
  void attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) override;
  void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) override;
  void embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) override;
  void column_sum_accumulate(const Tensor& dy, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void dropout(const Tensor& x, Tensor& y, double p, uint64_t seed) override;
  // The routing row ops on the device (fused_row_ops.cu), bf16 or fp32: the same bits as the
  // op set's host default for gather_rows and scatter_add_rows; row_dots waits for the device.
  void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                   Tensor& out) override;
  void scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                        Tensor& out) override;
  std::vector<double> row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) override;
  void ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) override;
  void ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& row_max,
                        Tensor& row_sum, Tensor& target_logit) override;
  void ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) override;
  double ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit, const Tensor& targets,
                   Tensor& lse) override;
  void ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0, double softcap,
                         Tensor& dlogits) override;
  void cast(const Tensor& src, Tensor& dst) override;
  // On the GPU (cuda/fp8_quantize.h) for bf16 and fp32 device tensors: the host's values, bit for
  // bit, and for 1 x 128 tiles and 128 x 128 blocks their dequantization scales in cuBLASLt's layout.
  Fp8Quantized quantize_fp8(const Tensor& src, fp8::Format format, fp8::Granularity granularity, bool reduce_cols,
                            float scale, Tensor& dst, const Fp8AmaxOut& amax_out = {}) override;
  void synchronize() override;
  MemoryStats memory_stats() const override;
  void reset_peak_memory() override;
  double peak_tflops() const override;

 private:
  Tensor loss_sum_;  // one float on the device, read back by ce_finish
  mutable double peak_tflops_ = 0;
};

}  // namespace primus::cuda
