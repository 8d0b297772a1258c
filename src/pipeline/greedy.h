// A greedy list scheduler for split-backward (F, B, W) schedules under a memory limit, shared by
// zb-auto and the V-shape schedules (zbv, v-half, v-min). It plays the pipeline forward in time
// with the given costs; whenever a rank is free it runs, in this order of preference:
//   1. a B whose gradient has arrived (the later stage first: it unblocks the most work),
//   2. an F whose activation has arrived and whose memory fits (a microbatch already started on
//      this rank first; a new microbatch only if its activations for all of this rank's chunks fit
//      and fewer than `inflight_cap` microbatches are in flight here),
//   3. the oldest pending W, to fill the gap (with `strict_fill`, only when no B or F is due
//      within T_W, so a W never delays a B or F that is about to arrive).
// Admitting a microbatch reserves memory for its remaining chunks on the rank, so a microbatch
// that has started can always finish and the greedy cannot deadlock as long as the limit holds at
// least one microbatch (vpp chunk activations).
#pragma once

#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline {

struct GreedyOptions {
  int memory_limit_chunks = 0;    // chunk activations alive on a rank at most
  std::vector<int> inflight_cap;  // per rank; empty: no cap beyond memory
  bool strict_fill = true;
  // true: admitting a microbatch reserves memory for all its chunks on the rank (cannot
  // deadlock); false: only the next activation must fit (tighter packing; the search drops
  // the candidates that get stuck).
  bool reserve = true;
  // true: after a B, an arrived F goes before another B (the steady 1F1B rhythm).
  bool alternate = false;
};

// What a greedy run found out on the way (the simulator gives the same times for its lists).
struct GreedyStats {
  bool cap_binding = false;  // the in-flight cap stopped an admission the memory allowed (when it
                             // did not, the schedule is the one without a cap)
  double max_span = 0.0, makespan = 0.0;
};

Schedule greedy_schedule(const std::string& algorithm, int pp, int microbatches, int vpp,
                         Placement placement, const Costs& costs, const GreedyOptions& opts,
                         GreedyStats* stats = nullptr);

// Tries the greedy with both fill rules, both reservation rules, with and without `alternate`,
// and the uniform and staggered (pp - rank + k) in-flight caps that change the result (every k up
// to 8, then steps of about a quarter), plus any `extra` candidates; simulates each and keeps the one with the least bubble (largest rank span),
// then the least makespan, then the least peak memory, among those within the memory limit. It
// stops early when a candidate reaches the lower bounds of span and makespan (no idle time). The
// V schedules (zbv, v-half, v-min) use it with their memory limits.
Schedule search_greedy(const std::string& algorithm, int pp, int microbatches, int vpp,
                       Placement placement, const Costs& costs, int memory_limit_chunks,
                       const std::vector<Schedule>& extra = {});

}  // namespace primus::pipeline
