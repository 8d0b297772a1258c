// TracedBackend: the op set (kernels/backend.h) with every op recorded while the profiler is
// active, forwarded to the real backend in any case. Each op becomes a compute event with its
// shapes, FLOPs and bytes moved (the rules of kernels/op_call.h, which the shape-only backend
// records too: GEMM 2 M N K FLOPs and the bytes of A, B and D, as TraceLens counts them; causal
// attention 2 N s q forward and twice that backward, as model_stats counts),
// the layer and module of the weight it reads or the gradient it writes (found by pointer in the
// model's flat buffers), and its kind: forward, input gradient or weight gradient. Results are
// the real backend's, bit for bit: the decorator only watches.
#pragma once

#include "kernels/backend.h"
#include "trace/profiler.h"

namespace primus::trace {

class TracedBackend final : public ops::Backend {
 public:
  TracedBackend(ops::Backend& inner, Profiler& profiler) : be_(inner), p_(profiler) {}
  ops::Backend& inner() const { return be_; }

  Device device() const override { return be_.device(); }
  std::string name() const override { return be_.name(); }
  bool computes_in(DType activation) const override { return be_.computes_in(activation); }

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
            Tensor& D, const Tensor& bias) override;
  // One "gemm" event for the whole group: its FLOPs and bytes summed, dims those of the one GEMM
  // it equals (the problems' rows stacked; for a weight gradient their K), dims[3] the problems.
  using ops::Backend::grouped_gemm;
  void grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                    const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) override;
  // The FP8 GEMMs as "gemm" events too (the wrapped backend's FP8 GEMMs, not its gemm()).
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
  void attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                               const ops::AttentionShape& s) override;
  void attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) override;
  void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                               const ops::AttentionShape& s, bool causal) override;
  void attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                       const ops::AttentionShape& s) override;
  void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const ops::AttentionShape& s,
                                bool causal) override;
  void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                   Tensor& out) override;
  void scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                        Tensor& out) override;
  std::vector<double> row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) override;
  Fp8Quantized quantize_fp8(const Tensor& src, fp8::Format format, fp8::Granularity granularity, bool reduce_cols,
                            float scale, Tensor& dst, const Fp8AmaxOut& amax_out = {}) override;
  void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) override;
  void embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) override;
  void column_sum_accumulate(const Tensor& dy, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void dropout(const Tensor& x, Tensor& y, double p, uint64_t seed) override;
  void ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) override;
  void ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& row_max,
                        Tensor& row_sum, Tensor& target_logit) override;
  void ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) override;
  double ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit, const Tensor& targets,
                   Tensor& lse) override;
  double ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& lse,
                             Tensor& dlogits) override;
  void ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0, double softcap,
                         Tensor& dlogits) override;
  void cast(const Tensor& src, Tensor& dst) override;

  void synchronize() override { be_.synchronize(); }
  MemoryStats memory_stats() const override { return be_.memory_stats(); }
  void reset_peak_memory() override { be_.reset_peak_memory(); }
  double peak_tflops() const override { return be_.peak_tflops(); }

 private:
  // Fills what every op records: kind, a weight (or gradient) to find its layer and module by,
  // a module name for ops without weights, dims, FLOPs and bytes.
  void finish(Event& e, Mark end, OpKind kind, const Tensor* weight, const char* module, DType dtype,
              std::initializer_list<int64_t> dims, double flops, double bytes);
  // finish() for a GEMM: its kind (forward, input or weight gradient) from the B or D it touches.
  void finish_gemm(Event& e, Mark end, bool trans_b, const Tensor& B, const Tensor& D, DType dtype,
                   std::initializer_list<int64_t> dims, double flops, double bytes);

  ops::Backend& be_;
  Profiler& p_;
};

}  // namespace primus::trace
