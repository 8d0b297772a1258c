// The resharding geometry of checkpoints: which parts of the saved slices of a global tensor fill
// a rank's slice of it, whatever layouts saved and load it (tp, pp, ep, vpp, any precision).
// Pure arithmetic over shapes and ranges, no files: checkpoint.cpp reads what plan() says to copy.
// A part of src/checkpoint; its callers use checkpoint/checkpoint.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/param_store.h"

namespace primus::checkpoint {

struct Interval {
  int64_t a = 0, b = 0;  // [a, b)
};

// A slice of a global tensor: its local tensor concatenates, along dim, the pieces (global start,
// length); local_start[i] is where piece i begins in the local tensor. dim -1: the whole tensor.
struct Placement {
  Shape shape;  // local
  int dim = -1;
  std::vector<ShardPiece> pieces;
  std::vector<int64_t> local_start;
};

// One saved slice of a tensor: where it lives and what it holds.
struct Entry {
  std::string file;
  int64_t offset = 0;  // elements, into the file's sections
  Placement place;
};

// Each saved tensor: its global shape and its slices, as meta.json indexes them.
struct SavedTensor {
  Shape global;
  std::vector<Entry> entries;
};

Placement make_placement(Shape shape, int dim, std::vector<ShardPiece> pieces);
int64_t numel_of(const Shape& s);
std::string shape_str(const Shape& s);     // "[4, 64]"
std::string describe(const Placement& p);  // "whole", "dim 0 [0, 32)+[64, 96)"
// Checks that a placement is possible for a tensor of `global` shape; returns the problem or "".
std::string placement_problem(const Placement& p, const Shape& global);

// The work of filling one target placement from saved entries: calls copy(entry, box_lo, box_hi,
// src_shift, dst_shift) for disjoint boxes that together cover the target, reading each global
// element once (replicas and overlapping slices are skipped), and returns the ranges along the
// saved dim that no entry covers (empty: complete). All saved slices of one tensor share a dim
// (they come from one layout), so coverage is tracked along that dim only.
using CopyFn = std::function<void(const Entry&, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                                  const std::vector<int64_t>& src_shift, const std::vector<int64_t>& dst_shift)>;

struct PlanResult {
  int dim = 0;
  std::vector<Interval> gaps;
};

PlanResult plan(const std::string& tensor, const Shape& global, const Placement& target,
                const std::vector<const Entry*>& entries, const CopyFn& copy);

// Calls run(src_offset, dst_offset, count) for the contiguous runs of the box [lo, hi) of a global
// tensor, in increasing source order; local coordinate = global + shift on each side.
void for_each_run(const Shape& src_shape, const Shape& dst_shape, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, const std::vector<int64_t>& src_shift,
                  const std::vector<int64_t>& dst_shift, const std::function<void(int64_t, int64_t, int64_t)>& run);

// For messages: the files holding a tensor's slices, and the ranges a plan left uncovered.
std::string files_holding(const SavedTensor& st);
std::string gaps_str(const PlanResult& r);

}  // namespace primus::checkpoint
