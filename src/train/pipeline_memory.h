// A pipeline rank's activation memory in training against the simulator's prediction: what the
// microbatches in flight hold between their passes (LlamaStageRunner::peak_held_bytes, the
// backend's count of tensor bytes), and what pipeline/simulator.h predicts for the schedule, its
// stage costs and the model's M_W / M_B (plan::ParallelLayout::activation_after_b): its peak
// activations (in microbatch activations of one stage) times the bytes one microbatch keeps after
// this rank's F passes (its chunks walked on the shape-only backend, plan/model_walk.h, with the
// microbatch's token ids). docs/pipeline_schedules.md shows the two for ZB-2p.
#pragma once

#include <algorithm>
#include <vector>

#include "config/experiment.h"
#include "model/llama.h"
#include "model/model_spec.h"
#include "parallel/process_group.h"
#include "plan/parallel_layout.h"

namespace primus::train {

class PipelineMemoryMeter {
 public:
  // For pipeline rank pp_rank of a layout with a schedule.
  PipelineMemoryMeter(const ModelSpec& spec, const plan::ParallelLayout& layout, const config::TrainingArgs& args,
                      Precision precision, int pp_rank);
  void add(double peak_held_bytes) { peak_ = std::max(peak_, peak_held_bytes); }  // one step's
  struct Report {
    std::vector<double> measured, simulated;  // bytes, per pipeline rank
  };
  // The interval's peaks of every pipeline rank (collective over pp); starts a new interval.
  Report report(parallel::ProcessGroup& pp);

 private:
  double predicted_ = 0, peak_ = 0;
  int pp_rank_ = 0;
};

}  // namespace primus::train
