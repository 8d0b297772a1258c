// Internal: the data dependencies of one op, shared by the validator, simulator and greedy
// scheduler. An op depends on "events" (F or B of a microbatch at a stage, BW counting as B).
#pragma once

#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline::detail {

enum Kind { kF = 0, kB = 1, kW = 2 };

struct Event {
  int kind;  // kF, kB or kW
  int microbatch;
  int stage;
};

// What `type` of (microbatch, stage) waits for, given S stages in total.
inline std::vector<Event> dependencies(OpType type, int mb, int stage, int S) {
  std::vector<Event> d;
  if (type == OpType::F) {
    if (stage > 0) d.push_back({kF, mb, stage - 1});
  } else if (type == OpType::B || type == OpType::BW) {
    d.push_back({kF, mb, stage});
    if (stage < S - 1) d.push_back({kB, mb, stage + 1});
  } else {
    d.push_back({kB, mb, stage});
  }
  return d;
}

// Table of event end times (negative: not yet happened), indexed [kind][microbatch][stage].
class EventTable {
 public:
  EventTable(int m, int S) : m_(m), S_(S), t_(3 * m * S, -1.0) {}
  double& at(int kind, int mb, int stage) { return t_[(kind * m_ + mb) * S_ + stage]; }
  double at(int kind, int mb, int stage) const { return t_[(kind * m_ + mb) * S_ + stage]; }
  bool done(const Event& e) const { return at(e.kind, e.microbatch, e.stage) >= 0; }
  // Records the end of an op: F marks kF, B marks kB, W marks kW, BW marks kB and kW.
  void record(OpType type, int mb, int stage, double end) {
    if (type == OpType::F) at(kF, mb, stage) = end;
    if (type == OpType::B || type == OpType::BW) at(kB, mb, stage) = end;
    if (type == OpType::W || type == OpType::BW) at(kW, mb, stage) = end;
  }

 private:
  int m_, S_;
  std::vector<double> t_;
};

// Runs each rank's ops in list order, each as soon as every event it depends on has happened
// (sends never block, so only data dependencies order the ranks), until no rank can move.
// `end_of(rank, index, op, stage, done)` gives the op's end time, which is recorded. Returns where
// each rank stopped: every position equals its list's size when the whole schedule ran.
template <typename EndOf>
std::vector<size_t> run_in_dependency_order(const Schedule& s, EventTable& done, EndOf&& end_of) {
  const int S = s.num_stages();
  std::vector<size_t> pos(s.pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.pp; ++r)
      while (pos[r] < s.ranks[r].size()) {
        const Op& op = s.ranks[r][pos[r]];
        const int st = s.stage_of(r, op.chunk);
        bool ready = true;
        for (auto& e : dependencies(op.type, op.microbatch, st, S)) ready = ready && done.done(e);
        if (!ready) break;
        done.record(op.type, op.microbatch, st, end_of(r, pos[r], op, st, done));
        ++pos[r];
        progress = true;
      }
  }
  return pos;
}

// True when every rank reached the end of its list.
inline bool ran_to_end(const Schedule& s, const std::vector<size_t>& pos) {
  for (int r = 0; r < s.pp; ++r)
    if (pos[r] < s.ranks[r].size()) return false;
  return true;
}

}  // namespace primus::pipeline::detail
