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

}  // namespace primus::pipeline::detail
