// The Llama model as a pipeline stage: the executor's StageRunner over LlamaModel's chunk passes,
// and a forward-only pass through the stages for evaluation. The bubble these runs leave is
// measured and simulated in pipeline/bubble.h.
#pragma once

#include <functional>
#include <map>
#include <vector>

#include "data/microbatch.h"
#include "model/llama.h"
#include "pipeline/executor.h"

namespace primus::train {

// Fills this rank's microbatch `m` of the step: tokens, targets [mbs, seq] and packed documents
// (the data loader's, data/microbatch.h).
using data::MicrobatchFill;

class LlamaStageRunner final : public pipeline::StageRunner {
 public:
  // dloss: 1 / microbatches of the global batch (see the trainer's loss convention).
  LlamaStageRunner(LlamaModel& model, int64_t mbs, int64_t seq, double dloss, MicrobatchFill fill);
  Shape message_shape() const override;
  DType message_dtype() const override { return model_.activation_dtype(); }
  Tensor forward(int microbatch, int chunk, const Tensor& input) override;
  Tensor backward_input(int microbatch, int chunk, const Tensor& grad_output) override;
  void backward_weight(int microbatch, int chunk) override;
  double loss_sum() const { return loss_sum_; }  // over the microbatches whose loss this rank computed
  size_t live_contexts() const { return ctx_.size(); }
  // The most tensor bytes (the backend's count) held at the end of any of this runner's passes
  // beyond those held when it was made: what the microbatches in flight keep between their passes
  // (with the messages the executor holds), the quantity the simulator's peak activations count.
  double peak_held_bytes() const { return peak_held_; }

 private:
  LlamaContext& context(int microbatch);
  void note_held();
  double base_ = 0, peak_held_ = 0;
  LlamaModel& model_;
  int64_t mbs_, seq_;
  double dloss_;
  MicrobatchFill fill_;
  struct Live {
    LlamaContext ctx;
    int weights_done = 0;
  };
  std::map<int, Live> ctx_;  // microbatches in flight on this rank
  double loss_sum_ = 0;
};

// Forward only (evaluation): every microbatch through the stages in model order, activations
// passed with the pipeline group. Returns the summed loss of `microbatches` microbatches on every
// member of the group. Collective over pp_group.
double pipeline_forward_only(LlamaModel& model, const pipeline::Schedule& schedule,
                             parallel::ProcessGroup& pp_group, int64_t mbs, int64_t seq, int microbatches,
                             const MicrobatchFill& fill);

}  // namespace primus::train
