// Multi-head latent attention (DeepSeek-V2/V3, Megatron-Core's
// MLASelfAttention), per token row:
//
//   queries   q  = h Wq^T                      (q_lora_rank null:
//   linear_q_proj)
//             q  = norm_q(h Wqd^T) Wqu^T       (linear_q_down_proj,
//             q_layernorm, linear_q_up_proj)
//   latent    [c | kr] = h Wkvd^T              (linear_kv_down_proj:
//   kv_lora_rank + qk_pos_emb_head_dim)
//             kv = norm_kv(c) Wkvu^T           (kv_layernorm,
//             linear_kv_up_proj)
//   per head  q_h = [q_nope | rope(q_rope)]    qk_head_dim +
//   qk_pos_emb_head_dim
//             k_h = [k_nope_h | rope(kr)]      the rotary key kr is shared by
//             every head v_h                              v_head_dim
//   attention softmax(q_h k_h^T * scale) v_h, scale = 1/sqrt(qk_head_dim +
//   qk_pos_emb_head_dim),
//             times mscale(factor, mscale_all_dim)^2 under YaRN
//             (rotary_scaling_factor > 1).
// The norms exist when qk_layernorm is set (as in Megatron's layer specs).
//
// Written over the op set without a kernel of its own: the heads are packed
// into the attention op's fused qkv layout with groups = heads and a head width
// W = max(qk dims, v_head_dim), the short parts zero-padded (zero columns
// change no dot product and give zero output columns); the op's 1/sqrt(W) is
// corrected, with YaRN's factor, by scaling q in its projection's GEMM.
//
// Tensor parallel (Megatron-Core's split): linear_q_proj / linear_q_up_proj and
// linear_kv_up_proj are column-parallel, each rank holding heads / tp whole
// heads (their rows are head-major); linear_q_down_proj, linear_kv_down_proj
// and the two latent norms are replicated, run on all rows by every rank. A
// rank's backward then sees only its heads: the latents' gradients, hence the
// replicated tensors' gradients and dh1, are partial sums over tp (the caller
// reduces dh1 like a column-parallel linear's; the trainer sums the weights',
// ParamStore's tp_partial_grads).
//
// Context parallel: the rank's rows are its two chunks of every sequence (see
// model/context_parallel.h), each rotated at its own positions; the packed heads
// go through the model's context-parallel attention (ring or all-to-all) like
// standard attention's, with groups = heads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/norm_weight_grad.h"
#include "model/linears.h"
#include "model/model_spec.h"
#include "model/param_store.h"
#include "model/rope.h"

namespace primus {

// The parameter ids of one MLA block (-1: absent).
struct MlaParams {
  int q_proj = -1, q_down = -1, q_norm = -1, q_up = -1, kv_down = -1, kv_norm = -1, kv_up = -1;
  std::vector<int> ids() const;
};
// Registers them in Megatron-Core's order and names (model_parameter_layout's):
// the head-split tensors as tp_rank's shard of tp_size, the rest whole.
MlaParams register_mla_params(ParamStore& params, const ModelSpec& spec, int64_t layer, int tp_size = 1,
                              int tp_rank = 0);

// YaRN (model/rope.h, Yarn: DeepSeek's, Megatron's YarnRotaryEmbedding) when
// s.rotary_scaling_factor > 1, else plain rotary: cos and sin [positions,
// qk_pos_emb_head_dim / 2], the concentration folded into both.
void mla_rope_tables(const ModelSpec& s, int64_t positions, double* cos, double* sin);

// What the B and W passes need.
struct MlaContext {
  Tensor cq, rstd_q, cqn;                // q latent [N, q_lora_rank], its rstd, its norm (or cq)
  Tensor c, rstd_kv, cn;                 // kv latent [N, kv_lora_rank], its rstd, its norm
  Tensor out;                            // the attention core's padded output [N, heads * W]
                                         // (heads: this rank's)
  Tensor dq, dcq, dkv, dckv;             // B-pass gradients the W pass reads
  NormWeightGrad gq_norm, gkv_norm;      // the latent norms' weight gradients, from B
};

class Mla {
 public:
  using Weights = std::function<Tensor(int)>;
  // tp_size: the ranks the heads are split over (heads divisible by it);
  // cp_size, cp_rank: this rank's chunks of each sequence (rope positions).
  // linears: where the projections' GEMMs run (model/linears.h).
  Mla(ops::Backend& backend, DType activation, const ModelSpec& spec, const Linears& linears, int tp_size = 1,
      int cp_size = 1, int cp_rank = 0);

  // Width of a packed row ([q | k | v] of every head) and the attention op's
  // shape.
  int64_t packed_width() const { return 3 * H_ * W_; }
  ops::AttentionShape shape(int64_t batch, int64_t seq) const { return {batch, seq, H_, H_, W_}; }

  // h1 [N, C] -> the packed, rotated qkv [N, packed_width]; row r at position
  // pos0 + r % seq, or at positions[r] when given (packed documents: model/rope.h).
  Tensor forward(const MlaParams& p, MlaContext& c, const Tensor& h1, int64_t seq, int64_t pos0,
                 const Weights& w, const std::vector<int32_t>* positions = nullptr) const;
  // The attention output [N, heads * v_head_dim] (linear_proj's input) of
  // packed out.
  Tensor values(const Tensor& out) const;
  // The gradient of the packed out [N, heads * W] from that of values(out).
  Tensor values_grad(const Tensor& dattn) const;
  // dqkv (the packed qkv's gradient, from the attention core) -> dh1 [N, C]
  // (through rope and the projections); keeps what backward_weight needs in c.
  // Under tp, dh1 is this rank's heads' part: the caller sums it over tp.
  Tensor backward_input(const MlaParams& p, MlaContext& c, const Tensor& dqkv, int64_t seq, const Weights& w,
                        const std::vector<int32_t>* positions = nullptr) const;
  // Accumulates every MLA weight's gradient (h1: the block's normed input).
  void backward_weight(const MlaParams& p, MlaContext& c, const Tensor& h1, const Weights& g) const;

 private:
  Tensor act(const Shape& s) const { return be_.empty(s, act_); }
  Tensor norm(const Tensor& x, int weight, Tensor& rstd, const Weights& w) const;

  ops::Backend& be_;
  const Linears& lin_;
  DType act_, stat_;
  int64_t C_, H_, dn_, dr_, dv_, Dq_, W_, Rq_, R_;  // H_: this rank's heads
  float eps_,
      q_alpha_;                   // q's factor: the softmax scale the op's 1/sqrt(W) lacks
  std::unique_ptr<Rotary> rope_;  // [positions, dr / 2] tables
};

}  // namespace primus
