// The Zero Bubble paper's heuristic scheduler (Qi et al., "Zero Bubble Pipeline Parallelism",
// ICLR 2024, section 3.1), zb-auto's first step. One chunk per rank (stage s on rank s), split
// backward, times per stage, a transfer time, and a memory limit in microbatch activations (F
// adds one, B frees all but `activation_after_b`, W frees the rest). Its rules:
//   1. Warm-up: every stage runs the first microbatch's F, then as many further F's as fit in the
//      memory and in the time until the first B's gradient can arrive (estimated from the last
//      stage back). Knob `fill_before_first_b`: also run the one F that would delay that B a
//      little instead of leaving a gap shorter than T_F.
//   2. Steady state, one round per microbatch: each stage runs one F (stages in order), then
//      each runs the round's B (last stage first). A W fills a wait that is at least T_W long;
//      a shorter wait gets a W when it would make this stage's cumulative idle time the largest
//      of all stages (knob `fill_small_gaps`: also otherwise); and W's run whenever the next F
//      would pass the memory limit.
//   3. The lead invariant: before its F's run out, stage i has always run at least one F more
//      than stage i+1 (a stage that does not run its F in a round holds back the stages before
//      it). Knob `skip_ahead`: a stage at least two F's ahead of the next skips its F when it
//      would otherwise delay the coming B and idling costs no more than the worst stage's idle.
//   4. When F and B are used up, each stage runs its remaining W's.
// zb_heuristic_best runs the grid over the three knobs and keeps the shortest (least largest
// rank span, then least makespan).
#pragma once

#include <optional>
#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline {

struct ZbProblem {
  int pp = 1;
  int microbatches = 1;
  std::vector<StageCost> stage;  // pp entries
  double t_comm = 0.0;
  double memory_limit = 1.0;       // microbatch activations of one stage (M_B units)
  double activation_after_b = 1.0;  // M_W / M_B
};

// The problem of `req` (one chunk per rank; the default limit is pp, ZB-1p).
ZbProblem zb_problem(const ScheduleRequest& req);

struct ZbKnobs {
  bool fill_before_first_b = false;
  bool fill_small_gaps = false;
  bool skip_ahead = false;
};

// One run of the heuristic; nullopt when the memory limit cannot be kept with these knobs. The
// schedule has its transfers attached.
std::optional<Schedule> zb_heuristic(const ZbProblem& problem, const ZbKnobs& knobs);

// The grid over the knobs, the shortest result. Throws primus::Error when no setting keeps the
// memory limit (a limit below one microbatch).
Schedule zb_heuristic_best(const ZbProblem& problem);

}  // namespace primus::pipeline
