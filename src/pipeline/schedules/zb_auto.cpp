// zb-auto: the zero-bubble automatic schedule. Not the paper's ILP: a search over greedy list
// schedules (see pipeline/greedy.h), in the spirit of the paper's heuristic scheduler. For each
// in-flight cap (uniform, or staggered p-r+k like 1F1B's warm-up depth) and each W-fill rule it
// builds the schedule under the memory limit with the given costs, simulates it and keeps the
// least makespan. --memory-limit is in microbatch activations of one stage (default p, the
// memory of 1F1B); with 2p-1 it reaches ZB-H2's zero bubble. The hand-written 1F1B, ZB-H1 and
// ZB-H2 are candidates too, so zb-auto is never worse than them when they fit the limit.
#include <cmath>

#include "core/error.h"
#include "pipeline/greedy.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_1f1b(const ScheduleRequest&);
Schedule make_zb_h1(const ScheduleRequest&);
Schedule make_zb_h2(const ScheduleRequest&);

Schedule make_zb_auto(const ScheduleRequest& req) {
  int vpp = resolve_vpp(req, 1);
  require_vpp("zb-auto", vpp, 1);
  const double limit = req.memory_limit > 0 ? req.memory_limit : req.pp;
  if (limit < 1)
    fail("memory limit {} is too small for any schedule: each rank must hold at least 1 microbatch activation",
         limit);
  ScheduleRequest plain = req;
  plain.vpp = 1;
  std::vector<Schedule> handcrafted = {make_1f1b(plain), make_zb_h1(plain), make_zb_h2(plain)};
  return search_greedy("zb-auto", req.pp, req.microbatches, 1, Placement::Looped, req.costs,
                       (int)std::floor(limit + 1e-9), handcrafted);
}

}  // namespace primus::pipeline
