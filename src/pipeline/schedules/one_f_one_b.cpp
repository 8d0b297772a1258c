// 1F1B (PipeDream-Flush, Megatron's default): rank r runs p-r-1 warm-up forwards, then
// alternates one forward and one fused backward, then drains the backwards. Rank r holds at most
// p-r activations; the bubble is (p-1)(T_F+T_B+T_W).
#include <algorithm>

#include "pipeline/schedules/builder.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_1f1b(const ScheduleRequest& req) {
  int vpp = resolve_vpp(req, 1);
  require_vpp("1f1b", vpp, 1);
  Schedule s = make_empty("1f1b", req.pp, 1, req.microbatches, Placement::Looped);
  const int m = s.microbatches;
  for (int r = 0; r < s.pp; ++r) {
    detail::RankBuilder b(s.ranks[r], 1);
    const int warmup = std::min(s.pp - r - 1, m);
    for (int i = 0; i < warmup; ++i) b.F();
    for (int i = warmup; i < m; ++i) b.F(), b.BW();
    for (int i = 0; i < warmup; ++i) b.BW();
  }
  attach_p2p(s);
  return s;
}

}  // namespace primus::pipeline
