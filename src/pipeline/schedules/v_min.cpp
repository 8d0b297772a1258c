// V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024): the V-shape
// placement at about a third of 1F1B's activation memory. Built the paper's way (see
// v_block.cpp): a building block whose passes on rank i sit at slots F0 i, F1 2p-1-i,
// B1 2p+g+i, B0 4p+g-1-i (g = 2 when p is a multiple of 3, else 0), repeated every 6 slots, W's
// in the free slots, warm-up and cool-down squeezed. The shortest lifespan of the V blocks: at
// most (p+4)/3 stage activations (rounded down; 2 at p 4, 4 at p 8, 6 at p 16), and with
// T_F = T_B = T_W a bubble of about 2p/(3m).
//
// The default memory limit is that peak; --memory-limit K sets another. The greedy search under
// the limit (pipeline/greedy.h) runs too, with the building-block schedule as a candidate when it
// fits, and the least bubble wins.
#include <cmath>

#include "pipeline/greedy.h"
#include "pipeline/schedules/v_common.h"

namespace primus::pipeline {

Schedule make_v_min(const ScheduleRequest& req) {
  require_vpp("v-min", resolve_vpp(req, 2), 2);
  Schedule block = detail::v_block_schedule("v-min", req.pp, req.microbatches, detail::v_min_block(req.pp));
  int limit = detail::v_limit_chunks("v-min", req, detail::peak_chunks(block));
  return search_greedy("v-min", req.pp, req.microbatches, 2, Placement::VShape, req.costs, limit, {block});
}

}  // namespace primus::pipeline
