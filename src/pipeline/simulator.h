// Runs a schedule on an idealised machine: op durations from Costs (a chunk of a vpp-chunk rank
// costs 1/vpp of a stage), t_comm added between dependent ops on different ranks, ops on a rank
// in list order, each as early as its rank and its inputs allow.
#pragma once

#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline {

struct OpTiming {
  double start = 0.0;
  double end = 0.0;
};

struct RankStats {
  double span = 0.0;              // first op start to last op end
  double busy = 0.0;              // total compute time
  double peak_activations = 0.0;  // in whole-stage microbatch activations
};

struct SimResult {
  std::vector<std::vector<OpTiming>> times;  // parallel to Schedule::ranks
  std::vector<RankStats> per_rank;
  double makespan = 0.0;     // last end (everything starts at 0)
  double max_span = 0.0;
  double bubble_rate = 0.0;  // (max span - m (T_F + T_B + T_W)) / max span, the zero-bubble paper's
  double peak_activations = 0.0;  // max over ranks
};

double op_duration(OpType t, const Costs& c, int vpp);

// Throws primus::Error if the schedule deadlocks (validate() explains why in detail).
SimResult simulate(const Schedule& s, const Costs& costs);

}  // namespace primus::pipeline
