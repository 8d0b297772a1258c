// bf16 mixed precision on the CPU at the speed of its bf16 instructions: the op set
// (kernels/backend.h) with bf16 activations, fp32 statistics and fp32 weight gradients, on
//   - GEMMs (gemm.h): this project's AVX512-BF16 kernels, or oneDNN's matmul, which runs on AMX
//     tiles where the CPU has them;
//   - attention forward, backward and decode (kernels.h): vdpbf16ps dot products, fp32 softmax
//     statistics;
//   - RMSNorm, SwiGLU, RoPE, embedding, the chunked cross-entropy and casts on AVX-512.
// It computes what cpu::ReferenceBackend defines (one bf16 rounding per op result), within fp32
// summation order and the bf16 rounding of attention's probabilities.
//
// It needs AVX-512 with AVX512-BF16 (cpu_features.h): construct it only where
// Bf16Backend::supported(); train/compute.cpp falls back to the reference backend elsewhere.
#pragma once

#include <string>

#include "kernels/backend.h"

namespace primus::cpu {

class Bf16Backend final : public ops::Backend {
 public:
  // Whether this CPU runs the backend; else why not ("no AVX512-BF16 on this CPU").
  static bool supported(std::string* why_not = nullptr);
  Bf16Backend();  // throws primus::Error where !supported()

  Device device() const override { return Device::CPU; }
  std::string name() const override;  // "cpu-bf16 (AVX512-BF16)", "cpu-bf16 (AMX through oneDNN)"
  bool computes_in(DType activation) const override { return activation == DType::BF16; }

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
            Tensor& D, const Tensor& bias) override;
  // One bf16k::gemm_grouped call.
  using ops::Backend::grouped_gemm;
  void grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                    const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) override;
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
  void attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                               const ops::AttentionShape& s) override;
  void attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) override;
  // Context parallel's block ops: the reference backend's (they define them), not yet vectorised.
  void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse, const ops::AttentionShape& s,
                               bool causal) override;
  void attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                       const ops::AttentionShape& s) override;
  void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const ops::AttentionShape& s,
                                bool causal) override;
  void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) override;
  void embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) override;
  void column_sum_accumulate(const Tensor& dy, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) override;
  void ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& row_max,
                        Tensor& row_sum, Tensor& target_logit) override;
  void ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) override;
  double ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit, const Tensor& targets,
                   Tensor& lse) override;
  void ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0, double softcap,
                         Tensor& dlogits) override;
  double ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& lse,
                             Tensor& dlogits) override;
  void cast(const Tensor& src, Tensor& dst) override;
  // The routing row ops on bf16 tensors (AVX-512, the default's bits); other dtypes take the default.
  void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                   Tensor& out) override;
  void scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                        Tensor& out) override;
  std::vector<double> row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) override;
  // bf16 tensors through the AVX-512 kernels (one pass, the default's bits), others the default's.
  Fp8Quantized quantize_fp8(const Tensor& src, fp8::Format format, fp8::Granularity granularity, bool reduce_cols,
                            float scale, Tensor& dst, const Fp8AmaxOut& amax_out = {}) override;
  MemoryStats memory_stats() const override;
  void reset_peak_memory() override;
  // The measured bf16 GEMM peak (bf16k::bf16_gemm_peak_gflops), not the SGEMM one.
  double peak_tflops() const override;
};

}  // namespace primus::cpu
