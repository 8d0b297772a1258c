// The GEMMs of one microbatch's training step of the Llama model (model/llama.h) in bf16 mixed
// precision on one tensor-parallel rank, as row-major problems D[m,n] = op(A) op(B) (+ C): what
// GEMM tuning times (`benchmark gemm --tune --shapes-from <config>`) and what the model then
// runs. N is micro_batch * seq rows (all of them: sequence parallelism gathers them before each
// linear), C hidden; Q the fused qkv width, QS the query width, F ffn and the vocabulary are this
// rank's shares (divided by tp).
//
//   per layer  forward   qkv     [N,Q]  = h1 Wqkv^T (+ bias)            NT  bf16
//                        proj    [N,C]  = x + attn Wo^T                 NT  bf16, residual
//                        fc1     [N,2F] = h2 W1^T                       NT  bf16
//                        fc2     [N,C]  = x2 + act W2^T                 NT  bf16, residual
//              B         fc2     [N,F]  = dy W2                         NN  bf16
//                        fc1     [N,C]  = dgate_up W1                   NN  bf16
//                        proj    [N,QS] = dx2 Wo                        NN  bf16
//                        qkv     [N,C]  = dqkv Wqkv                     NN  bf16
//              W         fc2     [C,F]  += dy^T act                     TN  fp32 accumulate
//                        fc1     [2F,C] += dgate_up^T h2                TN  fp32 accumulate
//                        proj    [C,QS] += dx2^T attn                   TN  fp32 accumulate
//                        qkv     [Q,C]  += dqkv^T h1                    TN  fp32 accumulate
//   head, per vocabulary chunk of vc columns (one chunk when the logits fit the budget):
//              forward   logits  [N,vc] = hn Wout[chunk]^T              NT  fp32
//              B         dhn     [N,C]  += s * dlogits Wout[chunk]      NN  fp32 accumulate
//              W         dWout   [vc,C] += s * dlogits^T hn             TN  fp32 accumulate
//   (chunked: the logits GEMM runs again in B and in W; recompute adds the forward GEMMs again.)
//
// Multi-latent attention (model/mla.h) replaces qkv by its projections, each [out, in] weight
// giving the three GEMMs forward [N,out,in], B [N,in,out], W [out,in,N]: linear_q_proj, or
// linear_q_down_proj and linear_q_up_proj; linear_kv_down_proj; linear_kv_up_proj (the up
// projections split over tp by heads, the down ones whole); proj's width is heads x v_head_dim.
//
// An MoE layer (model/moe.h) replaces fc1/fc2 by its router ([Nm,E,C], fp32 logits), the routed
// experts' GEMMs with balanced routing (each of this rank's E / ep experts gets ep x Nm x topk / E
// rows; the experts' ffn divided by etp), and the shared expert's. Nm: the rows the block routes
// (N, or N / tp under sequence parallelism with whole experts). The experts' forward and input
// gradients run as grouped GEMMs on the GPU (cuBLAS's grouped call, not cuBLASLt), their weight
// gradients one cuBLASLt GEMM per expert. Recompute does not rerun the MoE block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace primus {

struct LlamaGemm {
  std::string what;  // "layer qkv forward", "head logits", ...
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  bool f32_out = false;     // C and D fp32 (weight gradients, logits, dhn); else bf16
  bool bias = false;        // bf16 bias[n] on every row
  bool accumulate = false;  // C is read (beta = 1): a residual or the running sum
  int64_t count = 0;        // runs per microbatch (all layers, all chunks)
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(count); }
};

// The rank's place in the layout: tensor-parallel size (residual adds then leave the GEMMs), expert
// tensor- and expert-parallel sizes, and sequence parallelism (for the MoE block's rows).
struct GemmLayout {
  int tp = 1, etp = 1, ep = 1;
  bool sequence_parallel = false;
};

// vocab_chunk: the head's chunk width (>= the rank's vocabulary: one chunk, logits kept);
// recompute_forward: the block forward GEMMs run twice (full recompute).
std::vector<LlamaGemm> llama_gemms(const ModelSpec& spec, int64_t micro_batch, int64_t seq, int64_t vocab_chunk,
                                   bool recompute_forward = false, GemmLayout layout = {});

}  // namespace primus
