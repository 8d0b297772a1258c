#include "checkpoint/reshard.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace primus::checkpoint {
namespace {

// Parts of `x` not covered by `covered` (sorted, disjoint).
std::vector<Interval> subtract(Interval x, const std::vector<Interval>& covered) {
  std::vector<Interval> out;
  int64_t at = x.a;
  for (const Interval& c : covered) {
    if (c.b <= at) continue;
    if (c.a >= x.b) break;
    if (c.a > at) out.push_back({at, c.a});
    at = std::max(at, c.b);
    if (at >= x.b) break;
  }
  if (at < x.b) out.push_back({at, x.b});
  return out;
}

void insert(std::vector<Interval>& covered, Interval x) {
  covered.push_back(x);
  std::sort(covered.begin(), covered.end(), [](const Interval& l, const Interval& r) { return l.a < r.a; });
  std::vector<Interval> merged;
  for (const Interval& c : covered) {
    if (!merged.empty() && c.a <= merged.back().b)
      merged.back().b = std::max(merged.back().b, c.b);
    else
      merged.push_back(c);
  }
  covered = std::move(merged);
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int k = int(s.size()) - 2; k >= 0; --k) st[k] = st[k + 1] * s[k + 1];
  return st;
}

}  // namespace

Placement make_placement(Shape shape, int dim, std::vector<ShardPiece> pieces) {
  Placement p;
  p.shape = std::move(shape);
  p.dim = pieces.empty() ? -1 : dim;
  p.pieces = std::move(pieces);
  int64_t at = 0;
  for (const ShardPiece& pc : p.pieces) {
    p.local_start.push_back(at);
    at += pc.length;
  }
  return p;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::string describe(const Placement& p) {
  if (p.dim < 0) return "whole";
  std::vector<std::string> parts;
  for (const ShardPiece& pc : p.pieces)
    parts.push_back(fmt::format("[{}, {})", pc.global_start, pc.global_start + pc.length));
  return fmt::format("dim {} {}", p.dim, fmt::join(parts, "+"));
}

std::string placement_problem(const Placement& p, const Shape& global) {
  if (p.shape.size() != global.size())
    return fmt::format("local shape {} has another rank than the global {}", shape_str(p.shape), shape_str(global));
  if (!p.pieces.empty() && (p.dim < 0 || p.dim >= int(global.size())))
    return fmt::format("shard dim {} out of range", p.dim);
  int64_t sum = 0;
  for (const ShardPiece& pc : p.pieces) {
    if (pc.global_start < 0 || pc.length <= 0 || pc.global_start + pc.length > global[p.dim])
      return fmt::format("piece [{}, +{}) outside dim {} of size {}", pc.global_start, pc.length, p.dim, global[p.dim]);
    sum += pc.length;
  }
  for (size_t k = 0; k < global.size(); ++k) {
    const int64_t want = int(k) == p.dim ? sum : global[k];
    if (p.shape[k] != want)
      return fmt::format("local shape {} does not match its pieces ({})", shape_str(p.shape), describe(p));
  }
  return "";
}

PlanResult plan(const std::string& tensor, const Shape& global, const Placement& target,
                const std::vector<const Entry*>& entries, const CopyFn& copy) {
  if (global.empty()) {  // a scalar: any copy holds all of it
    if (entries.empty()) return {0, {{0, 1}}};
    copy(*entries.front(), {}, {}, {}, {});
    return {0, {}};
  }
  int ds = -1;
  for (const Entry* e : entries) {
    if (e->place.dim < 0) continue;
    if (ds >= 0 && e->place.dim != ds)
      fail("tensor {} is split along dim {} in {} but along dim {} in another file; one checkpoint has one layout",
           tensor, e->place.dim, e->file, ds);
    ds = e->place.dim;
  }
  if (ds < 0) ds = target.dim >= 0 ? target.dim : 0;
  const int dt = target.dim;

  struct Need {
    Interval range;
    int64_t local_start = 0;
    std::vector<Interval> covered;
  };
  std::vector<Need> needs;
  if (dt == ds)
    for (size_t i = 0; i < target.pieces.size(); ++i)
      needs.push_back({{target.pieces[i].global_start, target.pieces[i].global_start + target.pieces[i].length},
                       target.local_start[i],
                       {}});
  else  // the target holds all of dim ds
    needs.push_back({{0, global[ds]}, 0, {}});

  // Whole copies first: one file then serves the tensor.
  std::vector<const Entry*> order(entries);
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* l, const Entry* r) { return (l->place.dim < 0) > (r->place.dim < 0); });
  const size_t R = global.size();
  for (const Entry* e : order) {
    std::vector<ShardPiece> src_pieces = e->place.pieces;
    std::vector<int64_t> src_local = e->place.local_start;
    if (e->place.dim < 0) {
      src_pieces = {{0, global[ds]}};
      src_local = {0};
    }
    for (size_t sp = 0; sp < src_pieces.size(); ++sp) {
      const Interval s{src_pieces[sp].global_start, src_pieces[sp].global_start + src_pieces[sp].length};
      for (Need& need : needs) {
        const Interval x{std::max(s.a, need.range.a), std::min(s.b, need.range.b)};
        if (x.a >= x.b) continue;
        for (const Interval& sub : subtract(x, need.covered)) {
          std::vector<int64_t> lo(R, 0), hi(global.begin(), global.end()), src_shift(R, 0), dst_shift(R, 0);
          lo[ds] = sub.a;
          hi[ds] = sub.b;
          src_shift[ds] = src_local[sp] - s.a;
          dst_shift[ds] = need.local_start - need.range.a;
          if (dt >= 0 && dt != ds) {
            for (size_t tp = 0; tp < target.pieces.size(); ++tp) {
              lo[dt] = target.pieces[tp].global_start;
              hi[dt] = lo[dt] + target.pieces[tp].length;
              dst_shift[dt] = target.local_start[tp] - lo[dt];
              copy(*e, lo, hi, src_shift, dst_shift);
            }
          } else {
            copy(*e, lo, hi, src_shift, dst_shift);
          }
          insert(need.covered, sub);
        }
      }
    }
  }
  PlanResult r;
  r.dim = ds;
  for (const Need& need : needs)
    for (const Interval& g : subtract(need.range, need.covered)) r.gaps.push_back(g);
  return r;
}

void for_each_run(const Shape& src_shape, const Shape& dst_shape, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, const std::vector<int64_t>& src_shift,
                  const std::vector<int64_t>& dst_shift, const std::function<void(int64_t, int64_t, int64_t)>& run) {
  const int R = int(lo.size());
  if (R == 0) return run(0, 0, 1);
  // Dims after the deepest restricted or shifted one are whole on both sides: one run spans them.
  int m = 0;
  for (int k = 0; k < R; ++k)
    if (lo[k] != 0 || hi[k] != src_shape[k] || hi[k] != dst_shape[k] || src_shift[k] != 0 || dst_shift[k] != 0) m = k;
  const std::vector<int64_t> ss = strides_of(src_shape), ds = strides_of(dst_shape);
  const int64_t count = (hi[m] - lo[m]) * ss[m];  // ss[m] == ds[m]: the dims after m match
  for (int k = 0; k <= m; ++k)
    if (hi[k] <= lo[k]) return;
  std::vector<int64_t> x(lo.begin(), lo.begin() + m);
  while (true) {
    int64_t so = (lo[m] + src_shift[m]) * ss[m], d = (lo[m] + dst_shift[m]) * ds[m];
    for (int k = 0; k < m; ++k) {
      so += (x[k] + src_shift[k]) * ss[k];
      d += (x[k] + dst_shift[k]) * ds[k];
    }
    run(so, d, count);
    int k = m - 1;
    for (; k >= 0; --k) {
      if (++x[k] < hi[k]) break;
      x[k] = lo[k];
    }
    if (k < 0) return;
  }
}

std::string files_holding(const SavedTensor& st) {
  std::vector<std::string> parts;
  for (const Entry& e : st.entries) parts.push_back(fmt::format("{} ({})", e.file, describe(e.place)));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

std::string gaps_str(const PlanResult& r) {
  std::vector<std::string> parts;
  for (const Interval& g : r.gaps) parts.push_back(fmt::format("[{}, {})", g.a, g.b));
  return fmt::format("{} along dim {}", fmt::join(parts, ", "), r.dim);
}

}  // namespace primus::checkpoint
