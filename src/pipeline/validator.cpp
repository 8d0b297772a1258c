#include "pipeline/validator.h"

#include <array>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "pipeline/deps.h"

namespace primus::pipeline {

using detail::EventTable;

static std::string p2p_text(const std::optional<P2P>& p) {
  if (!p) return "none";
  return fmt::format("{{peer {}, microbatch {}, stage {}, {}}}", p->peer, p->microbatch, p->stage,
                     direction_name(p->dir));
}

std::vector<std::string> find_problems(const Schedule& s) {
  std::vector<std::string> problems;
  if (s.pp < 1 || s.vpp < 1 || s.microbatches < 1) {
    problems.push_back(fmt::format("bad sizes: pp {}, vpp {}, microbatches {}", s.pp, s.vpp, s.microbatches));
    return problems;
  }
  if ((int)s.ranks.size() != s.pp) {
    problems.push_back(fmt::format("schedule has {} rank lists for pp {}", s.ranks.size(), s.pp));
    return problems;
  }
  const int m = s.microbatches, S = s.num_stages();

  // 1. Every op is in range and each (microbatch, stage) has its ops exactly once.
  std::vector<int> count(4 * m * S, 0);  // [type][mb][stage]
  bool in_range = true;
  for (int r = 0; r < s.pp; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Op& op = s.ranks[r][i];
      if (op.microbatch < 0 || op.microbatch >= m || op.chunk < 0 || op.chunk >= s.vpp) {
        problems.push_back(fmt::format("rank {} op {} ({}) is out of range (microbatches {}, vpp {})",
                                       r, i, to_string(op, s.vpp), m, s.vpp));
        in_range = false;
        continue;
      }
      ++count[((int)op.type * m + op.microbatch) * S + s.stage_of(r, op.chunk)];
    }
  if (!in_range) return problems;
  for (int mb = 0; mb < m; ++mb)
    for (int st = 0; st < S; ++st) {
      auto c = [&](OpType t) { return count[((int)t * m + mb) * S + st]; };
      bool ok = c(OpType::F) == 1 &&
                ((c(OpType::B) == 1 && c(OpType::W) == 1 && c(OpType::BW) == 0) ||
                 (c(OpType::B) == 0 && c(OpType::W) == 0 && c(OpType::BW) == 1));
      if (!ok)
        problems.push_back(fmt::format(
            "microbatch {} at stage {} (rank {}) has F x{}, B x{}, W x{}, BW x{}; expected F once "
            "and B+W once each or BW once",
            mb, st, s.rank_of_stage(st), c(OpType::F), c(OpType::B), c(OpType::W), c(OpType::BW)));
    }

  // 2. Transfers agree with the stage map and pair up one to one.
  Schedule expected = s;
  attach_p2p(expected);
  using Key = std::tuple<int, int, int, int, int>;  // from, to, microbatch, stage, direction
  std::map<Key, int> sends, recvs;
  for (int r = 0; r < s.pp; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Op& op = s.ranks[r][i];
      const Op& want = expected.ranks[r][i];
      if (op.recv != want.recv)
        problems.push_back(fmt::format("rank {} op {} ({}) receives {} but the stage map needs {}", r,
                                       i, to_string(op, s.vpp), p2p_text(op.recv), p2p_text(want.recv)));
      if (op.send != want.send)
        problems.push_back(fmt::format("rank {} op {} ({}) sends {} but the stage map needs {}", r, i,
                                       to_string(op, s.vpp), p2p_text(op.send), p2p_text(want.send)));
      if (op.send) ++sends[{r, op.send->peer, op.send->microbatch, op.send->stage, (int)op.send->dir}];
      if (op.recv) ++recvs[{op.recv->peer, r, op.recv->microbatch, op.recv->stage, (int)op.recv->dir}];
    }
  for (auto& [k, n] : sends) {
    auto it = recvs.find(k);
    int nr = it == recvs.end() ? 0 : it->second;
    if (n != 1 || nr != 1)
      problems.push_back(fmt::format("rank {} -> rank {} microbatch {} stage {} {}: {} sends, {} receives",
                                     std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k),
                                     direction_name((Direction)std::get<4>(k)), n, nr));
  }
  for (auto& [k, n] : recvs)
    if (!sends.count(k))
      problems.push_back(fmt::format("rank {} waits for microbatch {} stage {} {} from rank {}, which never sends it",
                                     std::get<1>(k), std::get<2>(k), std::get<3>(k),
                                     direction_name((Direction)std::get<4>(k)), std::get<0>(k)));
  // 3. Overlapped pairs (Op::overlap_next): a forward, then a backward (B or BW) of another
  //    (microbatch, chunk), DualPipe's F&B; a pair has exactly two ops.
  for (int r = 0; r < s.pp; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Op& op = s.ranks[r][i];
      if (!op.overlap_next) continue;
      if (i + 1 == s.ranks[r].size()) {
        problems.push_back(fmt::format("rank {} op {} ({}) is marked to overlap with the next op, but it is the "
                                       "rank's last", r, i, to_string(op, s.vpp)));
        continue;
      }
      const Op& next = s.ranks[r][i + 1];
      if (next.overlap_next)
        problems.push_back(fmt::format("rank {} ops {}-{} chain overlapped pairs; a pair has exactly two ops", r, i,
                                       i + 2));
      if (op.type != OpType::F || (next.type != OpType::B && next.type != OpType::BW))
        problems.push_back(fmt::format("rank {} ops {} and {} ({} {}) form an overlapped pair, which must be a "
                                       "forward and then a backward (B or BW)", r, i, i + 1,
                                       to_string(op, s.vpp), to_string(next, s.vpp)));
      else if (op.microbatch == next.microbatch && op.chunk == next.chunk)
        problems.push_back(fmt::format("rank {} overlaps {} with its own backward", r, to_string(op, s.vpp)));
      if (next.overlap_next) ++i;
    }
  if (!problems.empty()) return problems;

  // 4. Run the lists: an op (or a pair) may start once everything it needs has happened (a
  //    receive blocks until its send was posted; sends never block). No progress with ops left
  //    = deadlock.
  EventTable done(m, S);
  auto pos = detail::run_in_dependency_order(
      s, done, [](int, size_t, size_t, const EventTable&) { return std::array<double, 2>{1.0, 1.0}; });
  if (!detail::ran_to_end(s, pos)) {
    std::string stuck;
    for (int r = 0; r < s.pp; ++r)
      if (pos[r] < s.ranks[r].size())
        stuck += fmt::format("{}rank {} at op {} ({})", stuck.empty() ? "" : ", ", r, pos[r],
                             to_string(s.ranks[r][pos[r]], s.vpp));
    problems.push_back("deadlock: every rank waits on another: " + stuck);
  }
  return problems;
}

void validate(const Schedule& s) {
  auto problems = find_problems(s);
  if (problems.empty()) return;
  std::string text;
  for (size_t i = 0; i < problems.size() && i < 5; ++i) text += "\n  " + problems[i];
  if (problems.size() > 5) text += fmt::format("\n  ... and {} more", problems.size() - 5);
  fail("invalid pipeline schedule '{}' (pp {}, vpp {}, microbatches {}):{}", s.algorithm, s.pp, s.vpp,
       s.microbatches, text);
}

}  // namespace primus::pipeline
