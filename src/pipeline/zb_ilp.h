// The Zero Bubble paper's ILP (Qi et al., ICLR 2024, appendix G), solved with CBC (Debian's
// coinor-libcbc-dev; built in when CMake finds it, see zb_ilp_available()) and started from the
// heuristic's schedule, which it can only improve.
//
// Variables: the end time E of every pass (stage s, microbatch j, F/B/W) and, for every two
// passes of one stage whose order the dependencies leave open, a binary "this one first" (the
// paper's O). Passes of one kind run in microbatch order on a stage, as in the paper's
// implementation, so the open pairs are (F_a, B_b), (F_a, W_b) and (B_a, W_b) for a > b:
// 3 m (m - 1) / 2 binaries per stage. Constraints: F and B chains between stages with the
// transfer time (the paper's 4, 5), W after B, the two passes of each open pair apart in the
// chosen order (6, with a big-M), the memory after every F within the limit (7). Objective: the
// largest stage span (3). Each stage's first F is fixed at its earliest time, which is where the
// executor starts it; every end time is bounded by the last stage's start plus the heuristic's
// span, which any better schedule keeps. The result's order per stage is re-simulated, and kept
// only when its span is shorter than the heuristic's.
#pragma once

#include <string>

#include "pipeline/schedule.h"
#include "pipeline/zb_heuristic.h"

namespace primus::pipeline {

// Problems with more binaries than this are left to the heuristic (the ILP would not even get
// through its first relaxations in a few seconds): p 8 with m up to 32, p 4 up to m 45.
constexpr int kZbIlpMaxBinaries = 12000;

struct ZbIlpBudget {
  double seconds = 0.0;  // wall-clock limit (used when nodes is 0)
  int nodes = 0;         // branch-and-bound node limit: the same result on every machine
};

struct ZbIlpResult {
  Schedule schedule;          // the better of the ILP's and the start
  bool ran = false;           // the solver ran (built in, and the problem within kZbIlpMaxBinaries)
  bool improved = false;      // the ILP's schedule is shorter than the start
  bool optimal = false;       // the solver proved its solution optimal
  double start_span = 0.0;    // largest stage span of the start
  double span = 0.0;          // ... of the result
  double lower_bound = 0.0;   // the solver's bound on the optimum (0 when it did not run)
  int binaries = 0;
  std::string status;         // one line for logs: what ran and how it ended
};

// Whether CBC was found at build time.
bool zb_ilp_available();

// Refines `start` (a schedule of `problem`, one chunk per rank) within the budget.
ZbIlpResult zb_ilp_refine(const ZbProblem& problem, const Schedule& start, const ZbIlpBudget& budget);

}  // namespace primus::pipeline
