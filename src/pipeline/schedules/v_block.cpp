// The building-block construction of V-Half and V-Min (Qi et al., "Pipeline Parallelism with
// Controllable Memory", NeurIPS 2024, sections 3-4). Works on a grid of unit slots per rank: the
// block puts each microbatch's F0, F1, B1, B0 at fixed offsets, repeated every 6 slots; the W's go
// into the free slots. The steady part of such a schedule has no bubble and a memory fixed by the
// block's lifespan; the warm-up and cool-down are then squeezed into earlier free slots without
// raising that memory.
#include <algorithm>
#include <cmath>
#include <deque>
#include <tuple>

#include "core/error.h"
#include "pipeline/simulator.h"
#include "pipeline/schedules/v_common.h"

namespace primus::pipeline::detail {

// Block offsets (the paper's Figure 4 blocks; the extra gap keeps the four passes of a rank on
// distinct slots modulo 6 when p is a multiple of 3 resp. 2).
std::vector<BlockOffsets> v_min_block(int p) {
  const int gap = p % 3 == 0 ? 2 : 0;
  std::vector<BlockOffsets> b(p);
  for (int i = 0; i < p; ++i) b[i] = {i, 2 * p - 1 - i, 2 * p + gap + i, 4 * p + gap - 1 - i};
  return b;
}

std::vector<BlockOffsets> v_half_block(int p) {
  const int gap = p % 2 == 0 ? 3 : 0;
  std::vector<BlockOffsets> b(p);
  for (int i = 0; i < p; ++i)
    b[i] = {2 * i, 3 * p - i - 2, 3 * p + gap + 2 * i - 1, 6 * p + gap - i - 2};
  return b;
}

int peak_chunks(const Schedule& s) {
  // Ops on a rank run one at a time, so the live count follows from the order alone.
  int peak = 0;
  for (auto& ops : s.ranks) {
    int cur = 0;
    for (auto& op : ops) {
      if (op.type == OpType::F) peak = std::max(peak, ++cur);
      if (op.type == OpType::W || op.type == OpType::BW) --cur;
    }
  }
  return peak;
}

namespace {

constexpr int kEmpty = -1;

struct Slot {
  int type = kEmpty;  // kEmpty or an OpType value
  int mb = 0, chunk = 0;
};

using Grid = std::vector<Slot>;  // one rank's slots

// Where each op sits: [rank][type][chunk][microbatch] -> slot.
struct Positions {
  int m;
  std::vector<int> at;
  Positions(int p, int m_) : m(m_), at((size_t)p * 3 * 2 * m_, -1) {}
  int& operator()(int r, int type, int chunk, int mb) { return at[(((size_t)r * 3 + type) * 2 + chunk) * m + mb]; }
};

// W's in free slots: each free slot takes the oldest pending W, of chunk `pref` if any is pending.
// Existing W's are dropped first.
Grid place_w(const Grid& g, int pref) {
  Grid out;
  std::deque<int> pending[2];
  for (size_t t = 0; t < g.size() || !pending[0].empty() || !pending[1].empty(); ++t) {
    Slot s = t < g.size() ? g[t] : Slot{};
    if (s.type == (int)OpType::W) s = Slot{};
    if (s.type == kEmpty) {
      for (int c : {pref, 1 - pref})
        if (!pending[c].empty()) {
          s = Slot{(int)OpType::W, pending[c].front(), c};
          pending[c].pop_front();
          break;
        }
    } else if (s.type == (int)OpType::B) {
      pending[s.chunk].push_back(s.mb);
    }
    out.push_back(s);
  }
  while (!out.empty() && out.back().type == kEmpty) out.pop_back();
  return out;
}

// Peak chunk activations of a rank's grid; W's that are not in the grid are taken to run in
// the first free slots after their B (what place_w will do).
int grid_memory(const Grid& g) {
  int cur = 0, peak = 0, unplaced = 0;
  for (const Slot& s : g) {
    if (s.type == (int)OpType::F) ++cur;
    else if (s.type == (int)OpType::B) ++unplaced;
    else if (s.type == (int)OpType::W) --cur, --unplaced;
    else if (unplaced > 0) --cur, --unplaced;
    peak = std::max(peak, cur);
  }
  return peak;
}

// Earliest slot the op may take: one after each of its inputs (unit op times, no transfer time)
// and after the same pass of the previous microbatch on this rank.
int earliest(int p, Positions& pos, int r, int type, int chunk, int mb) {
  int t = 0;
  auto after = [&](int rr, int ty, int c, int b) { t = std::max(t, pos(rr, ty, c, b) + 1); };
  const int F = (int)OpType::F, B = (int)OpType::B;
  if (type == F) {
    if (chunk == 0 && r > 0) after(r - 1, F, 0, mb);
    if (chunk == 1) r < p - 1 ? after(r + 1, F, 1, mb) : after(r, F, 0, mb);
  } else if (type == B) {
    after(r, F, chunk, mb);
    if (chunk == 1 && r > 0) after(r - 1, B, 1, mb);
    if (chunk == 0) r < p - 1 ? after(r + 1, B, 0, mb) : after(r, B, 1, mb);
  } else {
    after(r, B, chunk, mb);
  }
  if (mb > 0) after(r, type, chunk, mb - 1);
  return t;
}

// The squeeze: in slot order, each op of the warm-up (only when `move_warmup`) and of the
// cool-down moves to the earliest free slot its inputs allow, if that keeps its rank within
// the memory of the unsqueezed schedule. The steady part (from rank 0's first chunk-0 B to its
// last chunk-0 F) stays where the block put it.
void squeeze(int p, int m, std::vector<Grid>& grids, bool move_warmup) {
  int limit = 0;
  for (auto& g : grids) limit = std::max(limit, grid_memory(g));
  Positions pos(p, m);
  std::vector<std::tuple<int, int, Slot>> items;  // (slot, rank, op)
  for (int r = 0; r < p; ++r)
    for (int t = 0; t < (int)grids[r].size(); ++t)
      if (const Slot& s = grids[r][t]; s.type != kEmpty) {
        pos(r, s.type, s.chunk, s.mb) = t;
        items.emplace_back(t, r, s);
      }
  std::sort(items.begin(), items.end(),
            [](auto& a, auto& b) { return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b)); });
  int phase = 0;  // 0 warm-up, 1 steady, 2 cool-down
  for (auto& [t, r, s] : items) {
    const bool rank0_f0 = r == 0 && s.chunk == 0;
    if (phase == 0 && rank0_f0 && s.type == (int)OpType::B) phase = 1;
    if (phase == 1) {
      if (rank0_f0 && s.type == (int)OpType::F && s.mb == m - 1) phase = 2;
      continue;
    }
    if (phase == 0 && !move_warmup) continue;
    Grid& g = grids[r];
    const int cur = pos(r, s.type, s.chunk, s.mb);
    for (int nt = earliest(p, pos, r, s.type, s.chunk, s.mb); nt < cur; ++nt) {
      if (g[nt].type != kEmpty) continue;
      std::swap(g[nt], g[cur]);
      if (grid_memory(g) <= limit) {
        pos(r, s.type, s.chunk, s.mb) = nt;
        break;
      }
      std::swap(g[nt], g[cur]);
    }
  }
}

}  // namespace

Schedule v_block_schedule(const std::string& name, int p, int m, const std::vector<BlockOffsets>& block) {
  if ((int)block.size() != p) fail("internal: building block of '{}' has {} ranks, not {}", name, block.size(), p);
  std::vector<Grid> grids(p);
  for (int r = 0; r < p; ++r) {
    const BlockOffsets& o = block[r];
    const int at[4] = {o.f0, o.f1, o.b1, o.b0};
    const Slot kind[4] = {{(int)OpType::F, 0, 0}, {(int)OpType::F, 0, 1}, {(int)OpType::B, 0, 1}, {(int)OpType::B, 0, 0}};
    grids[r].resize(*std::max_element(at, at + 4) + 6 * m + 1);
    for (int k = 0; k < 4; ++k)
      for (int mb = 0; mb < m; ++mb) {
        Slot& s = grids[r][at[k] + 6 * mb];
        if (s.type != kEmpty) fail("internal: building block of '{}' puts two passes in one slot (pp {})", name, p);
        s = kind[k];
        s.mb = mb;
      }
  }
  // Squeeze once with the W's placed, then again with only the cool-down moving and the W's left
  // to fill the free slots, as the paper's reordering does.
  for (auto& g : grids) g = place_w(g, 0);
  squeeze(p, m, grids, true);
  for (auto& g : grids)
    for (auto& s : g)
      if (s.type == (int)OpType::W) s = Slot{};
  squeeze(p, m, grids, false);

  Schedule sched = make_empty(name, p, 2, m, Placement::VShape);
  for (int r = 0; r < p; ++r)
    for (const Slot& s : place_w(grids[r], 1))
      if (s.type != kEmpty) sched.ranks[r].push_back(Op{(OpType)s.type, s.mb, s.chunk, {}, {}});
  attach_p2p(sched);
  return sched;
}

}  // namespace primus::pipeline::detail
