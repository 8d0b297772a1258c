// A backend that times another: every op of kernels/backend.h is forwarded and its wall time added
// to a category (GEMM, attention, rows and elements, cross-entropy, casts, MoE routing row ops).
// bench_engine --profile uses it for the breakdown of a training step in docs/engine.md. The ops
// run synchronously on the CPU, so the wall time of a call is its cost.
#pragma once

#include <array>
#include <chrono>
#include <map>
#include <string>

#include "kernels/backend.h"
#include "plan/gemm_list.h"

namespace primus::bench {

class TimedBackend final : public ops::Backend {
 public:
  enum Category { Gemm, GroupedGemm, Attention, Elementwise, CrossEntropy, Cast, Fp8Quantize, RowOps, kCategories };
  static const char* category_name(int c) {
    static const char* names[] = {"GEMM",
                                  "grouped GEMM (MoE experts)",
                                  "attention",
                                  "norms, SwiGLU, RoPE, embedding, adds",
                                  "cross-entropy",
                                  "casts",
                                  "FP8 quantization",
                                  "MoE permute, unpermute, row dots"};
    return names[c];
  }

  explicit TimedBackend(ops::Backend& inner) : in_(inner) {}
  std::array<double, kCategories> seconds{};
  double gemm_flops = 0, grouped_flops = 0;  // (grouped_flops: those of the grouped GEMMs)
  // The GEMMs by form and shape, labelled as `benchmark gemm` names them (plan::gemm_label): "NT
  // 2048x2304x768 bf16>bf16 +C". A GEMM that wins alone can lose in the step: this is the step's
  // own stopwatch.
  struct ShapeTime {
    double seconds = 0, flops = 0;
    long calls = 0;
  };
  std::map<std::string, ShapeTime> gemm_shapes;
  // Every op of the op set by name ("glu_backward"), with its category: where a category's time goes.
  struct OpTime {
    int category = 0;
    double seconds = 0;
    long calls = 0;
  };
  std::map<std::string, OpTime> ops;
  void reset() { seconds.fill(0), gemm_flops = grouped_flops = 0, gemm_shapes.clear(), ops.clear(); }

  Device device() const override { return in_.device(); }
  std::string name() const override { return in_.name(); }
  bool computes_in(DType a) const override { return in_.computes_in(a); }

  void gemm(bool ta, bool tb, float alpha, const Tensor& A, const Tensor& B, float beta, const Tensor& C, Tensor& D,
            const Tensor& bias) override {
    const int64_t k = ta ? A.size(0) : A.size(1);
    const double flops = 2.0 * double(D.size(0)) * double(D.size(1)) * double(k);
    gemm_flops += flops;
    const double s = time(Gemm, "gemm", [&] { in_.gemm(ta, tb, alpha, A, B, beta, C, D, bias); });
    plan::GemmEntry g;
    g.trans_a = ta, g.trans_b = tb, g.m = D.size(0), g.n = D.size(1), g.k = k, g.in = A.dtype(), g.out = D.dtype();
    g.bias = bias.defined(), g.accumulate = beta != 0.0f;
    ShapeTime& e = gemm_shapes[plan::gemm_label(g)];
    e.seconds += s, e.flops += flops, ++e.calls;
  }
  using ops::Backend::grouped_gemm;
  void grouped_gemm(bool ta, bool tb, const std::vector<float>& alpha, const std::vector<Tensor>& A, const std::vector<Tensor>& B,
                    float beta, std::vector<Tensor>& D) override {
    for (size_t i = 0; i < A.size() && i < D.size(); ++i)
      grouped_flops += 2.0 * double(D[i].size(0)) * double(D[i].size(1)) * double(ta ? A[i].size(0) : A[i].size(1));
    time(GroupedGemm, "grouped_gemm", [&] { in_.grouped_gemm(ta, tb, alpha, A, B, beta, D); });
  }
  Fp8Quantized quantize_fp8(const Tensor& src, fp8::Format f, fp8::Granularity g, bool reduce_cols, float scale,
                            Tensor& dst, const Fp8AmaxOut& amax_out = {}) override {
    Fp8Quantized q;
    time(Fp8Quantize, "quantize_fp8", [&] { q = in_.quantize_fp8(src, f, g, reduce_cols, scale, dst, amax_out); });
    return q;
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) override {
    time(Elementwise, "rmsnorm_forward", [&] { in_.rmsnorm_forward(x, w, y, rstd, eps); });
  }
  void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                              const Tensor& residual, Tensor& dx) override {
    time(Elementwise, "rmsnorm_backward_input", [&] { in_.rmsnorm_backward_input(dy, x, w, rstd, residual, dx); });
  }
  void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) override {
    time(Elementwise, "rmsnorm_backward_weight", [&] { in_.rmsnorm_backward_weight(dy, x, rstd, dw); });
  }
  void glu_forward(const Tensor& gate_up, Tensor& act, const ops::Glu& glu) override {
    time(Elementwise, "glu_forward", [&] { in_.glu_forward(gate_up, act, glu); });
  }
  void glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const ops::Glu& glu) override {
    time(Elementwise, "glu_backward", [&] { in_.glu_backward(dact, gate_up, dgate_up, glu); });
  }
  void rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                  const Tensor& sin, bool inverse) override {
    time(Elementwise, "rope_apply", [&] { in_.rope_apply(x, heads, head_dim, seq, pos0, cos, sin, inverse); });
  }
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) override {
    time(Attention, "attention_forward", [&] { in_.attention_forward(qkv, out, lse, s); });
  }
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                          const ops::AttentionShape& s) override {
    time(Attention, "attention_backward", [&] { in_.attention_backward(qkv, out, lse, dout, dqkv, s); });
  }
  void attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                               const ops::AttentionShape& s) override {
    time(Attention, "attention_sink_backward", [&] { in_.attention_sink_backward(out, lse, dout, dsinks, s); });
  }
  void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                               const ops::AttentionShape& s, bool causal) override {
    time(Attention, "attention_block_forward", [&] { in_.attention_block_forward(qkv, kv, out, lse, s, causal); });
  }
  void attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                       const ops::AttentionShape& s) override {
    time(Attention, "attention_merge", [&] { in_.attention_merge(acc, lse, block_out, block_lse, s); });
  }
  void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc, const ops::AttentionShape& s,
                                bool causal) override {
    time(Attention, "attention_block_backward",
         [&] { in_.attention_block_backward(qkv, kv, out, lse, dout, dq_acc, dkv_acc, s, causal); });
  }
  void attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) override {
    time(Attention, "attention_decode", [&] { in_.attention_decode(cache, first, out, s); });
  }
  void embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) override {
    time(Elementwise, "embedding_forward", [&] { in_.embedding_forward(tokens, table, out); });
  }
  void embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) override {
    time(Elementwise, "embedding_backward", [&] { in_.embedding_backward(host_tokens, dout, dtable); });
  }
  void column_sum_accumulate(const Tensor& dy, Tensor& out) override {
    time(Elementwise, "column_sum_accumulate", [&] { in_.column_sum_accumulate(dy, out); });
  }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    time(Elementwise, "add", [&] { in_.add(a, b, out); });
  }
  void ce_init(Tensor& m, Tensor& s, Tensor& zt) override {
    time(CrossEntropy, "ce_init", [&] { in_.ce_init(m, s, zt); });
  }
  void ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& m, Tensor& s,
                        Tensor& zt) override {
    time(CrossEntropy, "ce_chunk_forward", [&] { in_.ce_chunk_forward(logits, targets, c0, softcap, m, s, zt); });
  }
  void ce_merge_max(Tensor& m, Tensor& s, const Tensor& g) override {
    time(CrossEntropy, "ce_merge_max", [&] { in_.ce_merge_max(m, s, g); });
  }
  double ce_finish(const Tensor& m, const Tensor& s, const Tensor& zt, const Tensor& targets, Tensor& lse) override {
    double r = 0;
    time(CrossEntropy, "ce_finish", [&] { r = in_.ce_finish(m, s, zt, targets, lse); });
    return r;
  }
  double ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap, Tensor& lse,
                             Tensor& dlogits) override {
    double r = 0;
    time(CrossEntropy, "ce_forward_backward",
         [&] { r = in_.ce_forward_backward(logits, targets, c0, softcap, lse, dlogits); });
    return r;
  }
  void ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0, double softcap,
                         Tensor& dlogits) override {
    time(CrossEntropy, "ce_chunk_backward", [&] { in_.ce_chunk_backward(logits, lse, targets, c0, softcap, dlogits); });
  }
  void cast(const Tensor& src, Tensor& dst) override {
    time(Cast, "cast", [&] { in_.cast(src, dst); });
  }
  void gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                   Tensor& out) override {
    time(RowOps, "gather_rows", [&] { in_.gather_rows(x, rows, scale, out); });
  }
  void scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                        Tensor& out) override {
    time(RowOps, "scatter_add_rows", [&] { in_.scatter_add_rows(y, rows, scale, out); });
  }
  std::vector<double> row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) override {
    std::vector<double> d;
    time(RowOps, "row_dots", [&] { d = in_.row_dots(a, rows, b); });
    return d;
  }
  std::vector<int64_t> router_load(int64_t layer, int64_t tokens, int64_t topk, int64_t experts) const override {
    return in_.router_load(layer, tokens, topk, experts);
  }
  void synchronize() override { in_.synchronize(); }
  MemoryStats memory_stats() const override { return in_.memory_stats(); }
  void reset_peak_memory() override { in_.reset_peak_memory(); }
  double peak_tflops() const override { return in_.peak_tflops(); }

 private:
  template <typename F>
  double time(Category c, const char* op, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds[c] += s;
    OpTime& o = ops[op];
    o.category = c, o.seconds += s, ++o.calls;
    return s;
  }
  ops::Backend& in_;
};

}  // namespace primus::bench
