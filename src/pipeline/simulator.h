// Runs a schedule on an idealised machine: op durations from Costs (a chunk of a vpp-chunk rank
// costs 1/vpp of a stage, or its own entry of Costs::stages), t_comm added between dependent ops
// on different ranks, ops on a rank in list order, each as early as its rank and its inputs allow.
// An overlapped pair (Op::overlap_next) starts when both of its inputs are there and costs
// max(a, b) + (1 - pair_overlap) min(a, b); both of its results are ready when it ends.
#pragma once

#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline {

struct OpTiming {
  // The two ops of an overlapped pair share the pair's interval: the first is given the part
  // [start, start + d * a / (a + b)), the second the rest, for drawing.
  double start = 0.0;
  double end = 0.0;
};

struct RankStats {
  double span = 0.0;              // first op start to last op end
  double busy = 0.0;              // total compute time (an overlapped pair counts once)
  double peak_activations = 0.0;  // in whole-stage microbatch activations
};

struct SimResult {
  std::vector<std::vector<OpTiming>> times;  // parallel to Schedule::ranks
  std::vector<RankStats> per_rank;
  double makespan = 0.0;     // last end (everything starts at 0)
  double max_span = 0.0;
  // The zero-bubble paper's (max span - m (T_F + T_B + T_W)) / max span, with the busiest rank's
  // compute time as the subtrahend: the same when all stages cost the same, and the right one
  // when they do not or when overlapped pairs take less than the sum of their ops.
  double bubble_rate = 0.0;
  double peak_activations = 0.0;  // max over ranks
};

double op_duration(OpType t, const StageCost& c);
double op_duration(OpType t, const Costs& c, int vpp, int stage);
// The time of an overlapped pair of ops taking a and b.
double pair_duration(double a, double b, double overlap);

// Throws primus::Error if the schedule deadlocks (validate() explains why in detail) or the costs
// are invalid (check_costs).
SimResult simulate(const Schedule& s, const Costs& costs);

}  // namespace primus::pipeline
