// ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024, the V-ZB
// schedule; sail-sg/zero-bubble-pipeline-parallelism): two chunks per rank in a V (chunk 0 on
// ranks 0..p-1, chunk 1 back on p-1..0), backward split into B and W, memory of 1F1B (2p chunk
// activations = p stage activations on every rank).
//
// Built constructively for m >= 2p. Rank r runs
//   1. 2(p-r)-1 forwards of chunk 0          (the V fills: rank r waits r chunk-op times)
//   2. r pairs (F chunk 1, F chunk 0)        (chunk 1's forwards come back up the V)
//   3. p-r triples (F1, B1, W1)              (first backwards of chunk 1; memory now 2p chunks)
//   4. steady (F0, B0, W0, F1, B1, W1) until all forwards are done
//   5. r pairs (B0, B1), then p-r pairs (B0, W0), then the deferred W's (chunk 1 first).
// Each rank then holds 2p chunk activations at most, and with T_F = T_B = T_W every rank's span is
// exactly 6m chunk ops (zero bubble by the span definition), rank r starting r chunk ops late.
// For other costs (or m < 2p) the greedy search under the same memory (pipeline/greedy.h) runs
// too, with the constructive schedule as a candidate, and the least bubble wins.
#include <vector>

#include "pipeline/greedy.h"
#include "pipeline/schedules/v_common.h"

namespace primus::pipeline {

namespace {

Schedule zbv_constructive(int p, int m) {
  Schedule s = make_empty("zbv", p, 2, m, Placement::VShape);
  for (int r = 0; r < p; ++r) {
    std::vector<Op>& ops = s.ranks[r];
    int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};  // next microbatch per op type and chunk
    auto F = [&](int c) { ops.push_back({OpType::F, f[c]++, c, {}, {}}); };
    auto B = [&](int c) { ops.push_back({OpType::B, b[c]++, c, {}, {}}); };
    auto W = [&](int c) { ops.push_back({OpType::W, w[c]++, c, {}, {}}); };
    for (int i = 0; i < 2 * (p - r) - 1; ++i) F(0);
    for (int i = 0; i < r; ++i) F(1), F(0);
    for (int i = 0; i < p - r; ++i) F(1), B(1), W(1);
    while (f[0] < m || f[1] < f[0]) {
      if (f[0] < m) F(0);
      B(0), W(0), F(1), B(1), W(1);
    }
    // Cool-down: the critical B's first, their W's fill the tail.
    for (int i = 0; i < r; ++i) B(0), B(1);
    for (int i = 0; i < p - r; ++i) B(0), W(0);
    while (w[1] < m) W(1);
    while (w[0] < m) W(0);
  }
  return s;
}

}  // namespace

Schedule make_zbv(const ScheduleRequest& req) {
  int limit = detail::v_limit_chunks("zbv", req, 2 * req.pp);
  std::vector<Schedule> extra;
  if (req.microbatches >= 2 * req.pp) extra.push_back(zbv_constructive(req.pp, req.microbatches));
  for (Schedule& s : extra) attach_p2p(s);
  return search_greedy("zbv", req.pp, req.microbatches, 2, Placement::VShape, req.costs, limit, extra);
}

}  // namespace primus::pipeline
