// The mixture-of-experts block that replaces a decoder layer's MLP (Megatron-Core's MoELayer):
//
//   logits = h Wr^T            the router's GEMM on the backend, decided on the host (router.h)
//   xp     = permute(h)        token rows sorted by expert, one per kept (token, expert) choice
//                              (moe_apply_probs_on_input: each times its weight, and unpermute unweighted)
//   yp_e   = swiglu(xp_e W1_e^T) W2_e^T     each expert over its rows: grouped GEMMs over row slices
//   out    = residual + unpermute(yp, weights) + shared(h)   (shared: a dense SwiGLU, optionally
//            gated by sigmoid(h g^T))
//
// Written once over the op set, like the rest of the model: every precision and backend. The
// losses of the router (aux / seq-aux / z) enter the objective with the same scale as the LM loss
// of the microbatch; their values are reported per layer in MoeStats.
//
// Expert tensor parallelism (expert_tensor_parallel_size = tp > 1, Megatron's default): every
// expert's fc1 rows (its gate and up halves) and fc2 columns are split over the tp ranks as the
// dense MLP's, and so is the shared expert. Each tp rank then routes all the microbatch's rows
// (gathered first under sequence parallelism), and every rank of the tp group computes the same
// routing from the same logits. Its experts give partial sums of every output row; they are
// combined, summed over tp (all-reduce, or reduce-scatter to this rank's rows), and only then
// added to the residual. Backward, the combine weights' and the shared gate's gradients are dot
// products with those partial outputs, summed over tp; the input gradient's expert part is summed
// like the output, and the router's part (the same on every tp rank) is added after the sum, for
// this rank's rows only. The router's weight gradient is taken over this rank's rows too, so that
// under sequence parallelism it is summed over tp like every replicated tensor's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/linears.h"
#include "model/model_spec.h"
#include "model/param_store.h"
#include "model/router.h"
#include "model/tensor_parallel_rows.h"
#include "model/token_dispatch.h"

namespace primus {

// Parameter ids of one MoE block in a ParamStore, under Megatron-Core's names with the global
// expert index (decoder.layers.L.mlp.experts.local_experts.E.linear_fc1.weight).
struct MoeParams {
  int64_t layer = -1;  // the decoder layer
  int router = -1, expert_bias = -1;
  int router_b = -1;          // add_bias_linear: the router's bias
  std::vector<int> fc1, fc2;  // per global expert; -1 for the experts other ep ranks hold
  std::vector<int> fc1_b, fc2_b;  // add_bias_linear: their biases (empty without)
  int shared_fc1 = -1, shared_fc2 = -1, shared_gate = -1;
  // All of them, for the weight-gradient hook (the expert bias's gradient is final, and 0, too).
  std::vector<int> ids() const;
};
// Under expert parallelism only this ep rank's experts (ep_rank*L .. ep_rank*L+L-1, L = E / ep);
// under expert tensor parallelism their (and the shared expert's) tp shards, as the dense MLP's.
MoeParams register_moe_params(ParamStore& params, const ModelSpec& spec, int64_t layer, int ep_rank = 0,
                              int ep_size = 1, int etp_size = 1, int etp_rank = 0);
// The MLPs' gated linear unit of the spec (quick_geglu, glu_linear_offset,
// activation_func_clamp_value): every MLP of the model uses it, dense, routed and shared.
ops::Glu glu_of(const ModelSpec& spec);
// A routed expert's tensor (its gradient is reduced over the expert-data-parallel group).
bool is_expert_param(const std::string& name);

// What the model's MoE blocks do not run with yet; throws naming the setting. sp_ranks: the ranks
// that split each microbatch's tokens (tensor_model_parallel_size under sequence parallelism,
// times context_parallel_size).
void check_moe_supported(const ModelSpec& spec, int sp_ranks);

// expert_tensor_parallel_size: 1 (whole experts on every tp rank) or tp (each expert's ffn and the
// shared expert's split over the tp group), dividing both ffns; throws naming the sizes otherwise.
// The layout planner and the MoE block both call it.
void check_expert_tensor_parallel(const ModelSpec& spec, int tp_size, int etp_size);

// The ranks over which a microbatch's routed tokens are split, each routing its own: cp, times tp
// under sequence parallelism with whole experts (split experts gather every row on every tp rank).
int moe_routing_ranks(bool sequence_parallel, int tp_size, int etp_size, int cp_size);

// What one MoE block reports for one microbatch.
struct MoeStats {
  std::vector<int64_t> tokens_per_expert;  // kept assignments per expert
  int64_t dropped = 0;
  double aux_loss = 0, z_loss = 0;
};

struct MoeContext {
  Routing routing;
  std::vector<int32_t> rows;       // per permuted row: its token row
  std::vector<int64_t> slot;       // per permuted row: its index into routing's [tokens, topk]
  std::vector<int64_t> token_offsets;  // per expert: first permuted row (num_experts + 1 entries)
  std::vector<int64_t> offsets;    // the same on the expert side (token_offsets without expert parallelism)
  DispatchPlan plan;               // expert parallelism: the exchange of this microbatch
  Tensor yt;                       // the experts' outputs back on the token side (yp without ep)
  std::vector<double> weights;     // per permuted row: its combine weight
  Tensor h, xp, gu, act, yp;       // forward saves (h: the block's normed input, all rows; xp..yp expert side)
  Tensor h_local;                  // this rank's rows of h (h itself unless split experts gathered it)
  Tensor sgu, sact, sout;          // shared expert
  std::vector<double> gate;        // shared expert gate per token (sigmoid), if gated
  Tensor dy, dgu, dsgu, dy_shared;  // B-pass outputs the W pass needs (all rows)
  Tensor dlogits;                  // the router logits' gradient, h_local's rows
  std::vector<double> dgate;       // d(gate logit) per token of h_local
  double loss_scale = 1.0;         // the microbatch's dloss, for the router's losses
};

class MoeLayer {
 public:
  using Weights = std::function<Tensor(int)>;  // id -> working weight (or gradient), shaped
  // dispatcher: expert parallelism (token_dispatch.h); null when this rank holds every expert.
  // share: sequence or context parallelism, each rank routes its own tokens (router.h).
  // expert_tp: the tp group when the experts are split over it (expert_tensor_parallel_size > 1).
  // linears: where the experts' and the shared expert's GEMMs run (model/linears.h: FP8 or not).
  MoeLayer(const ModelSpec& spec, ops::Backend& backend, DType activation, MoeParams params, const Linears& linears,
           std::shared_ptr<const TokenDispatcher> dispatcher = nullptr, TokenShare share = {},
           TensorParallelRows expert_tp = {});

  // out = residual + moe(h); h, residual [N, C] with N = batch * seq (/ share.ranks: this rank's;
  // under sequence parallelism with split experts, this rank's tp share of them).
  Tensor forward(MoeContext& c, const Tensor& h, const Tensor& residual, const Weights& w,
                 const std::vector<double>& expert_bias, int64_t batch, int64_t seq) const;
  // The gradient of h (not including the residual path) from dy, the gradient of out.
  Tensor backward_input(MoeContext& c, const Tensor& dy, const Weights& w) const;
  void backward_weight(MoeContext& c, const Weights& grad) const;
  static MoeStats stats(const MoeContext& c);
  const MoeParams& params() const { return p_; }

 private:
  Tensor empty(const Shape& s) const { return be_.empty(s, act_); }
  void check_same_routing(const MoeContext& c) const;  // split experts: collective over tp
  void sum_over_expert_tp(std::vector<double>& v) const;  // split experts' partial dot products
  // The combine weights where they apply (moe_apply_probs_on_input: on the experts' input rows,
  // else on their output rows); empty vectors where they do not.
  const std::vector<double>& input_weights(const MoeContext& c) const;
  const std::vector<double>& output_weights(const MoeContext& c) const;
  void add_expert_biases(Tensor& rows, const std::vector<int64_t>& offsets, const std::vector<int>& ids,
                         const Weights& w) const;
  ModelSpec spec_;
  ops::Glu glu_ = glu_of(spec_);  // the experts' and the shared expert's
  // The experts' GEMMs of one kind as one grouped GEMM over the experts with rows: problem e is
  // operands(expert, first permuted row, rows) = [A_e, B_e, D_e] and the expert's weight id.
  template <typename F>
  void experts(Linears::Gemm kind, const std::vector<int64_t>& offsets, F&& operands) const;

  ops::Backend& be_;
  const Linears& lin_;
  DType act_, stat_;
  MoeParams p_;
  std::shared_ptr<const TokenDispatcher> ep_;
  TokenShare share_;
  TensorParallelRows etp_;
};

}  // namespace primus
