#include "safe/run_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "safe/metrics_writer.h"

namespace fs = std::filesystem;

namespace primus::safe {

namespace {

// iteration -> value, the last row for an iteration winning; then as sorted vectors.
using ByIter = std::map<int64_t, double>;
RunCurves::Series to_series(const ByIter& m) {
  RunCurves::Series s;
  for (const auto& [i, v] : m) {
    s.x.push_back(double(i));
    s.y.push_back(v);
  }
  return s;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

// About `n` round tick values covering [lo, hi] (1, 2, 5 times a power of ten apart).
std::vector<double> nice_ticks(double lo, double hi, int n) {
  const double span = hi - lo;
  const double raw = span / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e6)) return fmt::format("{:.1e}", v);
  return fmt::format("{:.6g}", v);
}

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

struct Panel {
  const char* title;
  RunCurves::Series RunCurves::*series;
  RunCurves::Series RunCurves::*dashed = nullptr;  // drawn dashed over the same axes (eval loss)
};

void draw_panel(std::ostringstream& o, const Panel& p, const std::vector<RunCurves>& runs, double x0, double y0,
                double w, double h) {
  const double left = 70, right = 15, top = 28, bottom = 38;
  const double px = x0 + left, py = y0 + top, pw = w - left - right, ph = h - top - bottom;
  o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="14" font-weight="bold">{}</text>)", px, y0 + 18,
                   esc(p.title))
    << "\n";
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  auto extend = [&](const RunCurves::Series& s) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      xmin = std::min(xmin, s.x[i]), xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, s.y[i]), ymax = std::max(ymax, s.y[i]);
    }
  };
  for (const auto& r : runs) {
    extend(r.*(p.series));
    if (p.dashed) extend(r.*(p.dashed));
  }
  o << fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#888"/>)", px, py,
                   pw, ph)
    << "\n";
  if (!std::isfinite(xmin)) {
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12" fill="#888" text-anchor="middle">no data</text>)",
                     px + pw / 2, py + ph / 2)
      << "\n";
    return;
  }
  if (xmax == xmin) xmin -= 1, xmax += 1;
  if (ymax == ymin) {
    const double d = ymax == 0 ? 1 : std::abs(ymax) * 0.05;
    ymin -= d, ymax += d;
  } else {
    const double pad = (ymax - ymin) * 0.05;
    ymin -= pad, ymax += pad;
  }
  auto X = [&](double v) { return px + (v - xmin) / (xmax - xmin) * pw; };
  auto Y = [&](double v) { return py + ph - (v - ymin) / (ymax - ymin) * ph; };
  for (double t : nice_ticks(ymin, ymax, 5)) {
    o << fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e4e4e4"/>)", px, Y(t), px + pw,
                     Y(t))
      << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="end">{}</text>)", px - 5, Y(t) + 4,
                     tick_label(t))
      << "\n";
  }
  for (double t : nice_ticks(xmin, xmax, 6)) {
    o << fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e4e4e4"/>)", X(t), py, X(t),
                     py + ph)
      << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">{}</text>)", X(t), py + ph + 15,
                     tick_label(t))
      << "\n";
  }
  o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">iteration</text>)", px + pw / 2,
                   py + ph + 31)
    << "\n";
  auto draw = [&](const RunCurves::Series& s, const char* color, bool dashed) {
    std::string pts;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) pts += fmt::format("{:.1f},{:.1f} ", X(s.x[i]), Y(s.y[i]));
    if (pts.empty()) return;
    if (s.x.size() == 1 || dashed) {  // sparse points (evaluations) get markers too
      for (size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.y[i]))
          o << fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)", X(s.x[i]), Y(s.y[i]), color);
    }
    o << fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.6"{} points="{}"/>)", color,
                     dashed ? R"( stroke-dasharray="5,3")" : "", pts)
      << "\n";
  };
  for (size_t r = 0; r < runs.size(); ++r) {
    const char* color = kColors[r % std::size(kColors)];
    draw(runs[r].*(p.series), color, false);
    if (p.dashed) draw(runs[r].*(p.dashed), color, true);
  }
}

}  // namespace

RunCurves read_run_curves(const fs::path& run_dir) {
  const fs::path file = run_dir / "metrics.jsonl";
  std::error_code ec;
  if (!fs::exists(file, ec)) fail("{}: no metrics.jsonl (is {} a run folder?)", file.string(), run_dir.string());
  ByIter loss, eval, lr, gn, tps;
  for (const nlohmann::json& j : read_metrics(file).rows) {  // lines it passes over: analyze run reports them
    const int64_t it = j["iteration"].get<int64_t>();
    auto take = [&](const char* key, ByIter& into) {
      if (j.contains(key) && j[key].is_number()) into[it] = j[key].get<double>();
    };
    take("lm_loss", loss), take("eval_lm_loss", eval), take("lr", lr), take("grad_norm", gn);
    take("tokens_per_sec", tps);
  }
  if (loss.empty() && eval.empty()) fail("{}: no training rows (lm_loss) yet", file.string());
  RunCurves c;
  c.label = run_dir.filename().empty() ? run_dir.parent_path().filename().string() : run_dir.filename().string();
  c.loss = to_series(loss), c.eval_loss = to_series(eval), c.lr = to_series(lr), c.grad_norm = to_series(gn);
  c.tokens_per_sec = to_series(tps);
  return c;
}

void label_runs(std::vector<RunCurves>& runs, const std::vector<fs::path>& dirs) {
  std::vector<bool> repeated(runs.size(), false);  // decided before any label changes
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t k = 0; k < runs.size(); ++k)
      if (k != i && runs[k].label == runs[i].label) repeated[i] = true;
  for (size_t i = 0; i < runs.size(); ++i)
    if (repeated[i]) {
      const fs::path d = fs::absolute(dirs[i]).lexically_normal();
      const fs::path name = d.filename().empty() ? d.parent_path() : d;
      runs[i].label = (name.parent_path().filename() / name.filename()).string();
    }
}

std::string render_run_svg(const std::vector<RunCurves>& runs) {
  const double W = 1000, panel_h = 300, legend_h = 24.0 * ((runs.size() + 2) / 3) + 10;
  const double H = legend_h + 2 * panel_h;
  std::ostringstream o;
  o << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" )"
                   R"(viewBox="0 0 {:.0f} {:.0f}" font-family="DejaVu Sans, sans-serif">)",
                   W, H, W, H)
    << "\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const double x = 20 + double(r % 3) * 320, y = 10 + double(r / 3) * 24;
    o << fmt::format(R"(<line x1="{:.0f}" y1="{:.0f}" x2="{:.0f}" y2="{:.0f}" stroke="{}" stroke-width="3"/>)", x,
                     y + 8, x + 24, y + 8, kColors[r % std::size(kColors)])
      << fmt::format(R"(<text x="{:.0f}" y="{:.0f}" font-size="13">{}</text>)", x + 30, y + 12, esc(runs[r].label))
      << "\n";
  }
  const Panel panels[] = {{"lm loss (dashed: evaluation)", &RunCurves::loss, &RunCurves::eval_loss},
                          {"learning rate", &RunCurves::lr},
                          {"grad norm", &RunCurves::grad_norm},
                          {"throughput (tokens/s)", &RunCurves::tokens_per_sec}};
  for (int i = 0; i < 4; ++i)
    draw_panel(o, panels[i], runs, (i % 2) * W / 2, legend_h + (i / 2) * panel_h, W / 2, panel_h);
  o << "</svg>\n";
  return o.str();
}

bool svg_to_png(const fs::path& svg, const fs::path& png) {
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0) return false;
  auto q = [](const std::string& s) {
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return o + "'";
  };
  const std::string cmd = "rsvg-convert -f png -o " + q(png.string()) + " " + q(svg.string()) + " 2>&1";
  if (std::system(cmd.c_str()) != 0) fail("rsvg-convert could not turn {} into {}", svg.string(), png.string());
  return true;
}

}  // namespace primus::safe
