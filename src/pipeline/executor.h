// The pipeline executor: runs one rank's op list of a Schedule (schedule.h) over a real model.
//
// The executor knows nothing of transformers. The model side implements StageRunner for the
// chunks this rank holds; the executor calls its F, B and W in the schedule's order and moves
// activations and gradients between ranks with the pipeline ProcessGroup: receives are posted
// early (irecv of the next few ops that need one, while the current op computes), sends never
// block the next op (isend; completed sends are reaped as the run goes and the rest waited for
// at the end). When the neighbouring stage lives on the same rank (the V-shape turn at rank pp-1,
// or every hop when pp = 1) the tensor is handed over in memory. It measures, per rank, the time
// spent computing and the time spent waiting (the measured bubble).
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
  // microbatches and stages: [rows, hidden]). Every rank of the pipeline group must agree;
  // run_schedule checks this before any transfer.
  virtual Shape message_shape() const = 0;
  virtual DType message_dtype() const { return DType::F32; }
  // F of (microbatch, chunk). `input` is the previous stage's activation, undefined on the first
  // stage (which reads its tokens itself). Returns the activation for the next stage; on the last
  // stage returns an undefined Tensor (it keeps its loss).
  // Tensors passed in and returned belong to the executor's transfers: a runner may keep them
  // (e.g. as saved inputs) but must not write into them, and must not reuse a returned tensor's
  // storage for a later result (a send may still be reading it).
  virtual Tensor forward(int microbatch, int chunk, const Tensor& input) = 0;
  // B of (microbatch, chunk). `grad_output` is the next stage's input gradient, undefined on the
  // last stage (which starts from its loss). Returns the gradient for the previous stage;
  // undefined on the first stage.
  virtual Tensor backward_input(int microbatch, int chunk, const Tensor& grad_output) = 0;
  // W of (microbatch, chunk): accumulates weight gradients and frees the microbatch's context.
  virtual void backward_weight(int microbatch, int chunk) = 0;

  // DualPipe's F&B (Op::overlap_next): the forward of (f_microbatch, f_chunk) and the backward
  // of (b_microbatch, b_chunk), a different chunk, as one unit, so that a model can overlap the
  // two passes' computation and communication. `with_weight`: the backward is a fused BW (its W
  // runs inside the unit too). Returns what forward and backward_input would (either undefined
  // where they return nothing), under the same tensor rules. The default runs forward,
  // backward_input and, with_weight, backward_weight one after the other.
  struct Overlapped {
    Tensor activation;  // the forward's result
    Tensor input_grad;  // the backward's input gradient
  };
  virtual Overlapped overlapped_forward_backward(int f_microbatch, int f_chunk, const Tensor& input,
                                                 int b_microbatch, int b_chunk, const Tensor& grad_output,
                                                 bool with_weight);
};

struct ExecutorOptions {
  // How many upcoming receives are kept posted (irecv) ahead of the op that needs them; each
  // holds one message buffer. At least 1 (the next receive is always posted before it is needed).
  int recv_ahead = 4;
  // Keep a per-op timeline in ExecutorStats::timeline (for traces and the simulator comparison).
  bool record_timeline = false;
};

// One op as it ran on this rank; times in seconds from the start of run_schedule's first op.
// The two ops of an overlapped pair have the same compute interval.
struct OpRecord {
  OpType type = OpType::F;
  int microbatch = 0;
  int chunk = 0;
  double start_s = 0;     // the op began waiting for its input
  double compute_start_s = 0;  // when the runner was called (after the input arrived)
  double end_s = 0;       // the runner returned and the result was sent or handed over
};

struct ExecutorStats {
  double wall_s = 0;       // first op start to last op end (sends completed)
  double compute_s = 0;    // inside F/B/W
  double wait_s = 0;       // wall - compute: blocked on a receive or a send, the bubble
  double recv_wait_s = 0;  // of which blocked in a receive's wait
  // Mean seconds per op of each kind for one chunk (BW counts as one B and one W, each half
  // timed on its own), for the simulator's prediction. Ops inside overlapped pairs are not in
  // these: a pair is timed as a whole (mean_pair_s, pairs).
  double mean_f_s = 0, mean_b_s = 0, mean_w_s = 0, mean_pair_s = 0;
  int64_t ops = 0, pairs = 0, messages_sent = 0, messages_received = 0;
  std::vector<OpRecord> timeline;  // filled when ExecutorOptions::record_timeline
  double bubble_rate() const { return wall_s > 0 ? wait_s / wall_s : 0.0; }
};

// The tag of one transfer: unique per (microbatch, receiving stage, direction) within a run,
//   tag = (microbatch * num_stages + stage) * 2 + (direction == Gradient)
// so receives posted out of order still match the right message.
int transfer_tag(const Schedule& schedule, const P2P& transfer);
// MPI guarantees tags up to 32767 (MPI_TAG_UB may be larger, but not portably).
constexpr int kMaxPipelineTag = 32767;

// Runs schedule.ranks[pp_group.rank()] to the end. Collective over the pipeline group: every
// member must call it with the same schedule. Throws primus::Error, on every rank alike and
// before any transfer, when the schedule does not fit the group (pp != group size), its tags
// would pass kMaxPipelineTag, or the ranks disagree on the schedule or the message shape; and on
// the rank concerned when the runner returns a tensor of the wrong shape or dtype, or a received
// message has the wrong size.
ExecutorStats run_schedule(const Schedule& schedule, StageRunner& runner,
                           parallel::ProcessGroup& pp_group, const ExecutorOptions& options = {});

}  // namespace primus::pipeline
