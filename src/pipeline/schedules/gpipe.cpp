// GPipe (Huang et al., 2019): every rank runs all m forwards, then all m fused backwards, so
// every rank keeps all m activations and the bubble is (p-1)/(m+p-1) of the span.
#include "pipeline/schedules/builder.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_gpipe(const ScheduleRequest& req) {
  int vpp = resolve_vpp(req, 1);
  require_vpp("gpipe", vpp, 1);
  Schedule s = make_empty("gpipe", req.pp, 1, req.microbatches, Placement::Looped);
  for (int r = 0; r < s.pp; ++r) {
    detail::RankBuilder b(s.ranks[r], 1);
    for (int i = 0; i < s.microbatches; ++i) b.F();
    for (int i = 0; i < s.microbatches; ++i) b.BW();
  }
  attach_p2p(s);
  return s;
}

}  // namespace primus::pipeline
