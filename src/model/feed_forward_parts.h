// The feed-forward parts of a decoder block (model/block_part.h), y = x2 + feed_forward(norm(x2)):
//
//   SwiGluMlp        linear_fc1 (column-parallel: this rank's gate rows, then its up rows), SwiGLU,
//                    linear_fc2 (row-parallel)
//   MoeFeedForward   the mixture of experts (model/moe.h): router, token dispatch, experts, shared
//                    expert; its routing statistics; its saves outlive recompute (the block reruns
//                    around it)
//
// FeedForwardParts builds them layer by layer (moe_layer_freq picks which) and holds what the MoE
// layers share: the expert-parallel dispatcher, the routers' token share and the experts' tp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/block_part.h"
#include "model/moe.h"
#include "model/param_store.h"

namespace primus {

// One MoE block's statistics summed since the last reset: tokens per expert over the
// microbatches' forwards, dropped assignments, aux and z losses.
struct MoeLayerStats {
  int64_t layer = 0;
  std::vector<int64_t> tokens_per_expert;
  int64_t dropped = 0, forwards = 0;
  double aux_loss = 0, z_loss = 0;
};

class MoeFeedForward;

class FeedForwardParts {
 public:
  // Checks the layout's MoE rules (expert tensor parallel, the routers' token share) and builds
  // the shared dispatcher.
  explicit FeedForwardParts(const PartKit& kit);
  ~FeedForwardParts();
  // Registers layer `layer`'s feed-forward parameters in `params` and returns its part.
  std::unique_ptr<BlockPart> make(ParamStore& params, int64_t layer);
  // The MoE parts made so far, in layer order.
  const std::vector<MoeFeedForward*>& moe() const { return moe_; }

 private:
  const PartKit& kit_;
  std::shared_ptr<const TokenDispatcher> dispatcher_;  // every MoE block's, under expert parallelism
  TokenShare share_;
  TensorParallelRows expert_tp_;
  std::vector<MoeFeedForward*> moe_;
};

class MoeFeedForward final : public BlockPart {
 public:
  MoeFeedForward(const PartKit& kit, ParamStore& params, int64_t layer,
                 std::shared_ptr<const TokenDispatcher> dispatcher, const TokenShare& share,
                 const TensorParallelRows& expert_tp);
  std::vector<int> param_ids() const override { return layer_.params().ids(); }
  std::unique_ptr<PartContext> new_context() const override;
  Tensor forward(PartContext& c, const Tensor& h, const Tensor& residual, const PassShape& m,
                 bool want_output) override;
  void drop(PartContext&, Recompute) const override {}  // its routing and dispatched rows stay
  Tensor backward_input(PartContext& c, const Tensor& dy, const PassShape& m) override;
  void backward_weight(PartContext& c) override;
  Tensor decode(Tensor& cache, const Tensor& h, const Tensor& residual, int64_t pos0) const override;

  const MoeLayerStats& stats() const { return stats_; }
  void reset_stats();
  // The aux-loss-free balancing step: the expert bias (master values) moves by
  // moe_router_bias_update_rate against `tokens`, the load per expert.
  void update_expert_bias(const std::vector<int64_t>& tokens);

 private:
  std::vector<double> expert_bias() const;  // the master values, not a bf16 copy

  const PartKit& k_;
  MoeLayer layer_;
  MoeLayerStats stats_;
  MoeLayer::Weights weights_, grads_;
};

}  // namespace primus
