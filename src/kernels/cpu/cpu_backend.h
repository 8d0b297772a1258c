// The op set (kernels/backend.h) on the CPU in fp32, and in fp64 for the finite-difference
// gradient tests: OpenBLAS GEMMs and this project's kernels (attention.h, elementwise.h), called
// on the tensors' buffers with no copies. Activations, statistics, weights and gradients all have
// one dtype, so the working weights are the master weights themselves.
#pragma once

#include "kernels/backend.h"

namespace primus::cpu {

class CpuBackend final : public ops::Backend {
 public:
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }
  bool computes_in(DType activation) const override {
    return activation == DType::F32 || activation == DType::F64;
  }

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
            Tensor& D, const Tensor& bias) override;
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
  void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse, const ops::AttentionShape& s,
                               bool causal) override;
  void attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                       const ops::AttentionShape& s) override;
  void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const ops::AttentionShape& s,
                                bool causal) override;
  void attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) override;
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
  void cast(const Tensor& src, Tensor& dst) override;
  MemoryStats memory_stats() const override;
  void reset_peak_memory() override;
  double peak_tflops() const override;
};

// The process's CPU backend (it holds no state).
CpuBackend& cpu_backend();

// Casts between fp32, fp64 and bf16 host tensors of the same element count (shared with the
// reference backend).
void cast_host(const Tensor& src, Tensor& dst);

// Every CPU backend's check of an operand: defined, on the host, contiguous ("what" names it).
void check_host(const Tensor& t, const char* what);

}  // namespace primus::cpu
