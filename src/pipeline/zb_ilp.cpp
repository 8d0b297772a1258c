#include "pipeline/zb_ilp.h"

#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "pipeline/simulator.h"
#include "pipeline/validator.h"

#ifdef PRIMUS_HAVE_CBC
#include <coin/Cbc_C_Interface.h>
#endif

namespace primus::pipeline {

namespace {

constexpr double kIlpEps = 1e-9;

Costs costs_of(const ZbProblem& z) {
  Costs c;
  c.t_comm = z.t_comm;
  c.stages = z.stage;
  c.activation_after_b = z.activation_after_b;
  return c;
}

}  // namespace

bool zb_ilp_available() {
#ifdef PRIMUS_HAVE_CBC
  return true;
#else
  return false;
#endif
}

#ifndef PRIMUS_HAVE_CBC

ZbIlpResult zb_ilp_refine(const ZbProblem& z, const Schedule& start, const ZbIlpBudget&) {
  ZbIlpResult res;
  res.schedule = start;
  res.span = res.start_span = simulate(start, costs_of(z)).max_span;
  res.status = "ILP refinement not built in (install coinor-libcbc-dev and rebuild)";
  return res;
}

#else

namespace {

constexpr double kInf = std::numeric_limits<double>::max();  // CBC's "no bound" (COIN_DBL_MAX)

// The linear program in column form, rows as (lower, upper) bounds on a sum of terms.
class Lp {
 public:
  int add_col(double lb, double ub, double obj, bool integer) {
    lb_.push_back(lb), ub_.push_back(ub), obj_.push_back(obj), integer_.push_back(integer);
    cols_.emplace_back();
    return int(lb_.size()) - 1;
  }
  // lb <= sum coef * x[col] <= ub
  void add_row(std::initializer_list<std::pair<int, double>> terms, double lb, double ub) {
    add_row(std::vector<std::pair<int, double>>(terms), lb, ub);
  }
  void add_row(const std::vector<std::pair<int, double>>& terms, double lb, double ub) {
    const int row = int(row_lb_.size());
    row_lb_.push_back(lb), row_ub_.push_back(ub);
    for (auto [col, coef] : terms) cols_[col].push_back({row, coef});
  }
  int num_cols() const { return int(lb_.size()); }

  void load(Cbc_Model* model) const {
    std::vector<CoinBigIndex> start{0};
    std::vector<int> index;
    std::vector<double> value;
    for (const auto& col : cols_) {
      for (auto [row, coef] : col) index.push_back(row), value.push_back(coef);
      start.push_back(CoinBigIndex(index.size()));
    }
    Cbc_loadProblem(model, num_cols(), int(row_lb_.size()), start.data(), index.data(), value.data(), lb_.data(),
                    ub_.data(), obj_.data(), row_lb_.data(), row_ub_.data());
    for (int c = 0; c < num_cols(); ++c)
      if (integer_[c]) Cbc_setInteger(model, c);
  }

 private:
  std::vector<double> lb_, ub_, obj_, row_lb_, row_ub_;
  std::vector<char> integer_;
  std::vector<std::vector<std::pair<int, double>>> cols_;
};

enum Kind { kF = 0, kB = 1, kW = 2 };

}  // namespace

ZbIlpResult zb_ilp_refine(const ZbProblem& z, const Schedule& start, const ZbIlpBudget& budget) {
  const int p = z.pp, m = z.microbatches;
  const Costs costs = costs_of(z);
  const SimResult start_sim = simulate(start, costs);
  ZbIlpResult res;
  res.schedule = start;
  res.span = res.start_span = start_sim.max_span;
  res.binaries = 3 * p * (m * (m - 1) / 2);
  if (res.binaries == 0) {
    res.status = "ILP not needed: one microbatch leaves nothing to order";
    return res;
  }
  if (res.binaries > kZbIlpMaxBinaries) {
    res.status = fmt::format("ILP skipped: {} order variables, more than {} (the heuristic's schedule is kept)",
                             res.binaries, kZbIlpMaxBinaries);
    return res;
  }
  if (budget.seconds <= 0 && budget.nodes <= 0) {
    res.status = "ILP skipped: no time or node budget";
    return res;
  }
  // No stage can be busy for less than its work: at that bound nothing is left to gain.
  double busiest = 0;
  for (const StageCost& c : z.stage) busiest = std::max(busiest, m * (c.forward + c.backward + c.weight));
  if (start_sim.max_span <= busiest + kIlpEps) {
    res.lower_bound = busiest;
    res.optimal = true;
    res.status = fmt::format("ILP not needed: the heuristic's span {:.6g} is the busiest stage's work", res.span);
    return res;
  }

  auto dur = [&](int s, int kind) {
    const StageCost& c = z.stage[s];
    return kind == kF ? c.forward : kind == kB ? c.backward : c.weight;
  };
  // Each stage's first forward at its earliest end time; the stage's span starts there.
  std::vector<double> first_end(p), span_start(p);
  for (int s = 0; s < p; ++s) {
    first_end[s] = (s ? first_end[s - 1] + z.t_comm : 0.0) + dur(s, kF);
    span_start[s] = first_end[s] - dur(s, kF);
  }
  const double horizon = span_start[p - 1] + start_sim.max_span;
  double longest = 0;
  for (int s = 0; s < p; ++s) longest = std::max({longest, dur(s, kF), dur(s, kB), dur(s, kW)});
  const double big_m = horizon + longest;

  Lp lp;
  std::vector<int> end_col(size_t(p) * 3 * m);
  auto E = [&](int s, int kind, int j) { return end_col[(size_t(s) * 3 + kind) * m + j]; };
  for (int s = 0; s < p; ++s)
    for (int kind = 0; kind < 3; ++kind)
      for (int j = 0; j < m; ++j) {
        const bool first = kind == kF && j == 0, last = kind == kW && j == m - 1;
        // Every pass of the stage runs between its first F and its last W.
        const StageCost& c = z.stage[s];
        const double lb = first ? first_end[s]
                          : last ? span_start[s] + m * (c.forward + c.backward + c.weight)
                                 : first_end[s] + dur(s, kind);
        end_col[(size_t(s) * 3 + kind) * m + j] = lp.add_col(lb, first ? first_end[s] : horizon, 0.0, false);
      }
  const int span = lp.add_col(busiest, horizon, 1.0, false);
  for (int s = 0; s < p; ++s) {
    lp.add_row({{span, 1.0}, {E(s, kW, m - 1), -1.0}}, -span_start[s], kInf);  // (3)
    for (int kind = 0; kind < 3; ++kind)  // one kind in microbatch order
      for (int j = 1; j < m; ++j) lp.add_row({{E(s, kind, j), 1.0}, {E(s, kind, j - 1), -1.0}}, dur(s, kind), kInf);
    for (int j = 0; j < m; ++j) {
      if (s > 0) lp.add_row({{E(s, kF, j), 1.0}, {E(s - 1, kF, j), -1.0}}, z.t_comm + dur(s, kF), kInf);  // (4)
      if (s + 1 < p)
        lp.add_row({{E(s, kB, j), 1.0}, {E(s + 1, kB, j), -1.0}}, z.t_comm + dur(s, kB), kInf);  // (5)
      else
        lp.add_row({{E(s, kB, j), 1.0}, {E(s, kF, j), -1.0}}, dur(s, kB), kInf);
      lp.add_row({{E(s, kW, j), 1.0}, {E(s, kB, j), -1.0}}, dur(s, kW), kInf);
    }
  }
  // The open pairs: (first kind, microbatch a) before or after (second kind, microbatch b < a).
  struct Pair {
    int s, u_kind, a, v_kind, b, col;
  };
  std::vector<Pair> pairs;
  const std::array<std::pair<int, int>, 3> kinds = {{{kF, kB}, {kF, kW}, {kB, kW}}};
  for (int s = 0; s < p; ++s)
    for (auto [uk, vk] : kinds)
      for (int a = 1; a < m; ++a)
        for (int b = 0; b < a; ++b) {
          const int y = lp.add_col(0.0, 1.0, 0.0, true);  // 1: (uk, a) runs before (vk, b)
          pairs.push_back({s, uk, a, vk, b, y});
          const int u = E(s, uk, a), v = E(s, vk, b);
          lp.add_row({{v, 1.0}, {u, -1.0}, {y, -big_m}}, dur(s, vk) - big_m, kInf);  // (6)
          lp.add_row({{u, 1.0}, {v, -1.0}, {y, big_m}}, dur(s, uk), kInf);
        }
  // (7): after F_a, (a + 1) activations minus what the B's and W's before it freed. With y = 1
  // for the (F_a, B_b) and (F_a, W_b) pairs run after F_a, that is
  //   (1 - kept) sum_b y(F_a, B_b) + kept sum_b y(F_a, W_b) <= limit - 1.
  const double kept = z.activation_after_b;
  {
    std::vector<std::vector<std::pair<int, double>>> memory_rows(size_t(p) * m);
    for (const Pair& q : pairs)
      if (q.u_kind == kF) memory_rows[size_t(q.s) * m + q.a].push_back({q.col, q.v_kind == kB ? 1.0 - kept : kept});
    for (auto& row : memory_rows)
      if (!row.empty()) lp.add_row(row, -kInf, z.memory_limit - 1.0 + kIlpEps);
  }

  // The start: each pair's order as the heuristic ran it.
  std::vector<std::vector<int>> position(size_t(p) * 3, std::vector<int>(m, -1));
  for (int s = 0; s < p; ++s)
    for (size_t i = 0; i < start.ranks[s].size(); ++i) {
      const Op& op = start.ranks[s][i];
      const int kind = op.type == OpType::F ? kF : op.type == OpType::B ? kB : kW;
      position[size_t(s) * 3 + kind][op.microbatch] = int(i);
    }
  std::vector<int> start_cols;
  std::vector<double> start_values;
  for (const Pair& q : pairs) {
    start_cols.push_back(q.col);
    start_values.push_back(position[size_t(q.s) * 3 + q.u_kind][q.a] < position[size_t(q.s) * 3 + q.v_kind][q.b] ? 1.0 : 0.0);
  }

  Cbc_Model* model = Cbc_newModel();
  lp.load(model);
  Cbc_setObjSense(model, 1.0);
  Cbc_setLogLevel(model, 0);
  // CBC 2.10's preprocessing crashes in its post-processing on some of these models when the
  // time limit ends it (CglPreProcess::postProcess, p 8 m 32); the search runs without it.
  Cbc_setParameter(model, "preprocess", "off");
  Cbc_setParameter(model, "cuts", "off");
  if (budget.nodes > 0) {
    Cbc_setMaximumNodes(model, budget.nodes);
  } else {
    Cbc_setParameter(model, "timeMode", "elapsed");
    Cbc_setMaximumSeconds(model, budget.seconds);
  }
  Cbc_setMIPStartI(model, int(start_cols.size()), start_cols.data(), start_values.data());
  Cbc_solve(model);
  res.ran = true;
  res.optimal = Cbc_isProvenOptimal(model) != 0;
  res.lower_bound = Cbc_getBestPossibleObjValue(model);
  const double* x = Cbc_bestSolution(model);
  std::vector<double> ends;
  if (x) ends.assign(x, x + lp.num_cols());
  const int secondary = Cbc_secondaryStatus(model);
  Cbc_deleteModel(model);

  std::string how = res.optimal ? "proved optimal" : secondary == 4 ? "time limit" : secondary == 3 ? "node limit" : "stopped";
  if (ends.empty()) {
    res.status = fmt::format("ILP ({} binaries): no solution ({}); the heuristic's schedule is kept", res.binaries, how);
    return res;
  }
  // The ILP's order per stage, by end time, run again by the simulator.
  Schedule ilp = make_empty(start.algorithm, p, 1, m, Placement::Looped);
  for (int s = 0; s < p; ++s) {
    std::vector<std::pair<double, Op>> ops;
    for (int kind = 0; kind < 3; ++kind)
      for (int j = 0; j < m; ++j)
        ops.push_back({ends[E(s, kind, j)], Op{kind == kF ? OpType::F : kind == kB ? OpType::B : OpType::W, j, 0, {}, {}}});
    std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [t, op] : ops) ilp.ranks[s].push_back(op);
  }
  attach_p2p(ilp);
  if (!find_problems(ilp).empty()) {
    res.status = fmt::format("ILP ({} binaries, {}): its order does not validate; the heuristic's schedule is kept",
                             res.binaries, how);
    return res;
  }
  const SimResult sim = simulate(ilp, costs);
  if (sim.peak_activations <= z.memory_limit + 1e-6 &&
      (sim.max_span < start_sim.max_span - kIlpEps ||
       (sim.max_span < start_sim.max_span + kIlpEps && sim.makespan < start_sim.makespan - kIlpEps))) {
    res.schedule = std::move(ilp);
    res.span = sim.max_span;
    res.improved = true;
  }
  res.status = fmt::format("ILP ({} binaries, {}): span {:.6g} from the heuristic's {:.6g}, lower bound {:.6g}",
                           res.binaries, how, res.span, res.start_span, res.lower_bound);
  return res;
}

#endif

}  // namespace primus::pipeline
