// analyze schedule: builds a pipeline schedule by name, validates and simulates it, and prints
// it as a terminal timeline, JSON or SVG; --compare prints one row per algorithm. With a model
// (--model, or an experiment --config) the stage times come from the model's FLOPs for the
// layer split the trainer would use (plan/parallel_layout.h), pipeline_balance included.
//
//   primus-cli direct -- analyze schedule --algorithm zb-h1 --pp 4 --microbatches 8 --format text
//   primus-cli direct -- analyze schedule --algorithm 1f1b --pp 4 --microbatches 8 --model tiny_llama
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "config/experiment.h"
#include "core/error.h"
#include "pipeline/render.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/simulator.h"
#include "plan/parallel_layout.h"

namespace primus::cli {
namespace analyze_schedule_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

using namespace primus::pipeline;
using nlohmann::json;

struct Options {
  std::string algorithm;
  ScheduleRequest req;
  std::string format = "text";
  std::string output;
  bool compare = false;
  // Stage times from a model: a preset or model YAML with these sizes, or an experiment config.
  std::string model, config;
  int64_t seq_length = 0, micro_batch_size = 1, first_layers = 0, last_layers = 0;
  int tp = 1;
  std::string balance = "auto";
  double gflops = 0;  // to print milliseconds instead of GFLOP
  bool times_given = false;
  bool after_b_given = false;  // --activation-after-b: else, with a model, the model's measured ratio
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

// The trainer's layout for the model: its split (balanced or not), stage costs and schedule.
plan::ParallelLayout model_layout(const Options& o) {
  if (o.times_given) fail("--model and --config take the stage times from the model; drop --t-forward/backward/weight");
  if (o.compare) fail("--compare runs every algorithm with its own chunks; give --model with one --algorithm");
  config::TrainingArgs a;
  ModelSpec spec;
  if (!o.config.empty()) {
    if (!o.model.empty()) fail("give --model or --config, not both");
    if (!o.algorithm.empty() || o.req.pp >= 0 || o.req.microbatches >= 0)
      fail("--config gives the schedule, pp and microbatches itself; drop --algorithm, --pp and --microbatches");
    const config::ExperimentConfig cfg = config::load_experiment(o.config);
    a = cfg.train;
    spec = cfg.model_spec;
  } else {
    if (o.algorithm.empty()) fail("--algorithm is required with --model (one of: {})", fmt::join(algorithm_names(), ", "));
    if (o.req.pp < 0 || o.req.microbatches < 0) fail("--pp and --microbatches are required with --model");
    spec = load_model_spec(o.model);
    a.pipeline_schedule = o.algorithm;
    a.pipeline_model_parallel_size = o.req.pp;
    a.virtual_pipeline_model_parallel_size = o.req.vpp;
    a.tensor_model_parallel_size = o.tp;
    a.micro_batch_size = o.micro_batch_size;
    a.global_batch_size = o.micro_batch_size * o.req.microbatches;
    a.seq_length = o.seq_length > 0 ? o.seq_length : spec.max_position_embeddings;
    const auto balance = config::find_choice<config::PipelineBalance>(o.balance);
    if (!balance) fail("{}", config::not_a_choice<config::PipelineBalance>("--balance", o.balance));
    a.pipeline_balance = *balance;
    a.decoder_first_pipeline_num_layers = o.first_layers;
    a.decoder_last_pipeline_num_layers = o.last_layers;
    a.zero_bubble_max_pending_backward = int64_t(o.req.memory_limit);
  }
  if (a.pipeline_model_parallel_size < 2) fail("pipeline_model_parallel_size must be at least 2 to split a model");
  // One data-parallel rank: the world is the model-parallel ranks.
  return plan::plan_layout(
      a, spec, int(a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size),
      o.after_b_given ? std::optional<double>(o.req.costs.activation_after_b) : std::nullopt);
}

int run(const Options& o) {
  if (o.format != "text" && o.format != "json" && o.format != "svg")
    fail("--format must be text, json or svg (got '{}')", o.format);
  ScheduleRequest req = o.req;
  std::optional<plan::ParallelLayout> layout;
  if (!o.model.empty() || !o.config.empty()) {
    layout = model_layout(o);
    req.costs.stages = layout->stage_costs;
    req.costs.activation_after_b = layout->activation_after_b;  // the model's, or --activation-after-b
    if (o.gflops > 0)
      for (StageCost& c : req.costs.stages)
        c.forward /= o.gflops, c.backward /= o.gflops, c.weight /= o.gflops;
  } else if (o.req.pp < 0 || o.req.microbatches < 0) {
    fail("--pp and --microbatches are required (or an experiment --config)");
  }
  if (o.compare) {
    if (o.format == "svg") fail("--compare prints a table: use --format text or json");
    return compare(o);
  }
  if (o.algorithm.empty() && !layout)
    fail("--algorithm is required (one of: {}), or use --compare", fmt::join(algorithm_names(), ", "));
  Schedule s = layout ? *layout->schedule : generate(o.algorithm, req);
  SimResult r = simulate(s, req.costs);
  std::string head;
  if (layout) {
    head = fmt::format("layout: {}\nstage times per microbatch (F+B+W, {}):", layout->describe(),
                       o.gflops > 0 ? fmt::format("ms at {:g} GFLOP/s", o.gflops) : "GFLOP");
    for (const StageCost& c : req.costs.stages)
      head += fmt::format(" {:.4g}", (c.forward + c.backward + c.weight) * (o.gflops > 0 ? 1e3 : 1.0));
    head += "\n";
    if (layout->balance && o.gflops > 0) head += layout->describe_balance(o.gflops) + "\n";
  }
  if (o.format == "json") {
    json j = to_json(s, r);
    if (layout) {
      j["layers_per_stage"] = json::array();
      for (const LayerRange& l : layout->stages) j["layers_per_stage"].push_back(l.num_layers);
      j["stage_costs"] = json::array();
      for (const StageCost& c : req.costs.stages)
        j["stage_costs"].push_back({{"forward", c.forward}, {"backward", c.backward}, {"weight", c.weight}});
      j["time_unit"] = o.gflops > 0 ? "s" : "GFLOP-s at 1 GFLOP/s";
      if (layout->balance && layout->balance->even_valid) {
        j["even_split_step"] = layout->balance->even_step / (o.gflops > 0 ? o.gflops : 1.0);
        j["balanced_step"] = layout->balance->step / (o.gflops > 0 ? o.gflops : 1.0);
      }
    }
    emit(o, j.dump(2) + "\n");
  } else if (o.format == "svg") {
    emit(o, render_svg(s, r, req.costs));
  } else {
    emit(o, head + render_text(s, r) + (s.note.empty() ? "" : s.note + "\n"));
  }
  return 0;
}

TaskRegistrar reg{{"analyze", "schedule",
                   "build, validate and simulate a pipeline schedule (text, JSON or SVG; --compare)",
                   [](CLI::App& app) -> TaskAction {
                     auto o = std::make_shared<Options>();
                     app.add_option("--algorithm", o->algorithm,
                                    "schedule: " + fmt::format("{}", fmt::join(algorithm_names(), ", ")));
                     o->req.pp = o->req.microbatches = -1;  // not given
                     app.add_option("--pp", o->req.pp, "pipeline stages (ranks)");
                     app.add_option("--microbatches", o->req.microbatches, "microbatches per step");
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
                                    "paper's M_W / M_B; with --model or --config the model's, measured)")
                         ->capture_default_str();
                     app.add_option("--pair-overlap", o->req.costs.pair_overlap,
                                    "overlapped F&B pairs (dualpipev) cost max + (1 - this) x min of their two ops")
                         ->capture_default_str();
                     o->req.ilp_seconds = 2;
                     app.add_option("--ilp-seconds", o->req.ilp_seconds,
                                    "zb-auto: time for the ILP refinement (CBC) after the heuristic; 0: heuristic only")
                         ->capture_default_str();
                     app.add_option("--model", o->model,
                                    "stage times from this model's FLOPs (a preset or model YAML), for the layer "
                                    "split the trainer would use");
                     app.add_option("--config", o->config,
                                    "stage times, schedule and split from an experiment config, as the trainer "
                                    "plans them (one data-parallel rank)");
                     app.add_option("--seq-length", o->seq_length, "with --model: tokens per sequence (default: "
                                    "max_position_embeddings)");
                     app.add_option("--micro-batch-size", o->micro_batch_size, "with --model: sequences per microbatch")
                         ->capture_default_str();
                     app.add_option("--tp", o->tp, "with --model: tensor-parallel ranks")->capture_default_str();
                     app.add_option("--balance", o->balance,
                                    "with --model: pipeline_balance, none (even, or the two keys below) or auto")
                         ->capture_default_str();
                     app.add_option("--decoder-first-pipeline-num-layers", o->first_layers,
                                    "with --model and --balance none: layers on the first pipeline rank");
                     app.add_option("--decoder-last-pipeline-num-layers", o->last_layers,
                                    "with --model and --balance none: layers on the last pipeline rank");
                     app.add_option("--gflops", o->gflops,
                                    "with --model: GFLOP/s per rank, to give stage times in milliseconds");
                     app.add_option("--format", o->format, "text | json | svg")->capture_default_str();
                     app.add_option("--output", o->output, "write to this file instead of stdout");
                     app.add_flag("--compare", o->compare, "one row per algorithm for these p, m and times");
                     CLI::App* self = &app;
                     return [o, self]() {
                       for (const char* t : {"--t-forward", "--t-backward", "--t-weight"})
                         o->times_given = o->times_given || self->count(t) > 0;
                       o->after_b_given = self->count("--activation-after-b") > 0;
                       return run(*o);
                     };
                   }}};

}  // namespace
}  // namespace primus::cli
