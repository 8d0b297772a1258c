// Flash attention on the GPU, written in this project (FlashAttention-2's scheme): tiled over
// queries and keys with an online softmax, bf16 tensor cores (mma.sync), fp32 accumulation,
// causal masking, grouped-query attention, head dims 64 and 128. No S x S matrix is stored.
//
// The layout and results are those of the CPU kernel (kernels/cpu/attention.h), so the CPU
// kernel is this one's reference:
//   qkv  [batch*seq, (heads + 2*groups) * head_dim] bf16, one fused row per token:
//        [ q: heads*head_dim | k: groups*head_dim | v: groups*head_dim ]
//   out  [batch*seq, heads*head_dim] bf16
//   lse  [batch, heads, seq] fp32: natural log of sum_j exp(s_ij), s = q.k / sqrt(head_dim)
// Head h reads key/value group h / (heads / groups).
//
// Implementation: flash_attention_fwd.cu and flash_attention_bwd.cu (their tile choices and the
// fragment layouts they rely on are described there and in flash_attention_common.cuh).
// Requirements and guarantees:
//  * qkv, out, dout and dqkv 16-byte aligned (any cudaMalloc / caching-allocator buffer is).
//  * Every kernel runs on `stream` and nothing synchronises. The backward's scratch memory comes
//    from the caching allocator, whose reuse is ordered on the compute stream: pass
//    cuda::stream() (or make sure nothing else reuses freed blocks meanwhile).
//  * Any seq >= 1 (tails are masked), any batch, heads divisible by groups, head_dim 64 or 128.
//  * The forward is deterministic; in the backward, dK and dV are too (each key tile's sums run
//    in one CTA in a fixed order), while dQ is summed with fp32 atomics across key tiles, so its
//    last bits can vary from run to run.
//  * As in FlashAttention-2, probabilities are rounded to bf16 as the operand of P V (forward)
//    and of dV, dS (backward); all sums are fp32.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace primus::cuda {

// doc_start (device, int32 [batch * seq]) and key_pos0: documents packed into the sequences, as
// kernels/cpu/attention.h's Documents (query row t sees key s only when key_pos0 + s >= doc_start
// of t; non-decreasing within a sequence); null: none. The forward starts each CTA at the key tile
// of its first row's document and the backward ends each key tile's query loop at the last row
// whose document has begun, so packed attention skips the tiles between documents.
// window (kernels/cpu/attention.h): query t sees keys t - window .. t alone (negative: none); the
// forward starts each CTA at its first row's first key tile and the backward ends each key tile's
// query loop at the last row that sees it. sinks (device, fp32 [heads], or null): gpt-oss's
// per-head logits in the softmax denominator (kernels/cpu/attention.h); the forward starts its
// online softmax from them, so lse holds them. The ring's block calls take neither (the backend
// refuses them).
struct AttentionDims {
  int64_t batch = 0, seq = 0, heads = 0, groups = 0, head_dim = 0;
  const int32_t* doc_start = nullptr;
  int64_t key_pos0 = 0;
  int64_t window = -1;
  const float* sinks = nullptr;
  int64_t qkv_stride() const { return (heads + 2 * groups) * head_dim; }
};

// "" when flash_attention_* can run these dims, else the reason (e.g. head dim 96).
std::string flash_attention_unsupported(const AttentionDims& d);

void flash_attention_forward(const __nv_bfloat16* qkv, __nv_bfloat16* out, float* lse, const AttentionDims& d,
                             bool causal, cudaStream_t stream);

// dqkv is overwritten with the gradients of q, k and v in the fused layout. Uses scratch memory
// from the caching allocator (runtime.h).
void flash_attention_backward(const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              const __nv_bfloat16* dout, __nv_bfloat16* dqkv, const AttentionDims& d, bool causal,
                              cudaStream_t stream);

// Context parallelism (ops::Backend::attention_block_*, layouts in kernels/cpu/attention.h): the
// same kernels with the keys and values of another block, kv [batch*seq, 2*groups*head_dim] bf16
// ([k | v] per row), the queries from the fused qkv rows; q and kv blocks have d.seq rows per
// sequence. causal: the diagonal block; else every key is seen.
void flash_attention_block_forward(const __nv_bfloat16* qkv, const __nv_bfloat16* kv, __nv_bfloat16* out,
                                   float* lse, const AttentionDims& d, bool causal, cudaStream_t stream);
// With the MERGED out and lse: dq_acc [batch*seq, heads*head_dim] += dq (fp32 atomics) and
// dkv_acc [batch*seq, 2*groups*head_dim] += [dk | dv] (fp32, each key's rows by one CTA).
void flash_attention_block_backward(const __nv_bfloat16* qkv, const __nv_bfloat16* kv, const __nv_bfloat16* out,
                                    const float* lse, const __nv_bfloat16* dout, float* dq_acc, float* dkv_acc,
                                    const AttentionDims& d, bool causal, cudaStream_t stream);
// The sinks' gradient (ops::Backend::attention_sink_backward): dsinks [heads] (fp32) += -sum over
// rows of exp(sinks[h] - lse) * rowsum(dout * out); one CTA per head, a fixed summation order
// (attention_merge.cu).
void attention_sink_backward(const __nv_bfloat16* out, const float* lse, const __nv_bfloat16* dout,
                             const float* sinks, float* dsinks, const AttentionDims& d, cudaStream_t stream);
// Folds a block's out (bf16) and lse into the running fp32 acc and lse (attention_merge.cu).
void attention_merge(float* acc, float* lse, const __nv_bfloat16* block_out, const float* block_lse,
                     const AttentionDims& d, cudaStream_t stream);

// Causal attention FLOPs as benchmarks count them: 4*b*h*s*s*d forward (halved when causal),
// 2.5x that backward.
inline double attention_forward_flops(const AttentionDims& d, bool causal) {
  return 4.0 * double(d.batch) * double(d.heads) * double(d.seq) * double(d.seq) * double(d.head_dim) *
         (causal ? 0.5 : 1.0);
}

// Decoding with a key/value cache (ops::Backend::attention_decode): cache [seq, qkv_stride] bf16
// holds the rotated qkv rows of positions 0 .. seq-1 of one sequence (d.batch = 1); out [seq -
// first, heads*head_dim] bf16 receives the causal attention of the queries of rows first .. seq-1.
// One CTA per (query row, head): its warps take keys in turn with an online softmax each, then
// merge; fp32 throughout. head_dim a multiple of 32, at most 256 (attention_decode.cu).
std::string attention_decode_unsupported(const AttentionDims& d);
void attention_decode(const __nv_bfloat16* cache, int64_t first, __nv_bfloat16* out, const AttentionDims& d,
                      cudaStream_t stream);

}  // namespace primus::cuda
