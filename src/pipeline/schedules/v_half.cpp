// V-Half (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024): the V-shape
// placement at about half of 1F1B's activation memory. Built the paper's way (see v_block.cpp):
// a building block whose passes on rank i sit at slots F0 2i, F1 3p-i-2, B1 3p+g+2i-1,
// B0 6p+g-i-2 (g = 3 when p is even, else 0), repeated every 6 slots, W's in the free slots,
// warm-up and cool-down squeezed. Its lifespan gives (p+2)/2 stage activations at most
// (rounded down; 3 at p 4, 5 at p 8), and with T_F = T_B = T_W a bubble of about p/(2m).
//
// The default memory limit is that peak; --memory-limit K sets another. The greedy search under
// the limit (pipeline/greedy.h) runs too, with the building-block schedule as a candidate when it
// fits, and the least bubble wins, so unequal op times or a tighter limit still get a schedule.
#include <cmath>

#include "pipeline/greedy.h"
#include "pipeline/schedules/v_common.h"

namespace primus::pipeline {

Schedule make_v_half(const ScheduleRequest& req) {
  require_vpp("v-half", resolve_vpp(req, 2), 2);
  Schedule block = detail::v_block_schedule("v-half", req.pp, req.microbatches, detail::v_half_block(req.pp));
  int limit = detail::v_limit_chunks("v-half", req, detail::peak_chunks(block));
  return search_greedy("v-half", req.pp, req.microbatches, 2, Placement::VShape, req.costs, limit, {block});
}

}  // namespace primus::pipeline
