#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "pipeline/render.h"

namespace primus::pipeline {

static std::string label(const Op& op) {
  std::string n = op_name(op.type);
  if (op.chunk % 2 == 1)
    for (auto& ch : n) ch = (char)std::tolower((unsigned char)ch);
  return n + std::to_string(op.microbatch);
}

std::string render_text(const Schedule& s, const SimResult& r) {
  // One cell per shortest op; a cell is wide enough for the longest single-cell label.
  double quantum = 1e300;
  for (int k = 0; k < s.pp; ++k)
    for (auto& t : r.times[k]) quantum = std::min(quantum, t.end - t.start);
  if (quantum <= 0 || quantum > 1e299) return "(empty schedule)\n";
  const int digits = (int)std::to_string(std::max(0, s.microbatches - 1)).size();
  const int cell = digits + 2;
  std::string out = fmt::format("{}  pp {}  vpp {}  microbatches {}  (one cell = {:g} time units)\n",
                                s.algorithm, s.pp, s.vpp, s.microbatches, quantum);
  for (int k = 0; k < s.pp; ++k) {
    std::string line;
    for (size_t i = 0; i < s.ranks[k].size(); ++i) {
      const auto& t = r.times[k][i];
      size_t from = (size_t)std::llround(t.start / quantum) * cell;
      size_t to = (size_t)std::llround(t.end / quantum) * cell;
      from = std::max(from, line.size());
      to = std::max(to, from + label(s.ranks[k][i]).size() + 1);
      line.resize(from, '.');
      std::string text = label(s.ranks[k][i]);
      text.resize(to - from - 1, ' ');
      line += text + '|';
    }
    out += fmt::format("rank {:>2} |{}\n", k, line);
  }
  out += fmt::format("makespan {:g}  bubble rate {:.4f}  peak activations per rank:", r.makespan, r.bubble_rate);
  for (auto& st : r.per_rank) out += fmt::format(" {:g}", st.peak_activations);
  out += "\n";
  return out;
}

}  // namespace primus::pipeline
