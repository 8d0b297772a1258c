// Per-head RMSNorm of the queries and keys (Megatron-Core's qk_layernorm, as Qwen3 uses it): every
// q head and every k group of a token is normalized over its head_dim values with one weight of
// head_dim values for all q heads (q_layernorm) and one for all k groups (k_layernorm), after the
// qkv projection and before RoPE. Values pass through unchanged.
//
// Written over the op set: the q block and the k block of each qkv row are copied out
// ([N, heads * D] -> [N * heads, D] rows), normalized by the backend's rmsnorm, and copied back,
// so every precision and device runs it. Under tensor parallelism a rank sees only its heads:
// the two weights' gradients are partial sums over tp (the trainer sums them, ParamStore's
// tp_partial_grads).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/norm_weight_grad.h"

namespace primus {

// What the B and W passes need: the rows before the norm, their rstd, and (after B) the gradient
// reaching the normalized rows.
struct QkNormContext {
  Tensor q, k, rstd_q, rstd_k;  // [N * heads, D], [N * groups, D], [N * heads], [N * groups]; B's alone
  NormWeightGrad gq, gk;        // the weights' gradients, from B (model/norm_weight_grad.h)
};

class QkNorm {
 public:
  QkNorm(ops::Backend& backend, DType activation, int64_t heads, int64_t groups, int64_t head_dim, float eps);

  // qkv [N, (heads + 2 groups) D]: its q heads and k groups normalized in place; c keeps the saves.
  void forward(Tensor& qkv, const Tensor& wq, const Tensor& wk, QkNormContext& c) const;
  // dqkv's q and k columns hold the gradients of the normalized rows: replaced by those of the
  // rows before the norm. With learned weights c keeps their gradients for backward_weight; the
  // forward's saves are let go either way.
  void backward_input(Tensor& dqkv, const Tensor& wq, const Tensor& wk, QkNormContext& c, bool learned) const;
  // gq, gk (head_dim, master dtype) += the weights' gradients.
  void backward_weight(QkNormContext& c, Tensor& gq, Tensor& gk) const;

 private:
  ops::Backend& be_;
  DType act_, stat_;
  int64_t heads_, groups_, D_;
  float eps_;
};

}  // namespace primus
