#include "safe/analyze.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "safe/detect.h"
#include "safe/events.h"
#include "safe/heartbeat.h"
#include "safe/metrics_writer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::safe {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

const std::map<std::string, std::pair<std::string, std::string>>& cause_text() {
  // cause -> (title, suggestion)
  static const std::map<std::string, std::pair<std::string, std::string>> m = {
      {"hang",
       {"hang", "read the stack dumps named above: a rank waiting in a collective points at a peer that never "
                "arrived (a dead or stuck rank, a network fault); rank-local stacks in I/O point at the storage. "
                "If steps or checkpoint writes are legitimately slow, raise --hang-timeout."}},
      {"crashed_rank",
       {"crashed rank", "a rank was killed from outside or crashed: SIGKILL usually means the kernel's OOM killer "
                        "(check `dmesg | grep -i oom` on its node), the scheduler or an operator; SIGSEGV/SIGABRT "
                        "a bug (run that rank under gdb). --max-restarts N resumes from the last good checkpoint."}},
      {"out_of_memory",
       {"out of memory", "lower micro_batch_size or seq_length, set recompute_granularity: full, or spread the model "
                         "over more ranks (tensor/pipeline parallelism); check that no other job shares the node."}},
      {"comm_timeout",
       {"communication timeout", "check the links with `primus-cli direct --nproc N -- preflight check --network`, "
                                 "look for a rank that died or hung first (it leaves its peers waiting), and rerun "
                                 "with NCCL_DEBUG=INFO on GPUs."}},
      {"nan",
       {"NaN/Inf loss or gradient", "lower lr or lengthen lr_warmup_iters, set clip_grad (e.g. 1.0), and inspect "
                                    "the data around the iteration named; --nan-policy skip steps over isolated "
                                    "bad batches."}},
      {"hardware",
       {"hardware error", "take the node out of service and run `preflight check --gpu` on it; report ECC/Xid "
                          "errors to the operators before reusing it."}},
      {"error",
       {"error in the task", "read the error message: it names the setting or file at fault; fix it and launch again "
                             "(a restart would fail the same way)."}},
      {"interrupted", {"interrupted", "the job was stopped by a signal from the user or the scheduler (time limit?)."}},
      {"straggler",
       {"straggler", "the rank's node is slower than its peers: check for other processes (top), CPU/GPU clocks and "
                     "thermal throttling, and run `preflight check --host --gpu` there."}},
      {"loss_spike",
       {"loss spike", "one spike is usually a bad batch; repeated spikes call for a lower lr, a longer warmup or "
                      "clip_grad."}},
      {"throughput_drop",
       {"throughput drop", "compare with the events at those iterations (stragglers, checkpoint writes, evaluation); "
                           "a drop without an event points at the node (other jobs, throttling) or the storage."}},
      {"unknown",
       {"unknown", "no event or log line explains it: look at logs/stderr.log and the rank logs."}},
      {"metrics_skipped",
       {"metrics lines passed over", "the curves and numbers above leave these lines out: a line cut short by a "
                                     "crash is expected once; NaN values point at the steps the nan events name; "
                                     "other garbage means something else wrote into metrics.jsonl."}},
  };
  return m;
}

Finding make_finding(const std::string& cause) {
  Finding f;
  f.cause = cause;
  auto it = cause_text().find(cause);
  if (it != cause_text().end()) {
    f.title = it->second.first;
    f.suggestion = it->second.second;
  }
  return f;
}

std::vector<std::string> read_lines(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::vector<int> ints(const json& j) {
  std::vector<int> out;
  if (j.is_array())
    for (const auto& v : j)
      if (v.is_number_integer()) out.push_back(v.get<int>());
  return out;
}

// One log line that names a known cause, with where it was seen.
struct LogHit {
  std::string cause, file, line;
  int attempt = 0;  // from stderr.log's attempt markers; 0 when unknown (rank logs)
};

std::vector<LogHit> scan_logs(const fs::path& run_dir) {
  std::vector<LogHit> hits;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(run_dir / "logs", ec))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  static const std::regex marker(R"(=== primus watch: attempt (\d+) started)");
  for (const auto& f : files) {
    int attempt = 0;
    for (const auto& line : read_lines(f)) {
      std::smatch m;
      if (std::regex_search(line, m, marker)) {
        attempt = std::stoi(m[1]);
        continue;
      }
      const std::string c = classify_log_line(line);
      if (!c.empty()) hits.push_back({c, f.filename().string(), line.substr(0, 300), attempt});
    }
  }
  return hits;
}

std::string join(const std::vector<int>& v) { return fmt::format("{}", fmt::join(v, ",")); }

}  // namespace

std::string classify_log_line(const std::string& raw) {
  const std::string l = lower(raw);
  // The watch's own lines quote other messages; they are evidence only through events.
  if (l.find("primus watch:") != std::string::npos) return "";
  static const char* oom[] = {"out of memory", "std::bad_alloc", "cannot allocate memory", "outofmemory",
                              "oom-kill", "oom_kill", "hiperroroutofmemory", "cublas_status_alloc_failed"};
  static const char* comm[] = {"collective operation timeout", "nccl timeout", "timed out", "mpi_err",
                               "lost communication", "connection reset by peer", "nccl error", "communication timeout",
                               "rccl error"};
  static const char* hw[] = {"xid", "uncorrectable ecc", "ecc error", "fallen off the bus", "machine check",
                             "hardware error", "nvlink error", "pcie bus error"};
  for (const char* p : oom)
    if (l.find(p) != std::string::npos) return "out_of_memory";
  for (const char* p : hw)
    if (l.find(p) != std::string::npos) {
      // "xid" must be a word, not part of e.g. "hexid"
      if (std::string(p) == "xid" && !std::regex_search(l, std::regex(R"(\bxid\b)"))) continue;
      return "hardware";
    }
  for (const char* p : comm)
    if (l.find(p) != std::string::npos) return "comm_timeout";
  if (l.find("is not finite") != std::string::npos) return "nan";
  return "";
}

RunAnalysis analyze_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("analyze run: '{}' does not exist", dir.string());
  if (!fs::is_directory(dir, ec)) fail("analyze run: '{}' is not a folder", dir.string());
  const bool has_any = fs::exists(dir / "events.jsonl") || fs::exists(dir / "metrics.jsonl") ||
                       fs::is_directory(dir / "snapshot") || fs::is_directory(dir / "logs") ||
                       fs::is_directory(dir / "watch");
  if (!has_any)
    fail("analyze run: '{}' is not a run folder: it has none of events.jsonl, metrics.jsonl, snapshot/, logs/, watch/ "
         "(give <workspace>/<exp_name>)", dir.string());

  RunAnalysis a;
  a.run_dir = dir.string();
  // ---- snapshot: what ran -------------------------------------------------------------------
  if (std::ifstream in(dir / "snapshot" / "command.json"); in) {
    try {
      json c = json::parse(in);
      if (c.contains("task_args")) {
        std::vector<std::string> t = c["task_args"].get<std::vector<std::string>>();
        a.task = fmt::format("{}", fmt::join(t, " "));
      }
      a.world_size = c.value("nproc", 0);
    } catch (const json::exception&) {
      a.task = "(snapshot/command.json is not valid JSON)";
    }
  }
  if (std::ifstream in(dir / "config.yaml"); in) {
    std::string line;
    static const std::regex iters(R"(^\s*train_iters:\s*(\d+))");
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, iters)) a.train_iters = std::stoll(m[1]);
    }
  }
  // ---- heartbeats: rank -> node, where each rank was -----------------------------------------
  std::map<int, std::string> node_of;
  const auto beats = read_heartbeats(dir);
  for (const auto& [r, hb] : beats) {
    node_of[r] = hb.host;
    a.last_iteration = std::max(a.last_iteration, hb.iteration);
    if (a.world_size == 0) a.world_size = hb.world_size;
  }
  auto nodes_of = [&](const std::vector<int>& ranks) {
    std::set<std::string> s;
    for (int r : ranks)
      if (node_of.count(r) && !node_of[r].empty()) s.insert(node_of[r]);
    return std::vector<std::string>(s.begin(), s.end());
  };
  // ---- metrics: loss, throughput -------------------------------------------------------------
  std::map<int64_t, json> rows;  // by iteration; a restart rewrites the iterations it redoes
  if (fs::exists(dir / "metrics.jsonl")) {
    const MetricsFile metrics = read_metrics(dir / "metrics.jsonl");
    for (const json& r : metrics.rows)
      if (r.contains("lm_loss")) rows[r["iteration"].get<int64_t>()] = r;
    if (!metrics.skipped.empty()) {
      Finding f = make_finding("metrics_skipped");
      f.iteration = -1;
      f.detail = "passed over " + metrics.describe_skipped();
      f.evidence = "metrics.jsonl";
      a.warnings.push_back(f);
    }
  }
  if (!rows.empty()) {
    auto loss = [](const json& r) { return r["lm_loss"].is_number() ? r["lm_loss"].get<double>() : std::nan(""); };
    a.first_loss = loss(rows.begin()->second);
    a.last_loss = loss(rows.rbegin()->second);
    a.last_iteration = std::max(a.last_iteration, rows.rbegin()->first);
    std::vector<double> tps;
    for (auto& [it, r] : rows)
      if (r.contains("tokens_per_sec") && r["tokens_per_sec"].is_number()) tps.push_back(r["tokens_per_sec"].get<double>());
    const double med = median(tps);
    if (tps.size() >= 4 && med > 0) {
      // Runs of rows below 70% of the median throughput.
      // The first row holds start-up costs, and one slow row is noise on a shared machine: a drop
      // is two or more rows in a row.
      int64_t start = -1, end = -1, count = 0;
      double worst = 1e300;
      auto flush = [&]() {
        if (start < 0 || count < 2) {
          start = -1, count = 0, worst = 1e300;
          return;
        }
        Finding f = make_finding("throughput_drop");
        f.iteration = start;
        f.detail = fmt::format("tokens/s fell to {:.0f} ({:.0f}% of the run's median {:.0f}) at iterations {}-{}", worst,
                               100 * worst / med, med, start, end);
        f.evidence = "metrics.jsonl";
        a.warnings.push_back(f);
        start = -1, count = 0;
        worst = 1e300;
      };
      for (auto& [it, r] : rows) {
        if (!r.contains("tokens_per_sec") || !r["tokens_per_sec"].is_number() || it == rows.begin()->first) continue;
        const double v = r["tokens_per_sec"].get<double>();
        if (v < 0.7 * med) {
          if (start < 0) start = it;
          end = it;
          ++count;
          worst = std::min(worst, v);
        } else {
          flush();
        }
      }
      flush();
    }
  }
  // ---- events: attempts, stops, warnings -----------------------------------------------------
  const auto events = read_events(dir);
  const auto log_hits = scan_logs(dir);
  // Log evidence for an attempt: hits in that attempt's stderr section, or in rank logs.
  auto log_cause = [&](int attempt) -> const LogHit* {
    for (const auto& h : log_hits)
      if (h.attempt == attempt || h.attempt == 0) return &h;
    return nullptr;
  };
  std::map<int, std::vector<std::string>> stack_files;  // attempt -> files
  std::set<std::pair<int, int64_t>> nan_seen;
  std::map<int, int64_t> nan_stop_iteration;  // attempt -> the iteration a NaN stopped
  bool ended = false, ok = false;
  for (const auto& e : events) {
    const std::string kind = e.value("kind", "");
    const int attempt = e.value("attempt", 0);
    const std::vector<int> ranks = ints(e.value("ranks", json::array()));
    const int64_t iteration = e.contains("iteration") && e["iteration"].is_number_integer() ? e["iteration"].get<int64_t>() : -1;
    if (e.contains("host") && e.contains("rank") && e["rank"].is_number_integer()) node_of[e["rank"].get<int>()] = e["host"];
    a.timeline.push_back(fmt::format("{}  [attempt {}] {}: {}", e.value("time", "?"), attempt, kind, e.value("message", "")));
    if (kind == "launch") {
      if (attempt == 1) {  // a new launch into the same folder starts the story again
        a.stops.clear();
        ended = ok = false;
      }
      a.attempts = std::max(attempt, a.attempts);
      if (a.world_size == 0) a.world_size = e.value("world_size", 0);
    } else if (kind == "stack_dump" && e.contains("file")) {
      stack_files[attempt].push_back(e["file"]);
    } else if (kind == "straggler") {
      Finding f = make_finding("straggler");
      f.ranks = ranks;
      f.attempt = attempt;
      f.detail = e.value("message", "");
      f.evidence = "events.jsonl (launcher)";
      a.warnings.push_back(f);
    } else if (kind == "loss_spike") {
      Finding f = make_finding("loss_spike");
      f.iteration = iteration;
      f.attempt = attempt;
      f.detail = e.value("message", "");
      f.evidence = "events.jsonl (rank 0)";
      a.warnings.push_back(f);
    } else if (kind == "nan" && e.value("severity", "") == "error") {
      nan_stop_iteration[attempt] = iteration;
    } else if (kind == "nan" && e.value("severity", "") == "warn") {
      if (!nan_seen.insert({attempt, iteration}).second) continue;  // one line per iteration, not per rank
      Finding f = make_finding("nan");
      f.ranks = ranks;
      f.iteration = iteration;
      f.attempt = attempt;
      f.detail = e.value("message", "");
      f.evidence = "events.jsonl (rank)";
      a.warnings.push_back(f);
    } else if (kind == "restart" || kind == "job_end") {
      const std::string reason = e.value("reason", "");
      if (kind == "job_end") {
        ended = true;
        ok = e.value("status", "") == "ok";
        a.restarts = e.value("restarts", 0);
      }
      if (reason == "finished") continue;
      std::string cause = reason == "hang" ? "hang" : reason == "rank_died" ? "crashed_rank" : reason == "interrupted" ? "interrupted" : "error";
      const std::string detail = e.value("detail", "");
      const std::string error = e.value("error", "");
      const LogHit* hit = log_cause(attempt);
      if (cause == "error" && classify_log_line(detail + " " + error) != "") cause = classify_log_line(detail + " " + error);
      else if (cause == "error" && hit) cause = hit->cause;
      else if (cause == "crashed_rank" && hit && (hit->cause == "out_of_memory" || hit->cause == "hardware")) cause = hit->cause;
      else if (cause == "hang" && hit && hit->cause == "comm_timeout") cause = "comm_timeout";
      Finding f = make_finding(cause);
      f.ranks = ranks;
      f.nodes = nodes_of(ranks);
      f.iteration = cause == "nan" && nan_stop_iteration.count(attempt) ? nan_stop_iteration[attempt] : iteration;
      f.attempt = attempt;
      f.detail = detail.empty() ? e.value("message", "") : detail;
      f.evidence = fmt::format("events.jsonl ({})", kind);
      if (hit && hit->cause == cause) f.evidence += fmt::format("; {}: {}", hit->file, hit->line);
      for (const auto& s : stack_files[attempt]) f.evidence += "; stack dump " + s;
      a.stops.push_back(f);
    }
  }
  // ---- without the launcher's record (--no-watch, a library run, a killed launcher) ----------
  if (!ended) {
    bool all_done = !beats.empty();
    for (const auto& [r, hb] : beats) all_done &= hb.phase == "done";
    if (all_done && (a.train_iters < 0 || a.last_iteration >= a.train_iters)) {
      ok = true;
    } else if (!beats.empty() || !log_hits.empty()) {
      std::vector<int> failed;
      for (const auto& [r, hb] : beats)
        if (hb.phase != "done") failed.push_back(r);
      const std::string c = !log_hits.empty() ? log_hits.front().cause : "unknown";
      Finding f = make_finding(c);
      f.ranks = failed;
      f.nodes = nodes_of(failed);
      f.iteration = a.last_iteration;
      f.detail = fmt::format("no job_end event (the launcher did not watch this run, or is still running / was killed); "
                             "rank(s) {} last reported iteration {}", join(failed), a.last_iteration);
      if (!log_hits.empty()) f.evidence = fmt::format("{}: {}", log_hits.front().file, log_hits.front().line);
      a.stops.push_back(f);
    }
  }
  a.status = ok ? "finished" : (ended || !a.stops.empty()) ? "failed" : "unknown";
  if (a.attempts > 0 && a.restarts == 0) a.restarts = a.attempts - 1;
  // ---- verdict -------------------------------------------------------------------------------
  for (auto& w : a.warnings)
    if (w.nodes.empty()) w.nodes = nodes_of(w.ranks);
  if (ok && a.stops.empty()) {
    a.verdict = "finished normally";
    std::set<std::string> titles;
    for (const auto& w : a.warnings) titles.insert(w.title);
    if (!titles.empty()) a.verdict += fmt::format(", with warnings: {}", fmt::join(titles, ", "));
  } else if (ok) {
    a.verdict = fmt::format("finished after {} restart(s); first failure: {} ({})", a.restarts, a.stops.front().title,
                            a.stops.front().detail);
  } else if (!a.stops.empty()) {
    const Finding& f = a.stops.back();
    a.verdict = fmt::format("stopped: {}{}{}", f.title, f.ranks.empty() ? "" : fmt::format(" on rank {}", join(f.ranks)),
                            f.iteration >= 0 ? fmt::format(" at iteration {}", f.iteration) : "");
  } else {
    a.verdict = "no record of an ending: still running, or stopped without leaving evidence";
  }
  return a;
}

std::string render_text(const RunAnalysis& a) {
  std::string s = fmt::format("run: {}\n", a.run_dir);
  if (!a.task.empty()) s += fmt::format("task: {}\n", a.task);
  if (a.world_size > 0) s += fmt::format("ranks: {}\n", a.world_size);
  s += fmt::format("status: {}", a.status);
  if (a.attempts > 0) s += fmt::format(" ({} attempt(s), {} restart(s))", a.attempts, a.restarts);
  s += "\n";
  if (a.last_iteration >= 0)
    s += fmt::format("progress: iteration {}{}; lm loss {:.4f} -> {:.4f}\n", a.last_iteration,
                     a.train_iters > 0 ? fmt::format(" of {}", a.train_iters) : "", a.first_loss, a.last_loss);
  s += fmt::format("verdict: {}\n", a.verdict);
  auto block = [&](const char* heading, const std::vector<Finding>& fs) {
    if (fs.empty()) return;
    s += fmt::format("\n{}:\n", heading);
    for (const auto& f : fs) {
      s += fmt::format("- {}", f.title);
      if (f.attempt > 0) s += fmt::format(" (attempt {})", f.attempt);
      if (!f.ranks.empty()) s += fmt::format(", rank {}", join(f.ranks));
      if (!f.nodes.empty()) s += fmt::format(" on {}", fmt::join(f.nodes, ","));
      if (f.iteration >= 0) s += fmt::format(", iteration {}", f.iteration);
      s += fmt::format(": {}\n", f.detail);
      if (!f.evidence.empty()) s += fmt::format("  evidence: {}\n", f.evidence);
      if (!f.suggestion.empty()) s += fmt::format("  suggestion: {}\n", f.suggestion);
    }
  };
  block("why it stopped", a.stops);
  block("warnings", a.warnings);
  if (!a.timeline.empty()) {
    s += "\ntimeline (events.jsonl):\n";
    for (const auto& t : a.timeline) s += "  " + t + "\n";
  }
  return s;
}

json to_json(const RunAnalysis& a) {
  auto fj = [](const std::vector<Finding>& v) {
    json arr = json::array();
    for (const auto& f : v)
      arr.push_back({{"cause", f.cause}, {"title", f.title}, {"detail", f.detail}, {"ranks", f.ranks},
                     {"nodes", f.nodes}, {"iteration", f.iteration}, {"attempt", f.attempt}, {"evidence", f.evidence},
                     {"suggestion", f.suggestion}});
    return arr;
  };
  return json{{"run_dir", a.run_dir},   {"task", a.task},       {"world_size", a.world_size},
              {"status", a.status},     {"attempts", a.attempts}, {"restarts", a.restarts},
              {"last_iteration", a.last_iteration}, {"train_iters", a.train_iters},
              {"verdict", a.verdict},   {"stops", fj(a.stops)}, {"warnings", fj(a.warnings)},
              {"timeline", a.timeline}};
}

}  // namespace primus::safe
