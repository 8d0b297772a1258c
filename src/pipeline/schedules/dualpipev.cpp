// DualPipeV (DeepSeek, "DualPipe" repository, dualpipev.py): DualPipe cut in half, on the V-shape
// placement (chunk 0 of rank r is stage r, chunk 1 is stage 2p-1-r). Each rank runs eight phases:
//   1. 2(p-r-1) F of chunk 0          2. r+1 times (F chunk 0, F chunk 1)
//   3. p-r-1 times (B chunk 1 split, W, F chunk 1)
//   4. m-2p+r+1 times (F chunk 0 + BW chunk 1, F chunk 1 + BW chunk 0)   [the overlapped pairs]
//   5. p-r-1 times (BW chunk 1, F chunk 1 + BW chunk 0)
//   6. r+1 times (B chunk 1, B chunk 0), fused until half-way, then split
//   7. p-r-1 times (W, B chunk 0 split)   8. r+1 W
// DualPipe runs the F and B of a pair at the same time to hide the expert-parallel all-to-all;
// here they run one after the other. Needs m >= 2p.
#include "core/error.h"
#include "pipeline/schedules/builder.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_dualpipev(const ScheduleRequest& req) {
  require_vpp("dualpipev", resolve_vpp(req, 2), 2);
  const int p = req.pp, m = req.microbatches;
  if (m < 2 * p)
    fail("dualpipev needs at least 2p microbatches: --microbatches {} < 2 x --pp {}", m, p);
  Schedule s = make_empty("dualpipev", p, 2, m, Placement::VShape);
  for (int r = 0; r < p; ++r) {
    detail::RankBuilder b(s.ranks[r], 2);
    // A backward of chunk c, either split (W queued) or fused.
    auto back = [&](int c, bool split) { split ? b.B(c) : b.BW(c); };
    for (int i = 0; i < 2 * (p - r - 1); ++i) b.F(0);
    for (int i = 0; i < r + 1; ++i) b.F(0), b.F(1);
    for (int i = 0; i < p - r - 1; ++i) back(1, true), b.W(), b.F(1);
    for (int i = 0; i < m - 2 * p + r + 1; ++i) b.F(0), back(1, false), b.F(1), back(0, false);
    for (int i = 0; i < p - r - 1; ++i) back(1, false), b.F(1), back(0, false);
    const int step6 = r + 1;
    bool split = false;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && r % 2 == 1) split = true;
      back(1, split);
      if (i == step6 / 2 && r % 2 == 0) split = true;
      back(0, split);
    }
    for (int i = 0; i < p - r - 1; ++i) b.W(), back(0, true);
    for (int i = 0; i < r + 1; ++i) b.W();
  }
  attach_p2p(s);
  return s;
}

}  // namespace primus::pipeline
