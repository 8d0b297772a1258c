#include "train/pipeline_runner.h"

#include <algorithm>

#include "core/error.h"

namespace primus::train {

LlamaStageRunner::LlamaStageRunner(LlamaModel& model, int64_t mbs, int64_t seq, double dloss, MicrobatchFill fill)
    : model_(model), mbs_(mbs), seq_(seq), dloss_(dloss), fill_(std::move(fill)) {
  base_ = double(model_.backend().memory_stats().in_use);
}

void LlamaStageRunner::note_held() {
  peak_held_ = std::max(peak_held_, double(model_.backend().memory_stats().in_use) - base_);
}

Shape LlamaStageRunner::message_shape() const {
  return {model_.activation_rows(mbs_, seq_), model_.spec().hidden_size};
}

// A microbatch's context is shared by the chunks of this rank (a V-shape rank runs chunk 0 and
// chunk 1 of the same microbatch); it is made at the microbatch's first F here and dropped after
// its last W.
LlamaContext& LlamaStageRunner::context(int microbatch) {
  auto it = ctx_.find(microbatch);
  if (it != ctx_.end()) return it->second.ctx;
  data::Microbatch mb;
  fill_(microbatch, mb);
  Live& live = ctx_[microbatch];
  model_.begin_microbatch(live.ctx, mb.tokens.data(), mb.targets.data(), mbs_, seq_, &mb.docs);
  return live.ctx;
}

Tensor LlamaStageRunner::forward(int microbatch, int chunk, const Tensor& input) {
  LlamaContext& ctx = context(microbatch);
  Tensor out = model_.forward_chunk(ctx, chunk, input);
  if (model_.partition().chunks[chunk].has_head) loss_sum_ += ctx.loss;
  note_held();
  return out;
}

Tensor LlamaStageRunner::backward_input(int microbatch, int chunk, const Tensor& grad_output) {
  auto it = ctx_.find(microbatch);
  if (it == ctx_.end()) fail("pipeline: B of microbatch {} chunk {} before its F", microbatch, chunk);
  Tensor dx = model_.backward_input_chunk(it->second.ctx, chunk, grad_output, dloss_);
  note_held();
  return dx;
}

void LlamaStageRunner::backward_weight(int microbatch, int chunk) {
  auto it = ctx_.find(microbatch);
  if (it == ctx_.end()) fail("pipeline: W of microbatch {} chunk {} before its F", microbatch, chunk);
  model_.backward_weight_chunk(it->second.ctx, chunk);
  if (++it->second.weights_done == model_.num_chunks()) ctx_.erase(it);
  note_held();
}

double pipeline_forward_only(LlamaModel& model, const pipeline::Schedule& schedule,
                             parallel::ProcessGroup& pp_group, int64_t mbs, int64_t seq, int microbatches,
                             const MicrobatchFill& fill) {
  const int me = pp_group.rank(), S = schedule.num_stages();
  const Shape shape = {model.activation_rows(mbs, seq), model.spec().hidden_size};
  double loss = 0;
  data::Microbatch mb;
  for (int m = 0; m < microbatches; ++m) {
    LlamaContext ctx;
    bool begun = false;
    Tensor x;
    std::vector<parallel::WorkPtr> sends;
    // Every rank walks all stages in order and acts on its own: a stage's input comes from the
    // previous stage's rank, which sent it earlier in the same walk, so nothing can wait in a cycle.
    for (int s = 0; s < S; ++s) {
      if (schedule.rank_of_stage(s) != me) continue;
      if (!begun) {
        fill(m, mb);
        model.begin_microbatch(ctx, mb.tokens.data(), mb.targets.data(), mbs, seq, &mb.docs);
        begun = true;
      }
      if (s > 0 && schedule.rank_of_stage(s - 1) != me) {
        x = Tensor::empty(shape, model.activation_dtype(), pp_group.device());
        pp_group.irecv(x, schedule.rank_of_stage(s - 1), s)->wait();
      }
      x = model.forward_chunk(ctx, schedule.chunk_of_stage(s), x);
      if (s == S - 1) loss += ctx.loss;
      if (s + 1 < S && schedule.rank_of_stage(s + 1) != me) sends.push_back(pp_group.isend(x, schedule.rank_of_stage(s + 1), s + 1));
    }
    parallel::wait_all(sends);
  }
  return pp_group.all_reduce_value(loss);
}

}  // namespace primus::train
