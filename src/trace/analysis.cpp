#include "trace/analysis.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/bounded_json.h"
#include "core/error.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/simulator.h"

namespace fs = std::filesystem;

namespace primus::trace {
namespace {

bool device_cat(const std::string& c) { return c == "compute" || c == "communication" || c == "memcpy"; }

template <typename T>
T arg(const nlohmann::json& a, const char* key, T fallback) {
  auto it = a.find(key);
  if (it == a.end() || it->is_null()) return fallback;
  return it->get<T>();
}

std::vector<fs::path> trace_files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

JsonLimits trace_json_limits() {
  JsonLimits l;
  l.max_bytes = uint64_t(1) << 30;  // a profile window of a few steps writes tens of MB per rank
  return l;
}

RankTrace parse_trace_events(const nlohmann::json& j, const std::string& file) {
  if (!j.is_object() || !j.contains("traceEvents") || !j.contains("otherData") ||
      arg<std::string>(j["otherData"], "producer", "") != "primus-cpp")
    fail("{} is not a trace written by primus-cli's profiler (train pretrain --profile true)", file);
  RankTrace t;
  t.file = file;
  t.info = j["otherData"];
  t.rank = arg<int>(t.info, "rank", 0);
  for (const auto& e : j["traceEvents"]) {
    if (arg<std::string>(e, "ph", "") != "X") continue;
    TraceEvent ev;
    ev.name = arg<std::string>(e, "name", "");
    ev.cat = arg<std::string>(e, "cat", "");
    ev.ts = arg<double>(e, "ts", 0);
    ev.end = ev.ts + arg<double>(e, "dur", 0);
    ev.tid = arg<int>(e, "tid", 0);
    const nlohmann::json a = e.contains("args") ? e["args"] : nlohmann::json::object();
    ev.op = arg<std::string>(a, "op", ev.name);
    ev.pass = arg<std::string>(a, "pass", "");
    ev.module = arg<std::string>(a, "module", "");
    ev.group = arg<std::string>(a, "group", "");
    ev.group_ranks = arg<std::string>(a, "group_ranks", "");
    ev.dtype = arg<std::string>(a, "dtype", "");
    ev.layer = arg<int>(a, "layer", -1);
    ev.microbatch = arg<int>(a, "microbatch", -1);
    ev.chunk = arg<int>(a, "chunk", -1);
    ev.peer = arg<int>(a, "peer", -1);
    ev.group_size = arg<int>(a, "group_size", 0);
    ev.step = arg<int64_t>(a, "step", -1);
    ev.seq = arg<int64_t>(a, "seq", -1);
    ev.M = arg<int64_t>(a, "M", 0);
    ev.N = arg<int64_t>(a, "N", 0);
    ev.K = arg<int64_t>(a, "K", 0);
    ev.flops = arg<double>(a, "flops", 0);
    ev.bytes = arg<double>(a, "bytes", 0);
    ev.wait_us = arg<double>(a, "wait_us", 0);
    ev.recompute = arg<bool>(a, "recompute", false);
    t.events.push_back(std::move(ev));
  }
  std::sort(t.events.begin(), t.events.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.ts < b.ts; });
  return t;
}

}  // namespace

RankTrace parse_trace(const nlohmann::json& j, const std::string& file) {
  try {
    return parse_trace_events(j, file);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    fail("{} is not a trace this reader understands: {}", file, e.what());
  }
}

std::vector<RankTrace> load_traces(const std::vector<std::string>& paths) {
  std::vector<fs::path> files;
  for (const std::string& p : paths) {
    const fs::path path(p);
    if (fs::is_directory(path)) {
      const fs::path sub = path / "trace";
      auto found = trace_files_in(fs::is_directory(sub) ? sub : path);
      if (found.empty())
        fail("{} holds no traces (*.json{}): profile a run with --profile true", p,
             fs::is_directory(sub) ? " in trace/" : ", nor a trace/ folder");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(path)) {
      files.push_back(path);
    } else {
      fail("{}: no such trace file or run folder", p);
    }
  }
  if (files.empty()) fail("analyze trace needs a run folder or trace files");
  std::vector<RankTrace> out;
  std::set<int> seen;
  for (const fs::path& f : files) {
    const nlohmann::json j = read_json_file(f, f.string(), trace_json_limits());
    RankTrace t = parse_trace(j, f.string());
    if (!seen.insert(t.rank).second) fail("{} is a second trace of rank {}", f.string(), t.rank);
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  // Ranks on one host share its steady clock; across hosts, the window's start barrier aligns them.
  std::set<std::string> hosts;
  for (const auto& t : out) hosts.insert(arg<std::string>(t.info, "host", ""));
  if (hosts.size() > 1) {
    const double ref = arg<double>(out[0].info, "sync_us", 0);
    for (auto& t : out) {
      const double shift = ref - arg<double>(t.info, "sync_us", 0);
      for (auto& e : t.events) e.ts += shift, e.end += shift;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Intervals and the timeline

std::vector<Interval> merge(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.end <= i.begin) continue;
    if (!out.empty() && i.begin <= out.back().end) out.back().end = std::max(out.back().end, i.end);
    else out.push_back(i);
  }
  return out;
}

// a - b for merged a and b.
std::vector<Interval> subtract(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  size_t j = 0;
  for (const Interval& i : a) {
    double cur = i.begin;
    while (j < b.size() && b[j].end <= cur) ++j;
    size_t k = j;
    while (k < b.size() && b[k].begin < i.end) {
      if (b[k].begin > cur) out.push_back({cur, b[k].begin});
      cur = std::max(cur, b[k].end);
      ++k;
    }
    if (cur < i.end) out.push_back({cur, i.end});
  }
  return out;
}

double length(const std::vector<Interval>& v) {
  double s = 0;
  for (const Interval& i : v) s += i.end - i.begin;
  return s;
}

Timeline timeline_of(const std::vector<TraceEvent>& events) {
  std::vector<Interval> comp, comm, memcpy, all;
  for (const TraceEvent& e : events) {
    if (!device_cat(e.cat)) continue;
    const Interval i{e.ts, e.end};
    (e.cat == "compute" ? comp : e.cat == "communication" ? comm : memcpy).push_back(i);
    all.push_back(i);
  }
  comp = merge(comp), comm = merge(comm), memcpy = merge(memcpy), all = merge(all);
  Timeline t;
  if (all.empty()) return t;
  const double ms = 1e-3;
  t.total_ms = (all.back().end - all.front().begin) * ms;
  t.computation_ms = length(comp) * ms;
  t.exposed_comm_ms = length(subtract(comm, comp)) * ms;
  t.exposed_memcpy_ms = length(subtract(subtract(memcpy, comp), comm)) * ms;
  t.busy_ms = length(all) * ms;
  t.idle_ms = (all.back().end - all.front().begin - length(all)) * ms;
  t.total_comm_ms = length(comm) * ms;
  t.total_memcpy_ms = length(memcpy) * ms;
  return t;
}

std::string op_category(const std::string& op, const std::string& cat) {
  if (cat == "communication") return "communication";
  if (cat == "memcpy") return "memcpy";
  if (op == "gemm") return "GEMM";
  if (op == "attention_forward" || op == "attention_decode") return "SDPA_fwd";
  if (op == "attention_backward") return "SDPA_bwd";
  if (op.rfind("rmsnorm", 0) == 0) return "norm";
  if (op.rfind("ce_", 0) == 0) return "cross_entropy";
  if (op.rfind("embedding", 0) == 0) return "embedding";
  if (op == "optimizer_step") return "optimizer";
  if (op == "gradient_norm" || op == "column_sum_accumulate") return "reduce";
  if (op.rfind("swiglu", 0) == 0 || op == "rope_apply" || op == "add" || op == "cast" || op == "dropout")
    return "elementwise";
  return "other";
}

double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 1.0;
  const double f = double(n - 1) / double(n);
  if (op == "all_reduce") return 2 * f;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all") return f;
  return 1.0;
}

// ---------------------------------------------------------------------------------------------
// The report

namespace {

std::vector<OpRow> summarize(std::map<std::string, OpRow>& by) {
  std::vector<OpRow> rows;
  double total = 0;
  for (auto& [k, r] : by) {
    rows.push_back(r);
    total += r.time_ms;
  }
  std::sort(rows.begin(), rows.end(), [](const OpRow& a, const OpRow& b) { return a.time_ms > b.time_ms; });
  double cum = 0;
  for (OpRow& r : rows) {
    r.percent = total > 0 ? 100 * r.time_ms / total : 0;
    cum += r.percent;
    r.cumulative_percent = cum;
  }
  return rows;
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
  return out;
}

void add_collectives(const std::vector<RankTrace>& traces, TraceReport& r) {
  // Collectives by (group instance, index): the same op on every member.
  struct Seen {
    std::string op, group, dtype;
    int group_size;
    double bytes;
    std::vector<std::pair<int, const TraceEvent*>> on;  // rank, event
  };
  std::map<std::pair<std::string, int64_t>, Seen> coll;
  struct P2P {
    int64_t count = 0;
    double time = 0;
  };
  std::map<std::tuple<std::string, std::string, std::string, double>, P2P> p2p;  // op, group, dtype, bytes
  std::map<std::tuple<std::string, std::string, std::string, double>, int> p2p_size;
  for (const RankTrace& t : traces)
    for (const TraceEvent& e : t.events) {
      if (e.cat != "communication") continue;
      if (e.seq >= 0) {
        Seen& s = coll[{e.group + "@" + e.group_ranks, e.seq}];
        s.op = e.op, s.group = e.group, s.dtype = e.dtype, s.group_size = e.group_size, s.bytes = e.bytes;
        s.on.push_back({t.rank, &e});
      } else {
        P2P& p = p2p[{e.op, e.group, e.dtype, e.bytes}];
        p.count += 1;
        p.time += e.dur();
        p2p_size[{e.op, e.group, e.dtype, e.bytes}] = e.group_size;
      }
    }
  std::map<int, RankWait> waits;
  for (const RankTrace& t : traces) waits[t.rank].rank = t.rank;
  struct Agg {
    CollectiveRow row;
    double wait_sum = 0;
    int64_t waits = 0;
  };
  std::map<std::tuple<std::string, std::string, std::string, double>, Agg> rows;
  for (auto& [key, s] : coll) {
    if (s.group_size <= 1) continue;  // a group of one moves nothing
    double latency = 1e300, last_start = -1e300, first_start = 1e300;
    int last = -1, first = -1;
    for (auto& [rank, e] : s.on) {
      latency = std::min(latency, e->dur());
      if (e->ts > last_start) last_start = e->ts, last = rank;
      if (e->ts < first_start) first_start = e->ts, first = rank;
    }
    Agg& a = rows[{s.op, s.group, s.dtype, s.bytes}];
    a.row.op = s.op, a.row.group = s.group, a.row.dtype = s.dtype, a.row.bytes = s.bytes;
    a.row.group_size = s.group_size;
    a.row.count += 1;
    a.row.time_ms += latency * 1e-3;
    a.row.ranks = std::max(a.row.ranks, int(s.on.size()));
    for (auto& [rank, e] : s.on) {
      RankWait& w = waits[rank];
      w.collectives += 1;
      w.total_comm_ms += e->dur() * 1e-3;
      if (s.on.size() > 1) {
        const double wait = last_start - e->ts;
        w.total_wait_ms += wait * 1e-3;
        a.wait_sum += wait;
        a.waits += 1;
        if (rank == last) w.times_last += 1;
        if (rank == first) w.times_first += 1;
      }
    }
  }
  for (auto& [key, a] : rows) {
    CollectiveRow c = a.row;
    c.mean_latency_us = c.time_ms * 1e3 / double(c.count);
    c.algbw_gbs = c.mean_latency_us > 0 ? c.bytes / (c.mean_latency_us * 1e-6) / 1e9 : 0;
    c.busbw_gbs = c.algbw_gbs * bus_factor(c.op, c.group_size);
    c.algorithm = "ring (bus bandwidth factor)";
    c.mean_wait_us = a.waits ? a.wait_sum / double(a.waits) : 0;
    r.collectives.push_back(c);
  }
  for (auto& [key, p] : p2p) {
    CollectiveRow c;
    std::tie(c.op, c.group, c.dtype, c.bytes) = key;
    c.group_size = p2p_size[key];
    c.count = p.count;
    c.time_ms = p.time * 1e-3;
    c.mean_latency_us = p.time / double(p.count);
    c.algbw_gbs = c.mean_latency_us > 0 ? c.bytes / (c.mean_latency_us * 1e-6) / 1e9 : 0;
    c.busbw_gbs = c.algbw_gbs;
    c.algorithm = "point-to-point";
    c.ranks = 1;
    r.collectives.push_back(c);
  }
  std::sort(r.collectives.begin(), r.collectives.end(),
            [](const CollectiveRow& a, const CollectiveRow& b) { return a.time_ms > b.time_ms; });
  for (auto& [rank, w] : waits) {
    w.mean_wait_us = w.collectives ? w.total_wait_ms * 1e3 / double(w.collectives) : 0;
    r.waits.push_back(w);
  }
  // The straggler arrives last most often (so it waits least); the table is sorted with it first.
  std::sort(r.waits.begin(), r.waits.end(), [](const RankWait& a, const RankWait& b) {
    return a.times_last != b.times_last ? a.times_last > b.times_last : a.total_wait_ms < b.total_wait_ms;
  });
  if (traces.size() > 1 && !r.waits.empty() && r.waits.front().times_last > 0) r.straggler = r.waits.front().rank;
}

void add_pipeline(const std::vector<RankTrace>& traces, TraceReport& r) {
  const nlohmann::json& info = traces.front().info;
  const nlohmann::json layout = info.value("layout", nlohmann::json::object());
  const int pp = layout.value("pp", 1);
  if (pp <= 1) return;
  PipelineReport p;
  p.schedule = layout.value("schedule", std::string());
  p.pp = pp;
  p.vpp = layout.value("vpp", 1);
  p.microbatches = info.value("microbatches_per_rank", 1);
  // Mean F, B, W per stage from the ranks present.
  const int stages = pp * p.vpp;
  std::vector<std::array<double, 3>> sum(size_t(stages), {0, 0, 0});
  std::vector<std::array<int64_t, 3>> cnt(size_t(stages), {0, 0, 0});
  std::optional<pipeline::Schedule> sched;
  try {
    pipeline::ScheduleRequest req;
    req.pp = pp;
    req.vpp = p.vpp;
    req.microbatches = p.microbatches;
    sched = pipeline::generate(p.schedule, req);
  } catch (const Error& e) {
    p.note = fmt::format("schedule {} could not be rebuilt: {}", p.schedule, e.what());
  }
  double max_wall = 0, max_busy = 0;
  for (const RankTrace& t : traces) {
    const int pr = t.info.value("coord", nlohmann::json::object()).value("pp", 0);
    std::map<int64_t, std::pair<double, double>> span;  // step -> first start, last end
    std::map<int64_t, double> busy;
    PipelineRank pr_row;
    pr_row.rank = t.rank;
    pr_row.pp_rank = pr;
    std::array<double, 3> s{0, 0, 0};
    std::array<int64_t, 3> n{0, 0, 0};
    for (const TraceEvent& e : t.events) {
      if (e.cat != "annotation" || (e.op != "F" && e.op != "B" && e.op != "W")) continue;
      auto& sp = span.try_emplace(e.step, e.ts, e.end).first->second;
      sp.first = std::min(sp.first, e.ts);
      sp.second = std::max(sp.second, e.end);
      busy[e.step] += e.dur();
      const int k = e.pass == "F" ? 0 : e.pass == "B" ? 1 : 2;
      s[size_t(k)] += e.dur();
      n[size_t(k)] += 1;
      if (sched && e.chunk >= 0 && e.chunk < p.vpp) {
        const int st = sched->stage_of(pr, e.chunk);
        sum[size_t(st)][size_t(k)] += e.dur();
        cnt[size_t(st)][size_t(k)] += 1;
      }
    }
    if (span.empty()) continue;
    for (auto& [step, sp] : span) {
      pr_row.wall_ms += (sp.second - sp.first) * 1e-3;
      pr_row.busy_ms += busy[step] * 1e-3;
    }
    const double steps = double(span.size());
    pr_row.wall_ms /= steps;
    pr_row.busy_ms /= steps;
    pr_row.bubble = pr_row.wall_ms > 0 ? (pr_row.wall_ms - pr_row.busy_ms) / pr_row.wall_ms : 0;
    pr_row.f_ms = n[0] ? s[0] * 1e-3 / double(n[0]) : 0;
    pr_row.b_ms = n[1] ? s[1] * 1e-3 / double(n[1]) : 0;
    pr_row.w_ms = n[2] ? s[2] * 1e-3 / double(n[2]) : 0;
    pr_row.ops = n[0] + n[1] + n[2];
    max_wall = std::max(max_wall, pr_row.wall_ms);
    max_busy = std::max(max_busy, pr_row.busy_ms);
    p.ranks.push_back(pr_row);
  }
  if (p.ranks.empty()) return;
  p.measured_bubble = max_wall > 0 ? (max_wall - max_busy) / max_wall : 0;
  if (sched) {
    // Stages no profiled rank ran take the mean of the others.
    std::array<double, 3> mean{0, 0, 0};
    std::array<int64_t, 3> mc{0, 0, 0};
    for (int st = 0; st < stages; ++st)
      for (int k = 0; k < 3; ++k)
        if (cnt[size_t(st)][size_t(k)]) mean[size_t(k)] += sum[size_t(st)][size_t(k)] / double(cnt[size_t(st)][size_t(k)]), mc[size_t(k)]++;
    pipeline::Costs c;
    c.pair_overlap = 0;
    bool missing = false;
    for (int st = 0; st < stages; ++st) {
      pipeline::StageCost sc;
      double* f[3] = {&sc.forward, &sc.backward, &sc.weight};
      for (int k = 0; k < 3; ++k) {
        if (cnt[size_t(st)][size_t(k)]) *f[k] = sum[size_t(st)][size_t(k)] / double(cnt[size_t(st)][size_t(k)]);
        else if (mc[size_t(k)]) *f[k] = mean[size_t(k)] / double(mc[size_t(k)]), missing = true;
        else *f[k] = 1e-3, missing = true;
      }
      c.stages.push_back(sc);
    }
    try {
      if (p.schedule == "zb-auto") {  // built for the measured times, as the trainer built it for modelled ones
        pipeline::ScheduleRequest req;
        req.pp = pp, req.vpp = p.vpp, req.microbatches = p.microbatches, req.costs = c;
        sched = pipeline::generate(p.schedule, req);
      }
      p.simulated_bubble = pipeline::simulate(*sched, c).bubble_rate;
      if (missing) p.note = "stages of ranks without a trace take the mean of the others' times";
    } catch (const Error& e) {
      p.note = fmt::format("simulation failed: {}", e.what());
    }
  }
  r.pipeline = p;
}

}  // namespace

TraceReport analyze(const std::vector<RankTrace>& traces) {
  if (traces.empty()) fail("analyze trace: no traces");
  TraceReport r;
  const nlohmann::json& info = traces.front().info;
  r.device = info.value("device", std::string());
  r.peak_tflops = info.value("peak_tflops", 0.0);
  r.memory_bandwidth_gbs = info.value("memory_bandwidth_gbs", 0.0);
  std::map<std::string, OpRow> by_op, by_cat;
  struct G {
    GemmRow row;
    double flops = 0, bytes = 0, us = 0;
    std::set<std::string> modules, passes;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, G> gemms;
  std::map<std::pair<std::string, std::string>, LayerRow> layers;
  std::set<int64_t> steps;
  for (const RankTrace& t : traces) {
    r.ranks.push_back(t.rank);
    r.per_rank.push_back(timeline_of(t.events));
    for (const TraceEvent& e : t.events) {
      if (e.step >= 0) steps.insert(e.step);
      if (e.cat == "annotation" && e.op == "layer") {
        const std::string where = e.layer >= 0 ? fmt::format("layer {}", e.layer) : e.module;
        LayerRow& l = layers[{e.pass, where}];
        l.pass = e.pass, l.where = where;
        l.count += 1;
        l.time_ms += e.dur() * 1e-3;
      }
      if (!device_cat(e.cat)) continue;
      OpRow& o = by_op[e.op];
      o.name = e.op;
      o.category = op_category(e.op, e.cat);
      o.count += 1;
      o.time_ms += e.dur() * 1e-3;
      OpRow& c = by_cat[o.category];
      c.name = c.category = o.category;
      c.count += 1;
      c.time_ms += e.dur() * 1e-3;
      if (e.op == "gemm") {
        G& g = gemms[{e.M, e.N, e.K, e.dtype}];
        g.row.M = e.M, g.row.N = e.N, g.row.K = e.K, g.row.dtype = e.dtype;
        g.row.count += 1;
        g.flops += e.flops;
        g.bytes += e.bytes;
        g.us += e.dur();
        if (!e.module.empty()) g.modules.insert(e.module);
        if (!e.pass.empty()) g.passes.insert(e.recompute ? e.pass + "(recompute)" : e.pass);
      }
    }
  }
  r.steps = int64_t(steps.size());
  for (const Timeline& t : r.per_rank) {
    const double n = double(r.per_rank.size());
    r.mean.total_ms += t.total_ms / n;
    r.mean.computation_ms += t.computation_ms / n;
    r.mean.exposed_comm_ms += t.exposed_comm_ms / n;
    r.mean.exposed_memcpy_ms += t.exposed_memcpy_ms / n;
    r.mean.idle_ms += t.idle_ms / n;
    r.mean.busy_ms += t.busy_ms / n;
    r.mean.total_comm_ms += t.total_comm_ms / n;
    r.mean.total_memcpy_ms += t.total_memcpy_ms / n;
  }
  r.ops = summarize(by_op);
  r.categories = summarize(by_cat);
  for (auto& [k, g] : gemms) {
    GemmRow row = g.row;
    row.time_ms = g.us * 1e-3;
    row.mean_us = g.us / double(row.count);
    row.tflops = g.us > 0 ? g.flops / (g.us * 1e-6) / 1e12 : 0;
    row.flops_per_byte = g.bytes > 0 ? g.flops / g.bytes : 0;
    const double mem_roof = row.flops_per_byte * r.memory_bandwidth_gbs / 1e3;  // TFLOP/s
    row.roofline_tflops = r.memory_bandwidth_gbs > 0 ? std::min(r.peak_tflops, mem_roof) : r.peak_tflops;
    row.roofline_percent = row.roofline_tflops > 0 ? 100 * row.tflops / row.roofline_tflops : 0;
    row.bound = r.memory_bandwidth_gbs > 0 && mem_roof < r.peak_tflops ? "memory" : "compute";
    row.modules = joined(g.modules);
    row.passes = joined(g.passes);
    r.gemms.push_back(row);
  }
  std::sort(r.gemms.begin(), r.gemms.end(), [](const GemmRow& a, const GemmRow& b) { return a.time_ms > b.time_ms; });
  for (auto& [k, l] : layers) {
    l.mean_ms = l.time_ms / double(l.count);
    r.layers.push_back(l);
  }
  add_collectives(traces, r);
  add_pipeline(traces, r);
  return r;
}

}  // namespace primus::trace
