// The pipeline executor: runs one rank's op list of a Schedule (schedule.h) over a real model.
//
// The executor knows nothing of transformers. The model side implements StageRunner for the
// chunks this rank holds; the executor calls its F, B and W in the schedule's order and moves
// activations and gradients between ranks with the pipeline ProcessGroup: receives are posted
// early (irecv as soon as the buffer can be given), sends never block the next op (isend, waited
// for before the buffer is dropped). It measures, per rank, the time spent computing and the
// time spent waiting for a message (the measured bubble).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/process_group.h"
#include "pipeline/schedule.h"

namespace primus::pipeline {

class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Shape and dtype of every activation and gradient message between stages (the same for all
  // microbatches and stages: [rows, hidden]).
  virtual Shape message_shape() const = 0;
  virtual DType message_dtype() const { return DType::F32; }
  // F of (microbatch, chunk). `input` is the previous stage's activation, undefined on the first
  // stage (which reads its tokens itself). Returns the activation for the next stage; on the last
  // stage returns an undefined Tensor (it keeps its loss).
  virtual Tensor forward(int microbatch, int chunk, const Tensor& input) = 0;
  // B of (microbatch, chunk). `grad_output` is the next stage's input gradient, undefined on the
  // last stage (which starts from its loss). Returns the gradient for the previous stage;
  // undefined on the first stage.
  virtual Tensor backward_input(int microbatch, int chunk, const Tensor& grad_output) = 0;
  // W of (microbatch, chunk): accumulates weight gradients and frees the microbatch's context.
  virtual void backward_weight(int microbatch, int chunk) = 0;
};

struct ExecutorStats {
  double wall_s = 0;       // first op start to last op end (sends completed)
  double compute_s = 0;    // inside F/B/W
  double wait_s = 0;       // blocked on a receive or a send: wall - compute, the bubble
  // Mean seconds per op of each kind for one chunk (BW counts as one B and one W, split by the
  // runner's own timing of the two halves), for the simulator's prediction.
  double mean_f_s = 0, mean_b_s = 0, mean_w_s = 0;
  int64_t ops = 0, messages_sent = 0, messages_received = 0;
  double bubble_rate() const { return wall_s > 0 ? wait_s / wall_s : 0.0; }
};

// Runs schedule.ranks[pp_group.rank()] to the end. Collective over the pipeline group: every
// member must call it with the same schedule. Throws primus::Error when the schedule does not
// fit the group (pp != group size) or a message has the wrong size.
ExecutorStats run_schedule(const Schedule& schedule, StageRunner& runner, parallel::ProcessGroup& pp_group);

}  // namespace primus::pipeline
