#include <algorithm>

#include <fmt/format.h>

#include "pipeline/render.h"

namespace primus::pipeline {

namespace {

// Colours close to the zero-bubble papers: F blue, B teal, W green; chunk 1 darker.
const char* colour(OpType t, int chunk) {
  bool dark = chunk % 2 == 1;
  switch (t) {
    case OpType::F: return dark ? "#2f6db5" : "#7fb2ea";
    case OpType::B: return dark ? "#1f8f84" : "#86d9cf";
    case OpType::W: return dark ? "#4f8a25" : "#a9d97a";
    case OpType::BW: return dark ? "#1f8f84" : "#86d9cf";
  }
  return "#000";
}

}  // namespace

std::string render_svg(const Schedule& s, const SimResult& r, const Costs& costs) {
  double quantum = 1e300;
  for (int k = 0; k < s.pp; ++k)
    for (auto& t : r.times[k]) quantum = std::min(quantum, t.end - t.start);
  if (quantum > 1e299) quantum = 1;
  const double scale = 26.0 / quantum;  // px per time unit: the shortest op is 26 px wide
  const double left = 64, top = 40, row = 30, gap = 4;
  const double width = left + r.makespan * scale + 16;
  const double height = top + s.pp * (row + gap) + 56;
  std::string o;
  o += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"Helvetica, Arial, sans-serif\">\n",
      width, height, width, height);
  o += fmt::format("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  o += fmt::format(
      "<text x=\"{}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{} (p={}, v={}, m={}): makespan {:g}, "
      "bubble rate {:.1f}%, peak activations {:g}</text>\n",
      left, s.algorithm, s.pp, s.vpp, s.microbatches, r.makespan, 100 * r.bubble_rate, r.peak_activations);
  bool any_pair = false;
  for (int k = 0; k < s.pp; ++k) {
    const double y = top + k * (row + gap);
    o += fmt::format("<text x=\"8\" y=\"{:.1f}\" font-size=\"13\">rank {}</text>\n", y + row * 0.65, k);
    // Grey background: whatever stays grey is a bubble.
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#e4e4e4\"/>\n",
                     left, y, r.makespan * scale, row);
    for (size_t i = 0; i < s.ranks[k].size(); ++i) {
      const Op& op = s.ranks[k][i];
      const auto& t = r.times[k][i];
      const double x = left + t.start * scale, w = (t.end - t.start) * scale;
      if (op.type == OpType::BW) {  // fused: B part then W part
        const StageCost c = stage_cost(costs, s.vpp, s.stage_of(k, op.chunk));
        double wb = w * c.backward / (c.backward + c.weight);
        o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x, y, wb,
                         row, colour(OpType::B, op.chunk));
        o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x + wb, y,
                         w - wb, row, colour(OpType::W, op.chunk));
      } else {
        o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x, y, w,
                         row, colour(op.type, op.chunk));
      }
      o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
                       "stroke=\"#333\" stroke-width=\"0.6\"/>\n", x, y, w, row);
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n",
                       x + w / 2, y + row * 0.62, op.chunk % 2 == 1 ? "white" : "black", op.microbatch);      if (op.overlap_next && i + 1 < s.ranks[k].size()) {  // DualPipe's F&B: one border around both
        const double pw = (r.times[k][i + 1].end - t.start) * scale;
        o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
                         "stroke=\"#000\" stroke-width=\"2.2\"/>\n", x, y, pw, row);
        any_pair = true;
      }
    }
  }
  // Legend.
  double ly = top + s.pp * (row + gap) + 18, lx = left;
  auto item = [&](const char* fill, const std::string& text) {
    o += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"16\" height=\"14\" fill=\"{}\" stroke=\"#333\" "
                     "stroke-width=\"0.6\"/>\n", lx, ly, fill);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">{}</text>\n", lx + 20, ly + 11.5, text);
    lx += 30 + 7.0 * text.size();
  };
  bool any_bw = false, two = s.vpp > 1;
  for (auto& ops : s.ranks)
    for (auto& op : ops) any_bw = any_bw || op.type == OpType::BW;
  item(colour(OpType::F, 0), two ? "F chunk 0" : "F forward");
  if (two) item(colour(OpType::F, 1), "F chunk 1");
  item(colour(OpType::B, 0), two ? "B chunk 0" : "B input grad");
  if (two) item(colour(OpType::B, 1), "B chunk 1");
  item(colour(OpType::W, 0), two ? "W chunk 0" : "W weight grad");
  if (two) item(colour(OpType::W, 1), "W chunk 1");
  item("#e4e4e4", "idle (bubble)");
  std::string note = "numbers are microbatches";
  if (any_bw) note = "fused BW drawn as B then W; " + note;
  if (any_pair) note = "a thick border holds an overlapped F&B pair; " + note;
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">{}</text>\n", left, ly + 32, note);
  o += "</svg>\n";
  return o;
}

}  // namespace primus::pipeline
