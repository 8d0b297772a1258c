// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Figure 3 top): 1F1B's order of
// F and B, with the backward split into B and W and each rank's W delayed so that every rank
// keeps p microbatches in flight (1F1B's peak, on rank 0). Rank r runs p-r-1 warm-up forwards,
// r pairs (F, B) without W, then (F, B, W) until the forwards run out, then (B, W), and finally
// the delayed W's, which fill the tail bubble. Bubble (p-1)(T_F+T_B-T_W): a third of 1F1B's
// when the three costs are equal.
#include <algorithm>

#include "pipeline/schedules/builder.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_zb_h1(const ScheduleRequest& req) {
  int vpp = resolve_vpp(req, 1);
  require_vpp("zb-h1", vpp, 1);
  Schedule s = make_empty("zb-h1", req.pp, 1, req.microbatches, Placement::Looped);
  const int p = s.pp, m = s.microbatches;
  for (int r = 0; r < p; ++r) {
    detail::RankBuilder b(s.ranks[r], 1);
    for (int i = 0; i < std::min(p - r - 1, m); ++i) b.F();
    for (int i = 0; i < r && b.forwards() < m; ++i) b.F(), b.B();
    while (b.forwards() < m) b.F(), b.B(), b.W();
    while (b.backwards() < m) b.B(), b.W();
    while (b.queued_w() > 0) b.W();
  }
  attach_p2p(s);
  return s;
}

}  // namespace primus::pipeline
