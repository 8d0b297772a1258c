// The shape-only backend (docs/architecture.md, "The shape-only backend"): the op set over tensors
// without values (Device::Meta, core/meta_device.h). Every op checks nothing and computes nothing:
// it records its call (kernels/op_call.h: the op, shapes, dtypes, FLOPs, bytes moved), and so do
// the device copies and zeroing the model does between ops. Running the real model's passes on it
// gives the op list of one rank's microbatch and, through the meta device's counters, the bytes
// those passes hold at every moment; plan/model_walk.h does that walk.
//
// Host reads of device values get well-defined values: a meta tensor reads as zeros (host_values,
// copies to the host), ce_finish returns a loss of 0, row_dots return zeros, quantize_fp8 an amax
// of 0. The MoE router's
// choices, which the model makes from the router logits' values, come from the walk's RouterLoad
// instead (router_load): balanced by default, or a measured histogram.
#pragma once

#include <map>
#include <vector>

#include "core/meta_device.h"
#include "kernels/backend.h"
#include "kernels/op_call.h"

namespace primus::ops {

// How a walk's MoE routers spread a microbatch's routed rows over the experts.
struct RouterLoad {
  // Each expert's share of the routed rows (non-negative weights, normalised per use); empty:
  // balanced, tokens x topk / experts rows each (the remainder to the lowest experts).
  std::vector<double> shares;
  // Shares for the MoE block of a given decoder layer (a measured histogram per layer, e.g. a
  // run's tokens per expert), in place of `shares` there.
  std::map<int64_t, std::vector<double>> per_layer;

  // Rows per expert (summing to tokens x topk), by largest remainder.
  std::vector<int64_t> counts(int64_t layer, int64_t tokens, int64_t topk, int64_t experts) const;
};

class MetaBackend final : public Backend, private MetaObserver {
 public:
  // Becomes the meta device's observer (one shape-only backend at a time).
  explicit MetaBackend(RouterLoad load = {});
  ~MetaBackend() override;
  MetaBackend(const MetaBackend&) = delete;
  MetaBackend& operator=(const MetaBackend&) = delete;

  Device device() const override { return Device::Meta; }
  std::string name() const override { return "shape-only"; }
  bool computes_in(DType activation) const override {
    return activation == DType::F32 || activation == DType::BF16 || activation == DType::F64;
  }

  // The calls recorded so far, in order (take: and forget them).
  const std::vector<OpCall>& calls() const { return calls_; }
  std::vector<OpCall> take_calls();
  const RouterLoad& load() const { return load_; }

  void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C,
            Tensor& D, const Tensor& bias) override;
  // FP8 GEMMs as GEMM calls marked with their operands' scaling (OpCall::fp8): a device with an
  // FP8 peak times them at it (projection/op_timing.h).
  void gemm_fp8(const Fp8Pair& f, bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
                const Tensor& C, Tensor& D, const Tensor& bias) override;
  void grouped_gemm_fp8(const std::vector<Fp8Pair>& f, bool trans_a, bool trans_b, const std::vector<float>& alpha,
                        const std::vector<Tensor>& A, const std::vector<Tensor>& B, float beta,
                        std::vector<Tensor>& D) override;
  using ops::Backend::grouped_gemm;
  void grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                    const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) override;
  void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                              const Tensor& residual, Tensor& dx) override;
  void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) override;
  void glu_forward(const Tensor& gate_up, Tensor& act, const Glu& glu) override;
  void glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const Glu& glu) override;
  void rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                  const Tensor& sin, bool inverse) override;
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionShape& s) override;
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                          const AttentionShape& s) override;
  void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse, const AttentionShape& s,
                               bool causal) override;
  void attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                       const AttentionShape& s) override;
  void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const AttentionShape& s,
                                bool causal) override;
  void attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                               const AttentionShape& s) override;
  void attention_decode(const Tensor& cache, int64_t first, Tensor& out, const AttentionShape& s) override;
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
                   Tensor& lse) override;  // 0
  double ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& lse,
                             Tensor& dlogits) override;
  void ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0, double softcap,
                         Tensor& dlogits) override;
  void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                   Tensor& out) override;
  void scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                        Tensor& out) override;
  std::vector<double> row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) override;  // zeros
  std::vector<int64_t> router_load(int64_t layer, int64_t tokens, int64_t topk, int64_t experts) const override;
  // As quantizing zeros: amax 0, and the scale given (current scaling's 1 for an amax of 0).
  Fp8Quantized quantize_fp8(const Tensor& src, fp8::Format format, fp8::Granularity granularity, bool reduce_cols,
                            float scale, Tensor& dst, const Fp8AmaxOut& amax_out = {}) override;
  void cast(const Tensor& src, Tensor& dst) override;

  MemoryStats memory_stats() const override { return meta_memory_stats(); }
  void reset_peak_memory() override { reset_peak_meta_memory(); }
  double peak_tflops() const override { return 0; }

 private:
  void on_copy(size_t width, size_t rows, size_t dpitch, size_t spitch, CopyKind kind) override;
  void on_zero(size_t bytes) override;
  void record(OpCall c) { calls_.push_back(std::move(c)); }
  // An FP8 GEMM reads quantized copies: its weight is the tensor the copy was made from (the
  // latest quantize_fp8 into that address), so that the walk names the parameter.
  const void* origin(const void* p) const {
    const auto it = quantized_from_.find(p);
    return it == quantized_from_.end() ? p : it->second;
  }

  RouterLoad load_;
  std::vector<OpCall> calls_;
  std::map<const void*, const void*> quantized_from_;
};

}  // namespace primus::ops
