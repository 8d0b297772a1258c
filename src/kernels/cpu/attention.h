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
  // Sliding-window attention (Megatron's window_size [window, 0]): query t sees keys t - window ..
  // t alone; negative: every earlier key. Causal self-attention only (not the ring's blocks).
  int64_t window = -1;
  int64_t qkv_stride() const { return (heads + 2 * groups) * head_dim; }
  // The first key position that the window lets query position t see (0 without a window).
  int64_t window_start(int64_t t) const { return window < 0 || t <= window ? 0 : t - window; }
};

// Attention sinks (gpt-oss; Megatron's softmax_type learnable / off-by-one): one logit per head,
// sinks[h], joins every row's softmax denominator as a key whose value is zero:
//   p_ts = exp(q_t.k_s / sqrt(D)) / (sum_u exp(q_t.k_u / sqrt(D)) + exp(sinks[h]))
// The forward folds it into the online softmax's start (m = sinks[h], l = 1), so lse holds it and
// the backward's probabilities need nothing more; the sink's own gradient is
//   d sinks[h] = - sum_{b,t} exp(sinks[h] - lse[b,h,t]) * sum_d dout[b,t,h,d] out[b,t,h,d]
// (attention_sink_backward). A null sinks pointer: no sinks.

// Documents packed into the sequences (reset_attention_mask, packed SFT samples): attention stays
// inside each document. start[b*seq + t] is the position where query row t's document begins, in
// the positions of the key rows: key row s of a sequence is at position key_pos0 + s. Query t sees
// key s only when key_pos0 + s >= start[b*seq + t] (and, causal, s <= t). Within a sequence start
// never decreases (documents are runs of consecutive rows), which lets every kernel skip the key
// tiles that no query of a tile sees: packed attention costs about the sum of its documents'
// causal attention. start null: no documents (every key by the causal rule alone). Without
// context parallelism key_pos0 is 0 and start holds positions within the sequence; a query that
// sees no key of a block (a block of another document) gets output 0 and log-sum-exp -inf.
struct Documents {
  const int32_t* start = nullptr;
  int64_t key_pos0 = 0;
};

// out [batch*seq, heads*head_dim]; lse [batch, heads, seq].
template <typename T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s, const Documents& docs = {},
                       const T* sinks = nullptr);

// dqkv [batch*seq, qkv_stride] is overwritten with the gradients of q, k and v (with sinks: lse is
// the forward's, which holds them).
template <typename T>
void attention_backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv, const AttentionShape& s,
                        const Documents& docs = {});

// dsinks [heads] += the sinks' gradient (above) from out, dout [batch*seq, heads*head_dim] and lse.
template <typename T>
void attention_sink_backward(const T* out, const T* dout, const T* lse, const T* sinks, T* dsinks,
                             const AttentionShape& s);

// Context parallelism splits a sequence over ranks; a rank's queries then attend to key/value
// blocks that arrive from the others, one block at a time, and the blocks' results are merged by
// their log-sum-exps. A block pair has s.seq query rows and s.seq key rows per sequence:
//   qkv  [batch*seq, qkv_stride]   the queries' fused rows (only the q columns are read)
//   kv   [batch*seq, 2*groups*head_dim]   [ k: groups*head_dim | v: groups*head_dim ]
// causal: query t sees keys s <= t (the block on the diagonal: same positions); else all keys.
// out [batch*seq, heads*head_dim] and lse [batch, heads, seq] are this block's alone.
template <typename T>
void attention_block_forward(const T* qkv, const T* kv, T* out, T* lse, const AttentionShape& s, bool causal,
                             const Documents& docs = {});

// The block's share of the gradients, given the MERGED out and lse (over every block) and dout:
// dq_acc [batch*seq, heads*head_dim] += dq; dkv_acc [batch*seq, 2*groups*head_dim] += [dk | dv].
template <typename T>
void attention_block_backward(const T* qkv, const T* kv, const T* out, const T* lse, const T* dout, T* dq_acc,
                              T* dkv_acc, const AttentionShape& s, bool causal, const Documents& docs = {});

// Merges a block into the running result: with w = exp(lse - m), wb = exp(block_lse - m) (m the
// larger), acc = (acc w + block_out wb) / (w + wb) and lse = m + log(w + wb). Start from acc 0,
// lse -inf. acc and block_out [batch*seq, heads*head_dim]; lse and block_lse [batch, heads, seq].
template <typename T>
void attention_merge(T* acc, T* lse, const T* block_out, const T* block_lse, const AttentionShape& s);

// Decoding with a key/value cache: cache [seq, qkv_stride] holds the qkv rows of positions
// 0 .. seq-1 of one sequence (s.batch = 1); out [seq - first, heads*head_dim] receives the causal
// attention of the query rows first .. seq-1.
// s.window and sinks as in the forward.
template <typename T>
void attention_decode(const T* cache, int64_t first, T* out, const AttentionShape& s, const T* sinks = nullptr);

}  // namespace primus::cpu
