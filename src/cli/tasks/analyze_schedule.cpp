// analyze schedule: builds a pipeline schedule by name, validates and simulates it, and prints
// it as a terminal timeline, JSON or SVG; --compare prints one row per algorithm.
//
//   primus-cli direct -- analyze schedule --algorithm zb-h1 --pp 4 --microbatches 8 --format text
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "core/error.h"
#include "pipeline/render.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/simulator.h"

namespace primus::cli {
namespace {

using namespace primus::pipeline;
using nlohmann::json;

struct Options {
  std::string algorithm;
  ScheduleRequest req;
  std::string format = "text";
  std::string output;
  bool compare = false;
};

json to_json(const Schedule& s, const SimResult& r) {
  json j;
  j["algorithm"] = s.algorithm;
  j["pp"] = s.pp;
  j["vpp"] = s.vpp;
  j["microbatches"] = s.microbatches;
  j["placement"] = placement_name(s.placement);
  if (!s.note.empty()) j["note"] = s.note;
  j["makespan"] = r.makespan;
  j["bubble_rate"] = r.bubble_rate;
  j["per_rank"] = json::array();
  for (auto& st : r.per_rank)
    j["per_rank"].push_back({{"span", st.span}, {"busy", st.busy}, {"peak_activations", st.peak_activations}});
  auto p2p = [](const P2P& p) {
    return json{{"peer", p.peer}, {"microbatch", p.microbatch}, {"stage", p.stage}, {"direction", direction_name(p.dir)}};
  };
  j["ops"] = json::array();
  for (int k = 0; k < s.pp; ++k) {
    json ops = json::array();
    for (size_t i = 0; i < s.ranks[k].size(); ++i) {
      const Op& op = s.ranks[k][i];
      json o{{"type", op_name(op.type)}, {"microbatch", op.microbatch}, {"chunk", op.chunk},
             {"stage", s.stage_of(k, op.chunk)}, {"start", r.times[k][i].start}, {"end", r.times[k][i].end}};
      if (op.recv) o["recv"] = p2p(*op.recv);
      if (op.send) o["send"] = p2p(*op.send);
      ops.push_back(std::move(o));
    }
    j["ops"].push_back(std::move(ops));
  }
  return j;
}

void emit(const Options& o, const std::string& text) {
  if (o.output.empty()) {
    std::cout << text;
    return;
  }
  std::ofstream f(o.output);
  if (!f) fail("cannot write --output file '{}'", o.output);
  f << text;
  if (!f) fail("failed writing --output file '{}'", o.output);
}

int compare(const Options& o) {
  json rows = json::array();
  std::string text = fmt::format("pp {}  microbatches {}  T_F {:g}  T_B {:g}  T_W {:g}  T_comm {:g}\n",
                                 o.req.pp, o.req.microbatches, o.req.costs.t_forward, o.req.costs.t_backward,
                                 o.req.costs.t_weight, o.req.costs.t_comm);
  text += fmt::format("{:<18}{:>5}{:>11}{:>9}{:>11}  {}\n", "algorithm", "vpp", "makespan", "bubble", "peak act.",
                      "per-rank peak");
  for (auto& g : generators()) {
    ScheduleRequest req = o.req;
    req.vpp = 0;  // each algorithm at its own chunk count
    try {
      Schedule s = generate(g.name, req);
      SimResult r = simulate(s, req.costs);
      std::string peaks;
      for (auto& st : r.per_rank) peaks += fmt::format("{}{:g}", peaks.empty() ? "" : ",", st.peak_activations);
      int pairs = 0;
      for (auto& ops : s.ranks)
        for (auto& op : ops) pairs += op.overlap_next;
      std::string extra;
      if (pairs)
        extra = fmt::format("  ({} overlapped F&B pairs, each max + {:g} x min of its ops)", pairs,
                            1 - req.costs.pair_overlap);
      text += fmt::format("{:<18}{:>5}{:>11.4g}{:>8.2f}%{:>11.4g}  {}{}\n", g.name, s.vpp, r.makespan,
                          100 * r.bubble_rate, r.peak_activations, peaks, extra);
      json row{{"algorithm", g.name}, {"vpp", s.vpp}, {"makespan", r.makespan}, {"bubble_rate", r.bubble_rate},
               {"peak_activations", r.peak_activations}, {"overlapped_pairs", pairs}};
      rows.push_back(row);
    } catch (const Error& e) {
      text += fmt::format("{:<18}  n/a: {}\n", g.name, e.what());
      rows.push_back({{"algorithm", g.name}, {"error", e.what()}});
    }
  }
  emit(o, o.format == "json" ? rows.dump(2) + "\n" : text);
  return 0;
}

int run(const Options& o) {
  if (o.format != "text" && o.format != "json" && o.format != "svg")
    fail("--format must be text, json or svg (got '{}')", o.format);
  if (o.compare) {
    if (o.format == "svg") fail("--compare prints a table: use --format text or json");
    return compare(o);
  }
  if (o.algorithm.empty())
    fail("--algorithm is required (one of: {}), or use --compare", fmt::join(algorithm_names(), ", "));
  Schedule s = generate(o.algorithm, o.req);
  SimResult r = simulate(s, o.req.costs);
  if (o.format == "json") emit(o, to_json(s, r).dump(2) + "\n");
  else if (o.format == "svg") emit(o, render_svg(s, r, o.req.costs));
  else emit(o, render_text(s, r) + (s.note.empty() ? "" : s.note + "\n"));
  return 0;
}

TaskRegistrar reg{{"analyze", "schedule",
                   "build, validate and simulate a pipeline schedule (text, JSON or SVG; --compare)",
                   [](CLI::App& app) -> TaskAction {
                     auto o = std::make_shared<Options>();
                     app.add_option("--algorithm", o->algorithm,
                                    "schedule: " + fmt::format("{}", fmt::join(algorithm_names(), ", ")));
                     app.add_option("--pp", o->req.pp, "pipeline stages (ranks)")->required();
                     app.add_option("--microbatches", o->req.microbatches, "microbatches per step")->required();
                     app.add_option("--vpp", o->req.vpp, "chunks per rank (default: the algorithm's)");
                     app.add_option("--t-forward", o->req.costs.t_forward, "forward time of one stage")
                         ->capture_default_str();
                     app.add_option("--t-backward", o->req.costs.t_backward, "input-gradient (B) time of one stage")
                         ->capture_default_str();
                     app.add_option("--t-weight", o->req.costs.t_weight, "weight-gradient (W) time of one stage")
                         ->capture_default_str();
                     app.add_option("--t-comm", o->req.costs.t_comm, "transfer time between ranks, per chunk")
                         ->capture_default_str();
                     app.add_option("--memory-limit,--max-pending-backward", o->req.memory_limit,
                                    "activations a rank may hold, in microbatches of one stage (zb-auto, zbv, "
                                    "v-half, v-min); for zb-auto Megatron's zero_bubble_max_pending_backward: p is "
                                    "ZB-1p (the default), 2p ZB-2p");
                     app.add_option("--activation-after-b", o->req.costs.activation_after_b,
                                    "part of a microbatch's activation kept from its B to its W (the zero-bubble "
                                    "paper's M_W / M_B)")
                         ->capture_default_str();
                     app.add_option("--pair-overlap", o->req.costs.pair_overlap,
                                    "overlapped F&B pairs (dualpipev) cost max + (1 - this) x min of their two ops")
                         ->capture_default_str();
                     o->req.ilp_seconds = 5;
                     app.add_option("--ilp-seconds", o->req.ilp_seconds,
                                    "zb-auto: time for the ILP refinement (CBC) after the heuristic; 0: heuristic only")
                         ->capture_default_str();
                     app.add_option("--format", o->format, "text | json | svg")->capture_default_str();
                     app.add_option("--output", o->output, "write to this file instead of stdout");
                     app.add_flag("--compare", o->compare, "one row per algorithm for these p, m and times");
                     return [o]() { return run(*o); };
                   }}};

}  // namespace
}  // namespace primus::cli
