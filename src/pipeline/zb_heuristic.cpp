#include "pipeline/zb_heuristic.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "pipeline/simulator.h"

namespace primus::pipeline {

ZbProblem zb_problem(const ScheduleRequest& req) {
  ZbProblem z;
  z.pp = req.pp;
  z.microbatches = req.microbatches;
  check_costs(req.costs, req.pp);
  for (int s = 0; s < req.pp; ++s) z.stage.push_back(stage_cost(req.costs, 1, s));
  z.t_comm = req.costs.t_comm;
  z.memory_limit = req.memory_limit > 0 ? req.memory_limit : req.pp;
  z.activation_after_b = req.costs.activation_after_b;
  return z;
}

namespace {

constexpr double kEps = 1e-9;

// Plays the rules forward, keeping each stage's clock, counts, memory and idle time; every op is
// placed as early as its stage and its input allow, which is what the simulator computes for the
// same order.
class Heuristic {
 public:
  Heuristic(const ZbProblem& z, const ZbKnobs& k)
      : z_(z), k_(k), p_(z.pp), m_(z.microbatches), st_(z.pp),
        end_f_(size_t(z.pp) * z.microbatches, 0.0), end_b_(size_t(z.pp) * z.microbatches, 0.0),
        out_(make_empty("zb-auto", z.pp, 1, z.microbatches, Placement::Looped)) {}

  std::optional<Schedule> run() {
    if (!warm_up()) return std::nullopt;
    for (int i = 1; i < m_; ++i)
      if (!round(i)) return std::nullopt;
    for (int s = 0; s < p_; ++s)
      while (st_[s].nw < m_) place(s, OpType::W);
    attach_p2p(out_);
    return std::move(out_);
  }

 private:
  struct Stage {
    double clock = 0, mem = 0, idle = 0;
    int nf = 0, nb = 0, nw = 0;
  };

  double& end_f(int mb, int s) { return end_f_[size_t(mb) * p_ + s]; }
  double& end_b(int mb, int s) { return end_b_[size_t(mb) * p_ + s]; }
  const StageCost& cost(int s) const { return z_.stage[s]; }

  // When the input of stage s's next op of `type` is there.
  double input_ready(int s, OpType type) {
    Stage& t = st_[s];
    if (type == OpType::F) return s > 0 ? end_f(t.nf, s - 1) + z_.t_comm : 0.0;
    if (type == OpType::B) return s + 1 < p_ ? end_b(t.nb, s + 1) + z_.t_comm : end_f(t.nb, s);
    return end_b(t.nw, s);
  }

  void place(int s, OpType type) {
    Stage& t = st_[s];
    const double start = std::max(t.clock, input_ready(s, type));
    if (t.nf > 0) t.idle += start - t.clock;  // a stage's span starts with its first op
    const double end = start + (type == OpType::F ? cost(s).forward : type == OpType::B ? cost(s).backward
                                                                                          : cost(s).weight);
    t.clock = end;
    int mb = 0;
    if (type == OpType::F) mb = t.nf++, end_f(mb, s) = end, t.mem += 1;
    if (type == OpType::B) mb = t.nb++, end_b(mb, s) = end, t.mem -= 1 - z_.activation_after_b;
    if (type == OpType::W) mb = t.nw++, t.mem -= z_.activation_after_b;
    out_.ranks[s].push_back(Op{type, mb, 0, {}, {}});
  }

  double max_idle() const {
    double worst = 0;
    for (const Stage& t : st_) worst = std::max(worst, t.idle);
    return worst;
  }

  // W's before an op whose input arrives at `arrive`: every W that ends by then, and one more
  // into a remaining shorter gap when that gap would make this stage the idlest (or always, with
  // fill_small_gaps).
  void fill_gap(int s, double arrive) {
    Stage& t = st_[s];
    while (t.nw < t.nb && t.clock + cost(s).weight <= arrive + kEps) place(s, OpType::W);
    if (t.nw < t.nb && t.clock < arrive - kEps)
      if (k_.fill_small_gaps || t.idle + (arrive - t.clock) > max_idle() + kEps) place(s, OpType::W);
  }

  // W's until stage s's next F fits in the memory; false when no W is left to free any.
  bool make_room(int s) {
    Stage& t = st_[s];
    while (t.mem + 1 > z_.memory_limit + kEps) {
      if (t.nw >= t.nb) return false;
      place(s, OpType::W);
    }
    return true;
  }

  bool warm_up() {
    for (int s = 0; s < p_; ++s) {
      if (!make_room(s)) return false;
      place(s, OpType::F);
    }
    // Extra forwards per stage, estimated from the last stage back: stage s can run them until
    // the first B's gradient arrives from stage s+1.
    std::vector<int> extra(p_, 0);
    double b_end = end_f(0, p_ - 1) + cost(p_ - 1).backward;  // the last stage runs B0 at once
    for (int s = p_ - 2; s >= 0; --s) {
      const Stage& t = st_[s];
      const double arrive = b_end + z_.t_comm, f = cost(s).forward;
      int k = 0;
      while (t.nf + k < m_ && t.mem + k + 1 <= z_.memory_limit + kEps) {
        const bool fits = k_.fill_before_first_b ? t.clock + k * f < arrive - kEps
                                                 : t.clock + (k + 1) * f <= arrive + kEps;
        if (!fits) break;
        ++k;
      }
      extra[s] = k;
      b_end = std::max(t.clock + k * f, arrive) + cost(s).backward;
    }
    // The lead invariant: each stage fewer extra forwards than the one before it.
    for (int s = 1; s < p_; ++s)
      while (extra[s] > 0 && extra[s] >= extra[s - 1] && st_[s].nf + extra[s] < m_) --extra[s];
    for (int s = 0; s < p_; ++s)
      for (int k = 0; k < extra[s]; ++k) place(s, OpType::F);
    for (int s = p_ - 1; s >= 0; --s) place(s, OpType::B);
    return true;
  }

  // Round i: the F's (stages in order), then B of microbatch i (last stage first).
  bool round(int i) {
    std::vector<char> want(p_);
    for (int s = 0; s < p_; ++s) want[s] = st_[s].nf < m_;
    if (k_.skip_ahead)
      for (int s = 0; s + 1 < p_; ++s)
        if (want[s] && st_[s].nf >= st_[s + 1].nf + 2) want[s] = !skip_f(s);
    for (int s = p_ - 2; s >= 0; --s) want[s] = want[s] && want[s + 1];
    for (int s = 0; s < p_; ++s) {
      if (!want[s]) continue;
      if (!make_room(s)) return false;
      if (s > 0) fill_gap(s, input_ready(s, OpType::F));
      place(s, OpType::F);
    }
    for (int s = p_ - 1; s >= 0; --s) {
      Stage& t = st_[s];
      PRIMUS_CHECK(t.nb == i && t.nf > i, "zb heuristic: stage {} at B{} with {} forwards", s, t.nb, t.nf);
      fill_gap(s, input_ready(s, OpType::B));
      // Nothing waits for the first stage's B once its forwards are done: its W's go first.
      if (s == 0 && t.nf == m_)
        while (t.nw < t.nb) place(s, OpType::W);
      place(s, OpType::B);
    }
    return true;
  }

  // Whether stage s (at least two F's ahead of s+1) leaves its F for later this round.
  bool skip_f(int s) {
    const Stage& t = st_[s];
    const Stage& next = st_[s + 1];
    // The round's B reaches stage s after stage s+1 runs its F and its B.
    const double due = next.clock + cost(s + 1).forward + cost(s + 1).backward + z_.t_comm;
    if (t.clock >= due) return true;
    // The F, plus the W's that must run first to make room for it.
    double need = cost(s).forward, mem = t.mem + 1;
    for (int w = t.nw; mem > z_.memory_limit + kEps && w < t.nb; ++w) need += cost(s).weight, mem -= z_.activation_after_b;
    if (t.clock + need <= due + kEps) return false;
    return due - t.clock <= max_idle() - t.idle + kEps;
  }

  const ZbProblem& z_;
  ZbKnobs k_;
  int p_, m_;
  std::vector<Stage> st_;
  std::vector<double> end_f_, end_b_;
  Schedule out_;
};

}  // namespace

std::optional<Schedule> zb_heuristic(const ZbProblem& z, const ZbKnobs& knobs) {
  if (z.pp < 1 || z.microbatches < 1 || int(z.stage.size()) != z.pp)
    fail("zb heuristic: {} stage costs for pp {} (microbatches {})", z.stage.size(), z.pp, z.microbatches);
  return Heuristic(z, knobs).run();
}

Schedule zb_heuristic_best(const ZbProblem& z) {
  if (z.memory_limit < 1 - kEps)
    fail("memory limit {} is too small for any schedule: each rank must hold at least 1 microbatch activation",
         z.memory_limit);
  Costs costs;
  costs.t_comm = z.t_comm;
  costs.stages = z.stage;
  costs.activation_after_b = z.activation_after_b;
  std::optional<Schedule> best;
  double best_span = 0, best_makespan = 0;
  for (bool fill_first : {false, true})
    for (bool small_gaps : {false, true})
      for (bool skip : {false, true}) {
        std::optional<Schedule> s = zb_heuristic(z, {fill_first, small_gaps, skip});
        if (!s) continue;
        const SimResult r = simulate(*s, costs);
        if (best && (r.max_span > best_span + kEps ||
                     (r.max_span > best_span - kEps && r.makespan >= best_makespan - kEps)))
          continue;
        best = std::move(s), best_span = r.max_span, best_makespan = r.makespan;
      }
  if (!best)
    fail("zb-auto: no schedule keeps the memory limit of {} microbatch activations (pp {}, microbatches {})",
         z.memory_limit, z.pp, z.microbatches);
  return std::move(*best);
}

}  // namespace primus::pipeline
