// The pipeline bubble of a training run, measured and predicted over a log interval: the executor's
// per-step timings (ExecutorStats) are summed here, then the ranks of the pipeline group compare
// the slowest rank's wall time with the busiest rank's compute (measured), and the simulator runs
// the same schedule with each stage's measured F, B and W times (predicted).
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/process_group.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"

namespace primus::pipeline {

// The simulator's costs from what the pipeline ranks measured: each rank's mean F, B and W time
// per chunk op, shared over the pipeline group (collective over pp), and split between a rank's
// chunks (vpp > 1) in proportion to their modelled work `stage_costs` (one per stage, or empty:
// equal stages). The runner runs an overlapped pair's two passes one after the other: pair_overlap 0.
Costs measured_stage_costs(const Schedule& s, const std::vector<StageCost>& stage_costs, parallel::ProcessGroup& pp,
                           double f, double b, double w);

class BubbleMeter {
 public:
  struct Report {
    double measured = 0;   // (slowest rank's wall - busiest rank's compute) / slowest wall
    double simulated = 0;  // the simulator's bubble rate with the measured stage costs
    StageCost mean{0, 0, 0};  // the measured F, B and W seconds per stage, mean over the stages
  };
  void add(const ExecutorStats& s);  // one step of this rank
  // The interval's bubble over `steps` steps, the same on every rank of pp (collective); starts a
  // new interval.
  Report report(const Schedule& s, const std::vector<StageCost>& stage_costs, parallel::ProcessGroup& pp,
                int64_t steps);

 private:
  double wall_ = 0, wait_ = 0, f_ = 0, b_ = 0, w_ = 0;
};

}  // namespace primus::pipeline
