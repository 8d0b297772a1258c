// Causal self-attention with grouped-query attention, computed tile by tile with an online
// softmax (FlashAttention's scheme): no T x T matrix is ever stored. The forward keeps the output
// and the per-row log-sum-exp; the backward recomputes the probabilities from them.
//
// Layout: q, k and v live in one fused row per token, as the QKV projection writes them:
//   qkv[(b*seq + t) * qkv_stride + ...] = [ q: heads*head_dim | k: groups*head_dim | v: groups*head_dim ]
// Head h attends with key/value group h / (heads / groups).
#pragma once

#include <cstdint>

namespace primus::cpu {

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, groups = 0, head_dim = 0;
  int64_t qkv_stride() const { return (heads + 2 * groups) * head_dim; }
};

// out [batch*seq, heads*head_dim]; lse [batch, heads, seq].
template <typename T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s);

// dqkv [batch*seq, qkv_stride] is overwritten with the gradients of q, k and v.
template <typename T>
void attention_backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv, const AttentionShape& s);

// Decoding with a key/value cache: cache [seq, qkv_stride] holds the qkv rows of positions
// 0 .. seq-1 of one sequence (s.batch = 1); out [seq - first, heads*head_dim] receives the causal
// attention of the query rows first .. seq-1.
template <typename T>
void attention_decode(const T* cache, int64_t first, T* out, const AttentionShape& s);

}  // namespace primus::cpu
