// Row-wise and element-wise kernels of the Llama block: RMSNorm, SwiGLU, rotary embedding and
// token embedding, each with its forward, input-gradient (B) and weight-gradient (W) parts.
// Rows are tokens; all buffers are contiguous row-major. OpenMP over rows, inner loops
// written so the compiler vectorises them.
#pragma once

#include <cstdint>

namespace primus::cpu {

// RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). Saves rstd [n] for the backward.
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t c, double eps);
// dx (= or +=) from dy; needs x, w and the saved rstd.
template <typename T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, const T* rstd, T* dx, int64_t n, int64_t c,
                            bool accumulate);
// dw += sum over rows of dy * x * rstd.
template <typename T>
void rmsnorm_backward_weight(const T* dy, const T* x, const T* rstd, T* dw, int64_t n, int64_t c);

// The gated linear unit of a fused [gate | up] row of 2f values, Megatron's glu():
//   a = g sigmoid(alpha g) (u + offset),  g = min(gate, limit), u = clamp(up, -limit, limit)
// alpha 1, offset 0 and no limit (0) is SwiGLU, a = silu(gate) * up; gpt-oss's experts use
// alpha 1.702 (quick_geglu), offset 1 (glu_linear_offset), limit 7 (activation_func_clamp_value).
// The backward passes no gradient through a clamped value (gate > limit, |up| > limit).
struct Glu {
  double alpha = 1.0, offset = 0.0, limit = 0.0;  // limit 0: no clamp
  bool plain() const { return alpha == 1.0 && offset == 0.0 && limit == 0.0; }
};
template <typename T>
void swiglu_forward(const T* gate_up, T* a, int64_t n, int64_t f, const Glu& glu = {});
template <typename T>
void swiglu_backward(const T* da, const T* gate_up, T* dgate_up, int64_t n, int64_t f, const Glu& glu = {});

// Rotary embedding tables: cos/sin [positions, head_dim/2], with Llama 3.1's frequency scaling
// when scaling_factor > 0 (low/high frequency factors, original context length).
struct RopeScaling {
  double factor = 0;  // 0: no scaling
  double low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position = 8192;
};
template <typename T>
void rope_tables(T* cos, T* sin, int64_t positions, int64_t head_dim, double base, const RopeScaling& scaling);
// Rotates `heads` heads of head_dim in each row (row stride `stride`, starting at `x`) in place,
// using the rotate-half pairing (i, i + head_dim/2) of Hugging Face and Megatron. Row r has
// position pos0 + r % seq. inverse = true applies the transpose (the backward).
template <typename T>
void rope_apply(T* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0,
                const T* cos, const T* sin, bool inverse);

// Embedding: out[i] = table[tokens[i]]; backward_weight: dtable[tokens[i]] += dout[i]. A negative
// id stands for a token of another vocabulary shard: a zero row, no gradient. An id at or past
// the vocabulary is a data error.
template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t n, int64_t vocab, int64_t c);
template <typename T>
void embedding_backward_weight(const int32_t* tokens, const T* dout, T* dtable, int64_t n, int64_t vocab,
                               int64_t c);

// Cross-entropy over a chunk of vocabulary columns c0 .. c0 + vc of rows [n, vc] (see
// ops::Backend::ce_chunk_forward/backward). forward updates each row's running max m, sum of
// exp(z - m) and target logit zt; backward writes softmax - onehot (0 on rows whose target is
// negative) and may write over the logits. cap > 0 soft-caps the logits first (kernels/softcap.h)
// and the backward multiplies by the cap's slope.
template <typename T>
void ce_chunk_forward(const T* logits, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, T cap, T* m, T* s,
                      T* zt);
template <typename T>
void ce_chunk_backward(const T* logits, const T* lse, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, T cap,
                       T* dlogits);

}  // namespace primus::cpu
