// zb-auto against the Zero Bubble paper (Qi et al., ICLR 2024): its heuristic's rules and memory
// limit, Table 5's bubble rates from the paper's profiled times (Table 6), the ILP refinement;
// DualPipeV's overlapped F&B pairs; stages of unequal cost.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"
#include "pipeline/zb_heuristic.h"
#include "pipeline/zb_ilp.h"

using namespace primus::pipeline;

namespace {

Costs times(double f, double b, double w, double comm = 0, double kept = 1) {
  Costs c;
  c.t_forward = f, c.t_backward = b, c.t_weight = w, c.t_comm = comm, c.activation_after_b = kept;
  return c;
}

ScheduleRequest zb(int p, int m, double limit, Costs c = {}) {
  ScheduleRequest r;
  r.pp = p, r.microbatches = m, r.memory_limit = limit, r.costs = c;
  return r;
}

// Forwards before B of microbatch j in a stage's list, for every j.
std::vector<int> forwards_before_each_b(const std::vector<Op>& ops) {
  std::vector<int> out;
  int f = 0;
  for (const Op& op : ops) {
    if (op.type == OpType::F) ++f;
    if (op.type == OpType::B) out.push_back(f);
  }
  return out;
}

// The paper's Table 6 (profiled T_F, T_B, T_W, T_comm) with its Table 5 bubble rates; the memory
// kept from B to W is Table 1's M_W / M_B = 32h / (34h + 5as) (s = 1024).
struct PaperRow {
  const char* model;
  int p, m;
  double tf, tb, tw, tc;
  int hidden, heads;
  double f1b, zbh1, zbh2, zb1p, zb2p;
};
const std::vector<PaperRow> kTable5 = {
    {"1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, 2304, 24, .2431, .1585, .1083, .1585, .0433},
    {"1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, 2304, 24, .1985, .1242, .0837, .1242, .0039},
    {"1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, 2304, 24, .1240, .0674, .0444, .0674, .0026},
    {"6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, 4096, 32, .2347, .1323, .0698, .1323, .0029},
    {"6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, 4096, 32, .1898, .1045, .0559, .1045, .0022},
    {"6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, 4096, 32, .1091, .0554, .0294, .0554, .0010},
    {"14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, 5120, 40, .2552, .1397, .0672, .1397, .0066},
    {"14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, 5120, 40, .2082, .1088, .0516, .1088, .0054},
    {"14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, 5120, 40, .1251, .0576, .0266, .0576, .0028},
    {"28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, 6144, 48, .2646, .1421, .0641, .1421, .0038},
    {"28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, 6144, 48, .2168, .1106, .0490, .1106, .0029},
    {"28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, 6144, 48, .1352, .0594, .0257, .0594, .0018},
};

}  // namespace

TEST(ZeroBubblePaper, Table5BubbleRatesFromProfiledTimes) {
  // Every column of every row to the paper's four decimals: the handcrafted schedules check the
  // time model, ZB-1p and ZB-2p (zero_bubble_max_pending_backward p and 2p) the heuristic.
  for (const PaperRow& row : kTable5) {
    SCOPED_TRACE(std::string(row.model) + " p" + std::to_string(row.p) + " m" + std::to_string(row.m));
    const double kept = 32.0 * row.hidden / (34.0 * row.hidden + 5.0 * row.heads * 1024);
    const Costs c = times(row.tf, row.tb, row.tw, row.tc, kept);
    auto rate = [&](const std::string& name, double limit) {
      return simulate(generate(name, zb(row.p, row.m, limit, c)), c).bubble_rate;
    };
    EXPECT_NEAR(rate("1f1b", 0), row.f1b, 5e-5);
    EXPECT_NEAR(rate("zb-h1", 0), row.zbh1, 5e-5);
    EXPECT_NEAR(rate("zb-h2", 0), row.zbh2, 5e-5);
    const Schedule zb1p = generate("zb-auto", zb(row.p, row.m, row.p, c));
    const Schedule zb2p = generate("zb-auto", zb(row.p, row.m, 2 * row.p, c));
    const SimResult r1 = simulate(zb1p, c), r2 = simulate(zb2p, c);
    EXPECT_NEAR(r1.bubble_rate, row.zb1p, 5e-5);
    EXPECT_NEAR(r2.bubble_rate, row.zb2p, 5e-5);
    EXPECT_LE(r1.peak_activations, row.p + 1e-9);
    EXPECT_LE(r2.peak_activations, 2 * row.p + 1e-9);
  }
}

TEST(ZeroBubbleHeuristic, RulesHoldForEveryKnobSetting) {
  struct Case {
    int p, m;
    double limit;
    Costs c;
  };
  const std::vector<Case> cases = {{4, 8, 4, times(1, 1, 1)},          {4, 8, 7, times(1, 1, 1)},
                                   {4, 12, 5, times(1, 2, 1, 0.2)},    {6, 12, 9, times(1.5, 1, 0.5, 0.1)},
                                   {8, 24, 16, times(18.5, 18.1, 9.3, 0.6, 0.37)}, {3, 2, 3, times(1, 1, 1)},
                                   {5, 10, 2, times(1, 1, 1)}};
  for (const Case& k : cases)
    for (bool a : {false, true})
      for (bool b : {false, true})
        for (bool skip : {false, true}) {
          SCOPED_TRACE("p" + std::to_string(k.p) + " m" + std::to_string(k.m) + " limit " + std::to_string(k.limit) +
                       " knobs " + std::to_string(a) + std::to_string(b) + std::to_string(skip));
          const ZbProblem z = zb_problem(zb(k.p, k.m, k.limit, k.c));
          const auto s = zb_heuristic(z, {a, b, skip});
          ASSERT_TRUE(s.has_value());
          EXPECT_TRUE(find_problems(*s).empty());
          const SimResult r = simulate(*s, k.c);
          // The memory limit: zero_bubble_max_pending_backward microbatch activations.
          EXPECT_LE(r.peak_activations, k.limit + 1e-9);
          for (int st = 0; st < k.p; ++st) {
            const auto& ops = s->ranks[st];
            // Leftover W's at the end: after the last B only W's.
            size_t last_b = 0;
            for (size_t i = 0; i < ops.size(); ++i)
              if (ops[i].type == OpType::B) last_b = i;
            for (size_t i = last_b + 1; i < ops.size(); ++i) EXPECT_EQ(ops[i].type, OpType::W) << "stage " << st;
            // The lead invariant: at every B (one per round), a stage has run at least one F more
            // than the next stage, until its F's are used up; the warm-up's F's come out of the
            // memory, so below p activations a stage may only keep level.
            if (st + 1 < k.p) {
              const int lead = k.limit >= k.p ? 1 : 0;
              const auto mine = forwards_before_each_b(ops), next = forwards_before_each_b(s->ranks[st + 1]);
              for (int j = 0; j < k.m; ++j)
                if (mine[j] < k.m) EXPECT_GE(mine[j], next[j] + lead) << "stage " << st << " at B" << j;
            }
          }
        }
}

TEST(ZeroBubbleHeuristic, GridKeepsTheShortestAndMemoryRaisesIt) {
  const Costs c = times(1, 1.5, 0.7, 0.1);
  double last = 1e300;
  for (double limit : {4.0, 5.0, 6.0, 8.0}) {
    const ZbProblem z = zb_problem(zb(4, 12, limit, c));
    const double best = simulate(zb_heuristic_best(z), c).max_span;
    for (bool a : {false, true})
      for (bool b : {false, true})
        for (bool skip : {false, true}) EXPECT_LE(best, simulate(*zb_heuristic(z, {a, b, skip}), c).max_span + 1e-9);
    EXPECT_LE(best, last + 1e-9) << "more memory never makes it longer (limit " << limit << ")";
    last = best;
  }
  // With T_F = T_B = T_W: ZB-H1's bubble at p activations, none at 2p - 1 (ZB-H2's memory).
  EXPECT_DOUBLE_EQ(simulate(generate("zb-auto", zb(4, 8, 4)), Costs{}).makespan, 27);
  EXPECT_NEAR(simulate(generate("zb-auto", zb(4, 8, 7)), Costs{}).bubble_rate, 0.0, 1e-12);
  // The default limit is p (ZB-1p).
  EXPECT_LE(simulate(generate("zb-auto", zb(6, 12, 0)), Costs{}).peak_activations, 6 + 1e-9);
  EXPECT_THROW(generate("zb-auto", zb(4, 8, 0.5)), primus::Error);
}

TEST(ZeroBubbleIlp, ImprovesATightMemorySchedule) {
  if (!zb_ilp_available()) GTEST_SKIP() << "built without CBC (coinor-libcbc-dev)";
  // p 3, m 6, two activations per rank, T_B = 2: the heuristic spends 40, the ILP proves 35.
  const Costs c = times(1, 2, 1);
  const ZbProblem z = zb_problem(zb(3, 6, 2, c));
  const Schedule start = zb_heuristic_best(z);
  EXPECT_DOUBLE_EQ(simulate(start, c).max_span, 40);
  const ZbIlpResult r = zb_ilp_refine(z, start, {60.0, 0});
  EXPECT_TRUE(r.ran) << r.status;
  EXPECT_TRUE(r.improved) << r.status;
  EXPECT_TRUE(r.optimal) << r.status;
  EXPECT_EQ(r.binaries, 3 * 15 * 3);
  EXPECT_TRUE(find_problems(r.schedule).empty());
  const SimResult sim = simulate(r.schedule, c);
  EXPECT_DOUBLE_EQ(sim.max_span, 35);
  EXPECT_DOUBLE_EQ(r.span, 35);
  EXPECT_LE(sim.peak_activations, 2 + 1e-9);
  // The same through generate(): zb-auto with a budget.
  ScheduleRequest req = zb(3, 6, 2, c);
  req.ilp_nodes = 100000;
  EXPECT_DOUBLE_EQ(simulate(generate("zb-auto", req), c).max_span, 35);
}

TEST(ZeroBubbleIlp, SkipsWhatItCannotImproveOrSolve) {
  // Zero bubble already: nothing to solve.
  const ZbProblem z = zb_problem(zb(4, 8, 7));
  const ZbIlpResult r = zb_ilp_refine(z, zb_heuristic_best(z), {5.0, 0});
  EXPECT_FALSE(r.improved);
  EXPECT_FALSE(r.ran);
  // Too large: p 32, m 256 has 3 x 32 x 256 x 255 / 2 order variables.
  const ZbProblem big = zb_problem(zb(32, 256, 32, times(1, 1.2, 0.8, 0.05)));
  const Schedule start = zb_heuristic_best(big);
  const ZbIlpResult b = zb_ilp_refine(big, start, {5.0, 0});
  EXPECT_FALSE(b.ran);
  EXPECT_NE(b.status.find(zb_ilp_available() ? "skipped" : "not built"), std::string::npos) << b.status;
  EXPECT_EQ(b.schedule.ranks, start.ranks);
}

TEST(DualPipeV, OverlappedPairsCostTheMax) {
  const Schedule s = generate("dualpipev", zb(4, 8, 0));
  int pairs = 0;
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Op& op = s.ranks[r][i];
      if (!op.overlap_next) continue;
      ++pairs;
      const Op& back = s.ranks[r][i + 1];
      EXPECT_EQ(op.type, OpType::F);
      EXPECT_EQ(back.type, OpType::BW);
      EXPECT_NE(op.chunk, back.chunk);
    }
  // Rank r: m - 2p + r + 1 pairs of phase 4 twice, p - r - 1 of phase 5; the last rank's first
  // phase-4 pair runs one op after the other, as in dualpipev.py.
  EXPECT_EQ(pairs, 2 * (1 + 2 + 3 + 4) - 1 + (3 + 2 + 1 + 0));
  Costs full = times(1, 2, 1), none = full;
  none.pair_overlap = 0;
  const SimResult a = simulate(s, full), b = simulate(s, none);
  EXPECT_LT(a.makespan, b.makespan);
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i + 1 < s.ranks[r].size(); ++i)
      if (s.ranks[r][i].overlap_next) {
        // A chunk's F takes 0.5, its BW 1.5: the pair max(0.5, 1.5) with full overlap, the sum without.
        EXPECT_NEAR(a.times[r][i + 1].end - a.times[r][i].start, 1.5, 1e-12);
        EXPECT_NEAR(b.times[r][i + 1].end - b.times[r][i].start, 2.0, 1e-12);
      }
  EXPECT_GE(a.bubble_rate, 0.0);
}

TEST(Validator, RejectsBadPairs) {
  Schedule s = generate("1f1b", zb(2, 2, 0));
  Schedule last = s;
  last.ranks[0].back().overlap_next = true;
  EXPECT_FALSE(find_problems(last).empty());
  Schedule two_f = s;  // rank 0: F0 F1 BW0 BW1; F0 with F1 is no forward-backward pair
  two_f.ranks[0][0].overlap_next = true;
  auto problems = find_problems(two_f);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("a forward and then a backward"), std::string::npos) << problems[0];
  Schedule own = generate("gpipe", zb(1, 1, 0));  // F0 BW0 on one rank: its own backward
  own.ranks[0][0].overlap_next = true;
  EXPECT_FALSE(find_problems(own).empty());
  // Rank 1 of 1F1B p2 m2 runs F0 BW0 F1 BW1: F1 with BW1 would wait for itself.
  Schedule self = s;
  self.ranks[1][2].overlap_next = true;
  EXPECT_FALSE(find_problems(self).empty());
}

TEST(Simulator, StagesOfUnequalCost) {
  // 1F1B on 2 ranks, the second stage twice as heavy: every op waits for the heavy stage.
  Costs c;
  c.stages = {{1, 1, 1}, {2, 2, 2}};
  const SimResult r = simulate(generate("1f1b", zb(2, 4, 0)), c);
  // The heavy rank runs F0 from 1 and then its 4 F's and 4 BW's back to back (ends 25); the
  // first stage's last BW follows: 25 + 2.
  EXPECT_DOUBLE_EQ(r.makespan, 27);
  EXPECT_DOUBLE_EQ(r.per_rank[1].busy, 24);
  // The bubble counts the busiest rank's work: (max span - 24) / max span.
  EXPECT_NEAR(r.bubble_rate, (r.max_span - 24) / r.max_span, 1e-12);
  c.stages.pop_back();
  EXPECT_THROW(simulate(generate("1f1b", zb(2, 4, 0)), c), primus::Error);
  c.stages = {{1, 1, 1}, {1, 0, 1}};
  EXPECT_THROW(simulate(generate("1f1b", zb(2, 4, 0)), c), primus::Error);
  Costs bad;
  bad.pair_overlap = 1.5;
  EXPECT_THROW(simulate(generate("1f1b", zb(2, 4, 0)), bad), primus::Error);
}

TEST(Simulator, MemoryKeptBetweenBAndW) {
  // ZB-H1 p 4: worker i holds (p - i + 1) M_B + (i - 1) M_W (the paper's section 2.3).
  Costs c = times(1, 1, 1, 0, 0.25);
  const SimResult r = simulate(generate("zb-h1", zb(4, 8, 0)), c);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(r.per_rank[i].peak_activations, (4 - i) + i * 0.25, 1e-12) << i;
}
