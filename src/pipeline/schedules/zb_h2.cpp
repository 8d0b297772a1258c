// ZB-H2 (Qi et al., ICLR 2024, Figure 3 bottom): more warm-up forwards fill the bubble before the
// first B, and the W's at the tail are moved so that the pipeline becomes a parallelogram with no
// bubble inside any rank's span when T_F = T_B = T_W. Rank r runs 2(p-r)-1 warm-up forwards,
// then 2r pairs (B, F) without W, then (B, W, F) until the forwards run out, then (B, W), then
// the remaining W's. Peak 2p-1 activations on rank 0.
#include <algorithm>

#include "pipeline/schedules/builder.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_zb_h2(const ScheduleRequest& req) {
  int vpp = resolve_vpp(req, 1);
  require_vpp("zb-h2", vpp, 1);
  Schedule s = make_empty("zb-h2", req.pp, 1, req.microbatches, Placement::Looped);
  const int p = s.pp, m = s.microbatches;
  for (int r = 0; r < p; ++r) {
    detail::RankBuilder b(s.ranks[r], 1);
    for (int i = 0; i < std::min(2 * (p - r) - 1, m); ++i) b.F();
    for (int i = 0; i < 2 * r && b.forwards() < m; ++i) b.B(), b.F();
    while (b.forwards() < m) b.B(), b.W(), b.F();
    while (b.backwards() < m) b.B(), b.W();
    while (b.queued_w() > 0) b.W();
  }
  attach_p2p(s);
  return s;
}

}  // namespace primus::pipeline
