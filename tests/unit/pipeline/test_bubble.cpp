// The trainer's bubble report (pipeline/bubble.h): the simulator's costs from measured op times,
// split between a rank's chunks by their modelled work, and the interval's measured bubble.
#include <gtest/gtest.h>

#include "parallel/self_process_group.h"
#include "pipeline/bubble.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/simulator.h"

using namespace primus;
using namespace primus::pipeline;

namespace {

Schedule schedule(const std::string& name, int pp, int m, int vpp) {
  ScheduleRequest r;
  r.pp = pp, r.microbatches = m, r.vpp = vpp;
  return generate(name, r);
}

}  // namespace

TEST(Bubble, MeasuredCostsAreTheRanksMeansWithEqualStages) {
  parallel::SelfProcessGroup pp;
  const Schedule s = schedule("1f1b", 1, 4, 1);
  const Costs c = measured_stage_costs(s, {}, pp, 0.5, 1.0, 0.25);
  ASSERT_EQ(c.stages.size(), 1u);
  EXPECT_EQ(c.stages[0], (StageCost{0.5, 1.0, 0.25}));
  EXPECT_EQ(c.pair_overlap, 0.0);  // the runner runs an overlapped pair's passes one after the other
}

TEST(Bubble, ARanksChunksShareItsMeanInProportionToTheirModelledWork) {
  parallel::SelfProcessGroup pp;
  const Schedule s = schedule("zbv", 1, 4, 2);
  ASSERT_EQ(s.num_stages(), 2);
  // Chunk costs 1 and 3: the measured mean (per chunk op) splits 0.5x and 1.5x.
  const Costs c = measured_stage_costs(s, {{1, 1, 1}, {3, 3, 3}}, pp, 2.0, 4.0, 1.0);
  ASSERT_EQ(c.stages.size(), 2u);
  const int first = s.stage_of(0, 0), second = s.stage_of(0, 1);
  const double f0 = first == 0 ? 0.5 : 1.5, f1 = second == 0 ? 0.5 : 1.5;
  EXPECT_DOUBLE_EQ(c.stages[size_t(first)].forward, 2.0 * f0);
  EXPECT_DOUBLE_EQ(c.stages[size_t(second)].backward, 4.0 * f1);
  EXPECT_DOUBLE_EQ(c.stages[0].weight + c.stages[1].weight, 2.0);  // the mean is kept
}

TEST(Bubble, TheIntervalsMeasuredBubbleIsTheWaitOverTheWallAndTheMeanStageTimes) {
  parallel::SelfProcessGroup pp;
  const Schedule s = schedule("1f1b", 1, 4, 1);
  BubbleMeter meter;
  ExecutorStats a, b;
  a.wall_s = 10, a.wait_s = 2, a.mean_f_s = 1, a.mean_b_s = 2, a.mean_w_s = 0.5;
  b.wall_s = 14, b.wait_s = 4, b.mean_f_s = 3, b.mean_b_s = 2, b.mean_w_s = 1.5;
  meter.add(a);
  meter.add(b);
  const BubbleMeter::Report r = meter.report(s, {}, pp, 2);
  EXPECT_DOUBLE_EQ(r.measured, (12.0 - 9.0) / 12.0);  // (wall - busy) / wall, per step
  EXPECT_EQ(r.mean, (StageCost{2, 2, 1}));
  EXPECT_DOUBLE_EQ(r.simulated, simulate(s, measured_stage_costs(s, {}, pp, 2, 2, 1)).bubble_rate);
}
