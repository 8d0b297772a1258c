// The tables of `analyze trace` in text, Markdown, CSV and JSON, its --diff, and the SVG timeline.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "trace/analysis.h"

namespace primus::trace {
namespace {

std::string f1(double v) { return fmt::format("{:.1f}", v); }
std::string f2(double v) { return fmt::format("{:.2f}", v); }
std::string f3(double v) { return fmt::format("{:.3f}", v); }

std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, ++i;
  return i == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[i]);
}

std::vector<std::vector<std::string>> timeline_rows(const Timeline& t) {
  auto pct = [&](double v) { return t.total_ms > 0 ? f2(100 * v / t.total_ms) : "0.00"; };
  return {{"computation_time", f3(t.computation_ms), pct(t.computation_ms)},
          {"exposed_comm_time", f3(t.exposed_comm_ms), pct(t.exposed_comm_ms)},
          {"exposed_memcpy_time", f3(t.exposed_memcpy_ms), pct(t.exposed_memcpy_ms)},
          {"busy_time", f3(t.busy_ms), pct(t.busy_ms)},
          {"idle_time", f3(t.idle_ms), pct(t.idle_ms)},
          {"total_time", f3(t.total_ms), pct(t.total_ms)},
          {"total_comm_time", f3(t.total_comm_ms), pct(t.total_comm_ms)},
          {"total_memcpy_time", f3(t.total_memcpy_ms), pct(t.total_memcpy_ms)}};
}

nlohmann::ordered_json timeline_json(const Timeline& t) {
  return {{"total_ms", t.total_ms},           {"computation_ms", t.computation_ms},
          {"exposed_comm_ms", t.exposed_comm_ms}, {"exposed_memcpy_ms", t.exposed_memcpy_ms},
          {"idle_ms", t.idle_ms},             {"busy_ms", t.busy_ms},
          {"total_comm_ms", t.total_comm_ms}, {"total_memcpy_ms", t.total_memcpy_ms}};
}

nlohmann::ordered_json op_json(const std::vector<OpRow>& rows) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const OpRow& o : rows)
    a.push_back({{"name", o.name},
                 {"category", o.category},
                 {"time_ms", o.time_ms},
                 {"count", o.count},
                 {"percent", o.percent},
                 {"cumulative_percent", o.cumulative_percent}});
  return a;
}

}  // namespace

std::vector<Table> report_tables(const TraceReport& r) {
  std::vector<Table> out;
  std::string ranks;
  for (int x : r.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(x);
  out.push_back({"timeline",
                 fmt::format("GPU timeline (TraceLens's definitions), mean over ranks {}; {} profiled step(s); device {}",
                             ranks, r.steps, r.device),
                 {"type", "time ms", "percent"},
                 timeline_rows(r.mean)});
  if (r.per_rank.size() > 1) {
    Table t{"timeline_per_rank", "timeline per rank (ms)",
            {"rank", "total", "computation", "exposed comm", "exposed memcpy", "idle", "total comm"},
            {}};
    for (size_t i = 0; i < r.ranks.size(); ++i) {
      const Timeline& x = r.per_rank[i];
      t.rows.push_back({std::to_string(r.ranks[i]), f3(x.total_ms), f3(x.computation_ms), f3(x.exposed_comm_ms),
                        f3(x.exposed_memcpy_ms), f3(x.idle_ms), f3(x.total_comm_ms)});
    }
    out.push_back(t);
  }
  Table cats{"ops_summary_by_category", "op summary by category (all ranks)",
             {"op category", "count", "time ms", "percent", "cumulative percent"}, {}};
  for (const OpRow& o : r.categories)
    cats.rows.push_back({o.name, std::to_string(o.count), f3(o.time_ms), f2(o.percent), f2(o.cumulative_percent)});
  out.push_back(cats);
  Table ops{"ops_summary", "op summary by op (all ranks)",
            {"op", "op category", "count", "time ms", "percent", "cumulative percent"}, {}};
  for (const OpRow& o : r.ops)
    ops.rows.push_back({o.name, o.category, std::to_string(o.count), f3(o.time_ms), f2(o.percent), f2(o.cumulative_percent)});
  out.push_back(ops);
  Table g{"gemm",
          fmt::format("GEMMs: roofline of {} at {:.3f} TFLOP/s peak and {:.1f} GB/s", r.device, r.peak_tflops,
                      r.memory_bandwidth_gbs),
          {"M", "N", "K", "dtype", "modules", "passes", "count", "time ms", "mean us", "TFLOP/s", "FLOPs/byte",
           "roofline TFLOP/s", "% of roofline", "bound"},
          {}};
  for (const GemmRow& x : r.gemms)
    g.rows.push_back({std::to_string(x.M), std::to_string(x.N), std::to_string(x.K), x.dtype, x.modules, x.passes,
                      std::to_string(x.count), f3(x.time_ms), f1(x.mean_us), f3(x.tflops), f1(x.flops_per_byte),
                      f3(x.roofline_tflops), f1(x.roofline_percent), x.bound});
  out.push_back(g);
  Table c{"collectives",
          "collectives (latency: the shortest duration over ranks) and point-to-point transfers",
          {"op", "group", "ranks", "dtype", "size", "count", "time ms", "mean latency us", "algo bw GB/s", "bus bw GB/s",
           "algorithm", "mean wait us", "seen on ranks"},
          {}};
  for (const CollectiveRow& x : r.collectives)
    c.rows.push_back({x.op, x.group, std::to_string(x.group_size), x.dtype, bytes_str(x.bytes), std::to_string(x.count),
                      f3(x.time_ms), f1(x.mean_latency_us), f3(x.algbw_gbs), f3(x.busbw_gbs), x.algorithm,
                      f1(x.mean_wait_us), std::to_string(x.ranks)});
  out.push_back(c);
  if (r.waits.size() > 1) {
    Table w{"straggler_summary",
            r.straggler >= 0 ? fmt::format("waits per rank; straggler: rank {} (arrives last most often)", r.straggler)
                             : std::string("waits per rank; no straggler"),
            {"rank", "collectives", "total wait ms", "mean wait us", "times arrived last", "times arrived first",
             "total comm ms"},
            {}};
    for (const RankWait& x : r.waits)
      w.rows.push_back({std::to_string(x.rank), std::to_string(x.collectives), f3(x.total_wait_ms), f1(x.mean_wait_us),
                        std::to_string(x.times_last), std::to_string(x.times_first), f3(x.total_comm_ms)});
    out.push_back(w);
  }
  if (!r.layers.empty()) {
    Table l{"layers", "F / B / W per layer (from the ops of each pass)", {"pass", "where", "count", "mean ms", "time ms"}, {}};
    for (const LayerRow& x : r.layers)
      l.rows.push_back({x.pass, x.where, std::to_string(x.count), f3(x.mean_ms), f3(x.time_ms)});
    out.push_back(l);
  }
  if (r.pipeline) {
    const PipelineReport& p = *r.pipeline;
    Table t{"pipeline",
            fmt::format("pipeline {} (pp {}, vpp {}, {} microbatches per rank): measured bubble {:.1f}%, simulated "
                        "from the measured F/B/W {}{}",
                        p.schedule, p.pp, p.vpp, p.microbatches, 100 * p.measured_bubble,
                        p.simulated_bubble >= 0 ? fmt::format("{:.1f}%", 100 * p.simulated_bubble) : "n/a",
                        p.note.empty() ? "" : " (" + p.note + ")"),
            {"rank", "pp rank", "wall ms", "F/B/W ms", "bubble %", "mean F ms", "mean B ms", "mean W ms"},
            {}};
    for (const PipelineRank& x : p.ranks)
      t.rows.push_back({std::to_string(x.rank), std::to_string(x.pp_rank), f3(x.wall_ms), f3(x.busy_ms),
                        f1(100 * x.bubble), f3(x.f_ms), f3(x.b_ms), f3(x.w_ms)});
    out.push_back(t);
  }
  return out;
}

nlohmann::ordered_json report_json(const TraceReport& r) {
  nlohmann::ordered_json j;
  j["ranks"] = r.ranks;
  j["steps"] = r.steps;
  j["device"] = r.device;
  j["peak_tflops"] = r.peak_tflops;
  j["memory_bandwidth_gbs"] = r.memory_bandwidth_gbs;
  j["timeline"] = timeline_json(r.mean);
  nlohmann::ordered_json per = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    nlohmann::ordered_json t = timeline_json(r.per_rank[i]);
    t["rank"] = r.ranks[i];
    per.push_back(t);
  }
  j["per_rank"] = per;
  j["ops"] = op_json(r.ops);
  j["op_categories"] = op_json(r.categories);
  nlohmann::ordered_json g = nlohmann::ordered_json::array();
  for (const GemmRow& x : r.gemms)
    g.push_back({{"M", x.M}, {"N", x.N}, {"K", x.K}, {"dtype", x.dtype}, {"modules", x.modules}, {"passes", x.passes},
                 {"count", x.count}, {"time_ms", x.time_ms}, {"mean_us", x.mean_us}, {"tflops", x.tflops},
                 {"flops_per_byte", x.flops_per_byte}, {"roofline_tflops", x.roofline_tflops},
                 {"roofline_percent", x.roofline_percent}, {"bound", x.bound}});
  j["gemms"] = g;
  nlohmann::ordered_json c = nlohmann::ordered_json::array();
  for (const CollectiveRow& x : r.collectives)
    c.push_back({{"op", x.op}, {"group", x.group}, {"group_size", x.group_size}, {"dtype", x.dtype}, {"bytes", x.bytes},
                 {"count", x.count}, {"time_ms", x.time_ms}, {"mean_latency_us", x.mean_latency_us},
                 {"algbw_gbs", x.algbw_gbs}, {"busbw_gbs", x.busbw_gbs}, {"algorithm", x.algorithm},
                 {"mean_wait_us", x.mean_wait_us}, {"seen_on_ranks", x.ranks}});
  j["collectives"] = c;
  nlohmann::ordered_json w = nlohmann::ordered_json::array();
  for (const RankWait& x : r.waits)
    w.push_back({{"rank", x.rank}, {"collectives", x.collectives}, {"total_wait_ms", x.total_wait_ms},
                 {"mean_wait_us", x.mean_wait_us}, {"times_arrived_last", x.times_last},
                 {"times_arrived_first", x.times_first}, {"total_comm_ms", x.total_comm_ms}});
  j["waits"] = w;
  j["straggler"] = r.straggler >= 0 ? nlohmann::ordered_json(r.straggler) : nlohmann::ordered_json();
  nlohmann::ordered_json l = nlohmann::ordered_json::array();
  for (const LayerRow& x : r.layers)
    l.push_back({{"pass", x.pass}, {"where", x.where}, {"count", x.count}, {"mean_ms", x.mean_ms}, {"time_ms", x.time_ms}});
  j["layers"] = l;
  if (r.pipeline) {
    const PipelineReport& p = *r.pipeline;
    nlohmann::ordered_json pr = nlohmann::ordered_json::array();
    for (const PipelineRank& x : p.ranks)
      pr.push_back({{"rank", x.rank}, {"pp_rank", x.pp_rank}, {"wall_ms", x.wall_ms}, {"busy_ms", x.busy_ms},
                    {"bubble", x.bubble}, {"mean_f_ms", x.f_ms}, {"mean_b_ms", x.b_ms}, {"mean_w_ms", x.w_ms}});
    j["pipeline"] = {{"schedule", p.schedule},
                     {"pp", p.pp},
                     {"vpp", p.vpp},
                     {"microbatches", p.microbatches},
                     {"measured_bubble", p.measured_bubble},
                     {"simulated_bubble", p.simulated_bubble >= 0 ? nlohmann::ordered_json(p.simulated_bubble)
                                                                  : nlohmann::ordered_json()},
                     {"note", p.note},
                     {"ranks", pr}};
  }
  return j;
}

std::vector<Table> diff_tables(const TraceReport& a, const TraceReport& b) {
  std::vector<Table> out;
  auto ratio = [](double x, double y) { return x > 0 ? fmt::format("{:.3f}", y / x) : std::string("-"); };
  Table t{"timeline_diff", "timeline, A against B (mean over ranks, ms)", {"type", "A", "B", "B - A", "B / A"}, {}};
  const auto ra = timeline_rows(a.mean), rb = timeline_rows(b.mean);
  for (size_t i = 0; i < ra.size(); ++i) {
    const double x = std::stod(ra[i][1]), y = std::stod(rb[i][1]);
    t.rows.push_back({ra[i][0], ra[i][1], rb[i][1], f3(y - x), ratio(x, y)});
  }
  out.push_back(t);
  Table o{"ops_diff", "ops, A against B (all ranks)", {"op", "count A", "count B", "time A ms", "time B ms", "B - A ms", "B / A"}, {}};
  std::map<std::string, std::pair<const OpRow*, const OpRow*>> ops;
  for (const OpRow& x : a.ops) ops[x.name].first = &x;
  for (const OpRow& x : b.ops) ops[x.name].second = &x;
  std::vector<std::pair<double, std::vector<std::string>>> rows;
  for (auto& [name, p] : ops) {
    const double x = p.first ? p.first->time_ms : 0, y = p.second ? p.second->time_ms : 0;
    rows.push_back({std::fabs(y - x),
                    {name, p.first ? std::to_string(p.first->count) : "0", p.second ? std::to_string(p.second->count) : "0",
                     f3(x), f3(y), f3(y - x), ratio(x, y)}});
  }
  std::sort(rows.begin(), rows.end(), [](const auto& l, const auto& r) { return l.first > r.first; });
  for (auto& [d, row] : rows) o.rows.push_back(row);
  out.push_back(o);
  Table g{"gemm_diff", "GEMM shapes, A against B", {"M", "N", "K", "dtype", "time A ms", "time B ms", "TFLOP/s A", "TFLOP/s B", "B / A time"}, {}};
  std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, std::pair<const GemmRow*, const GemmRow*>> gm;
  for (const GemmRow& x : a.gemms) gm[{x.M, x.N, x.K, x.dtype}].first = &x;
  for (const GemmRow& x : b.gemms) gm[{x.M, x.N, x.K, x.dtype}].second = &x;
  for (auto& [k, p] : gm) {
    const double x = p.first ? p.first->time_ms : 0, y = p.second ? p.second->time_ms : 0;
    g.rows.push_back({std::to_string(std::get<0>(k)), std::to_string(std::get<1>(k)), std::to_string(std::get<2>(k)),
                      std::get<3>(k), f3(x), f3(y), p.first ? f3(p.first->tflops) : "-", p.second ? f3(p.second->tflops) : "-",
                      ratio(x, y)});
  }
  out.push_back(g);
  return out;
}

nlohmann::ordered_json diff_json(const TraceReport& a, const TraceReport& b) {
  nlohmann::ordered_json j;
  j["a"] = {{"timeline", timeline_json(a.mean)}};
  j["b"] = {{"timeline", timeline_json(b.mean)}};
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  std::map<std::string, std::pair<const OpRow*, const OpRow*>> m;
  for (const OpRow& x : a.ops) m[x.name].first = &x;
  for (const OpRow& x : b.ops) m[x.name].second = &x;
  for (auto& [name, p] : m) {
    const double x = p.first ? p.first->time_ms : 0, y = p.second ? p.second->time_ms : 0;
    ops.push_back({{"name", name}, {"time_a_ms", x}, {"time_b_ms", y}, {"delta_ms", y - x},
                   {"count_a", p.first ? p.first->count : 0}, {"count_b", p.second ? p.second->count : 0}});
  }
  j["ops"] = ops;
  return j;
}

std::string render(const std::vector<Table>& tables, const std::string& format) {
  std::string out;
  for (const Table& t : tables) {
    if (format == "csv") {
      auto cell = [](const std::string& s) {
        if (s.find_first_of(",\"\n") == std::string::npos) return s;
        std::string q = "\"";
        for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
        return q + "\"";
      };
      out += "# " + t.name + "\n";
      for (size_t i = 0; i < t.columns.size(); ++i) out += (i ? "," : "") + cell(t.columns[i]);
      out += "\n";
      for (const auto& row : t.rows) {
        for (size_t i = 0; i < row.size(); ++i) out += (i ? "," : "") + cell(row[i]);
        out += "\n";
      }
      out += "\n";
    } else if (format == "markdown") {
      out += "### " + t.title + "\n\n|";
      for (const auto& c : t.columns) out += " " + c + " |";
      out += "\n|";
      for (size_t i = 0; i < t.columns.size(); ++i) out += "---|";
      out += "\n";
      for (const auto& row : t.rows) {
        out += "|";
        for (const auto& c : row) out += " " + c + " |";
        out += "\n";
      }
      out += "\n";
    } else if (format == "text") {
      std::vector<size_t> w(t.columns.size());
      for (size_t i = 0; i < w.size(); ++i) w[i] = t.columns[i].size();
      for (const auto& row : t.rows)
        for (size_t i = 0; i < row.size() && i < w.size(); ++i) w[i] = std::max(w[i], row[i].size());
      out += t.title + "\n";
      auto line = [&](const std::vector<std::string>& row) {
        std::string s = " ";
        for (size_t i = 0; i < row.size(); ++i) {
          const bool left = i == 0 || row[i].empty() || !(std::isdigit(static_cast<unsigned char>(row[i][0])) || row[i][0] == '-');
          s += " " + (left ? fmt::format("{:<{}}", row[i], w[i]) : fmt::format("{:>{}}", row[i], w[i]));
        }
        while (!s.empty() && s.back() == ' ') s.pop_back();
        return s + "\n";
      };
      out += line(t.columns);
      for (const auto& row : t.rows) out += line(row);
      out += "\n";
    } else {
      fail("--format {} is not one of: text, markdown, csv, json", format);
    }
  }
  return out;
}

std::string timeline_svg(const std::vector<RankTrace>& traces, int64_t step) {
  if (traces.empty()) fail("no traces to draw");
  if (step < 0) {
    step = INT64_MAX;
    for (const auto& t : traces)
      for (const auto& e : t.events)
        if (e.op == "step" && e.step >= 0) step = std::min(step, e.step);
    if (step == INT64_MAX) fail("the traces hold no step");
  }
  // The step's interval on each rank, from its step span.
  double t0 = 1e300, t1 = -1e300;
  for (const auto& t : traces)
    for (const auto& e : t.events)
      if (e.op == "step" && e.step == step) t0 = std::min(t0, e.ts), t1 = std::max(t1, e.end);
  if (t1 <= t0) fail("no rank's trace holds step {}", step);
  const double width = 1200, left = 90, row_h = 16, gap = 6;
  const char* tracks[] = {"compute", "communication", "host"};
  const int rows = int(traces.size()) * 3;
  const double height = 40 + rows * row_h + double(traces.size()) * gap + 40;
  auto x = [&](double t) { return left + (t - t0) / (t1 - t0) * (width - left - 10); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"10\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"16\" font-size=\"12\">step {}: {:.2f} ms "
      "across {} rank(s)</text>\n",
      width, height, left, step, (t1 - t0) * 1e-3, traces.size());
  auto colour = [](const TraceEvent& e) -> const char* {
    if (e.cat == "communication") return "#d62728";
    if (e.cat == "memcpy") return "#9467bd";
    if (e.cat == "host") return "#7f7f7f";
    if (e.pass == "F") return "#1f77b4";
    if (e.pass == "B") return "#2ca02c";
    if (e.pass == "W") return "#ff7f0e";
    return "#8c564b";
  };
  double y = 30;
  for (const auto& t : traces) {
    for (int k = 0; k < 3; ++k) {
      s += fmt::format("<text x=\"4\" y=\"{:.1f}\">rank {} {}</text>\n", y + row_h - 4, t.rank, tracks[k]);
      s += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"#f4f4f4\"/>\n", left, y,
                       width - left - 10, row_h - 2);
      for (const auto& e : t.events) {
        const bool on = k == 0 ? e.cat == "compute" : k == 1 ? e.cat == "communication" : (e.cat == "host" || e.cat == "memcpy");
        if (!on || e.end < t0 || e.ts > t1) continue;
        const double a = x(std::max(e.ts, t0)), b = x(std::min(e.end, t1));
        s += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\"><title>{} {:.1f} us</title></rect>\n",
                         a, y, std::max(0.3, b - a), row_h - 2, colour(e), e.name, e.dur());
      }
      y += row_h;
    }
    y += gap;
  }
  const char* legend[][2] = {{"F", "#1f77b4"}, {"B", "#2ca02c"}, {"W", "#ff7f0e"}, {"other compute", "#8c564b"},
                             {"communication", "#d62728"}, {"host", "#7f7f7f"}};
  double lx = left;
  for (auto& l : legend) {
    s += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{:.1f}\">{}</text>\n",
                     lx, y + 8, l[1], lx + 14, y + 17, l[0]);
    lx += 110;
  }
  return s + "</svg>\n";
}

}  // namespace primus::trace
