// zb-auto: the Zero Bubble paper's automatic schedule (Qi et al., ICLR 2024, section 3): its
// heuristic (pipeline/zb_heuristic.h) with the grid over its knobs, then, when the solver is
// built in and the request gives it a budget, the paper's ILP (appendix G, pipeline/zb_ilp.h)
// started from the heuristic's schedule. The memory limit is Megatron's and Primus's
// zero_bubble_max_pending_backward (--memory-limit), in microbatch activations of a stage: p
// (the default) gives ZB-1p, 2p gives ZB-2p.
#include <fmt/format.h>

#include "pipeline/schedules/registry.h"
#include "pipeline/zb_heuristic.h"
#include "pipeline/zb_ilp.h"

namespace primus::pipeline {

Schedule make_zb_auto(const ScheduleRequest& req) {
  require_vpp("zb-auto", resolve_vpp(req, 1), 1);
  const ZbProblem problem = zb_problem(req);
  Schedule s = zb_heuristic_best(problem);
  const std::string limit = fmt::format("memory limit {:g} microbatches", problem.memory_limit);
  if (req.ilp_seconds <= 0 && req.ilp_nodes <= 0) {
    s.note = fmt::format("zb-auto: heuristic, {}; ILP refinement off", limit);
    return s;
  }
  ZbIlpResult ilp = zb_ilp_refine(problem, s, {req.ilp_seconds, req.ilp_nodes});
  ilp.schedule.note = fmt::format("zb-auto: heuristic, {}; {}", limit, ilp.status);
  return std::move(ilp.schedule);
}

}  // namespace primus::pipeline
