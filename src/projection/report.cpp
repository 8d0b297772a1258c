// A projection as JSON and as text.
#include <fmt/format.h>

#include "projection/projection.h"

namespace primus::projection {
namespace {

std::string gib(double b) { return fmt::format("{:.2f} GiB", b / double(1u << 30)); }
std::string mib_or_gib(double b) {
  return b < double(1u << 30) ? fmt::format("{:.1f} MiB", b / double(1u << 20)) : gib(b);
}

nlohmann::ordered_json layout_json(const Projection& p) {
  const auto& L = p.layout;
  return {{"world_size", L.world_size},
          {"tp", L.tp},
          {"pp", L.pp},
          {"dp", L.dp},
          {"vpp", L.vpp},
          {"cp", L.cp},
          {"ep", L.ep},
          {"etp", L.etp},
          {"sequence_parallel", L.sequence_parallel},
          {"schedule", L.schedule ? L.schedule->algorithm : ""},
          {"microbatches_per_rank", L.microbatches_per_rank},
          {"describe", L.describe()}};
}

}  // namespace

nlohmann::ordered_json to_json(const Projection& p) {
  nlohmann::ordered_json j;
  j["model"] = p.model;
  j["hardware"] = {{"name", p.hardware.name},
                   {"description", p.hardware.description},
                   {"peak_tflops", p.hardware.peak_tflops},
                   {"memory_gb", p.hardware.memory_gb},
                   {"memory_bandwidth_gbs", p.hardware.memory_bandwidth_gbs},
                   {"link_gbs", p.hardware.link_gbs},
                   {"link_latency_us", p.hardware.link_latency_us},
                   {"nic_gbs", p.hardware.nic_gbs},
                   {"nic_latency_us", p.hardware.nic_latency_us},
                   {"source", p.hardware.source}};
  j["nodes"] = p.nodes;
  j["gpus_per_node"] = p.gpus_per_node;
  j["layout"] = layout_json(p);
  j["sharding"] = sharding_name(p.sharding);
  j["walk_seconds"] = p.walk_seconds;
  j["recompute"] = recompute_name(p.args.recompute_granularity);
  j["precision"] = precision_name(p.precision);
  j["micro_batch_size"] = p.args.micro_batch_size;
  j["global_batch_size"] = p.args.global_batch_size;
  j["seq_length"] = p.args.seq_length;
  if (p.memory) {
    nlohmann::ordered_json per = nlohmann::ordered_json::array();
    for (const RankMemory& r : p.memory->per_rank)
      per.push_back({{"pp_rank", r.pp_rank},
                     {"peak_bytes", r.peak},
                     {"parameters", r.parameter_count},
                     {"parameter_bytes", r.parameters},
                     {"working_weight_bytes", r.working_weights},
                     {"gradient_bytes", r.gradients},
                     {"optimizer_bytes", r.optimizer},
                     {"activation_bytes", r.activations},
                     {"buffer_bytes", r.buffers},
                     {"microbatch_chunks_in_flight_at_peak", r.peak_in_flight},
                     {"save_elements", r.save.elements},
                     {"save_host_bytes_sync", r.save.sync_bytes},
                     {"save_host_bytes_async", r.save.async_bytes}});
    j["per_rank"] = per;
    j["memory"] = {{"capacity_bytes", p.memory->capacity}, {"fits", p.memory->fits}, {"notes", p.memory->notes}};
  }
  if (p.performance) {
    const PerformanceReport& r = *p.performance;
    nlohmann::ordered_json st = nlohmann::ordered_json::array();
    for (const StageTimes& s : r.stages)
      st.push_back({{"stage", s.stage}, {"f_ms", 1e3 * s.f}, {"b_ms", 1e3 * s.b}, {"w_ms", 1e3 * s.w},
                    {"tp_comm_ms", 1e3 * s.tp_comm}});
    j["performance"] = {{"timing", r.timing},
                        {"step_time_ms", 1e3 * r.step_s},
                        {"tokens_per_s", r.tokens_per_s},
                        {"tflops_per_gpu", r.tflops_per_gpu},
                        {"mfu", r.mfu},
                        {"pipeline_ms", 1e3 * r.pipeline_s},
                        {"bubble", r.bubble},
                        {"p2p_ms", 1e3 * r.p2p_s},
                        {"dp_comm_ms", 1e3 * r.dp_total_s},
                        {"dp_exposed_ms", 1e3 * r.dp_exposed_s},
                        {"optimizer_ms", 1e3 * r.optimizer_s},
                        {"other_comm_ms", 1e3 * r.other_s},
                        {"stages", st},
                        {"notes", r.notes}};
  }
  return j;
}

std::string to_text(const Projection& p) {
  std::string s = fmt::format("projection of {} on {} node(s) x {} {} ({}): {}\n", p.model, p.nodes, p.gpus_per_node,
                              p.hardware.name, p.hardware.source, p.layout.describe());
  s += fmt::format("  sharding {}, recompute {}, {}, micro batch {}, global batch {}, sequence {}\n",
                   sharding_name(p.sharding), recompute_name(p.args.recompute_granularity), precision_name(p.precision),
                   p.args.micro_batch_size, p.args.global_batch_size, p.args.seq_length);
  if (p.memory) {
    s += "\nmemory per rank (every tp and dp rank of a pipeline rank alike)\n";
    s += fmt::format("  {:>7} {:>14} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "pp rank", "parameters",
                     "weights", "bf16 copy", "gradients", "optimizer", "activations", "buffers", "peak");
    for (const RankMemory& r : p.memory->per_rank)
      s += fmt::format("  {:>7} {:>14} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n", r.pp_rank,
                       r.parameter_count, gib(r.parameters), gib(r.working_weights), gib(r.gradients), gib(r.optimizer),
                       gib(r.activations), gib(r.buffers), gib(r.peak));
    if (p.memory->capacity > 0)
      s += fmt::format("  {} in {} of device memory per GPU\n", p.memory->fits ? "fits" : "DOES NOT FIT",
                       gib(p.memory->capacity));
    s += "\nhost memory of a checkpoint save per rank (beside the run's own)\n";
    s += fmt::format("  {:>7} {:>14} {:>11} {:>11} {:>11}\n", "pp rank", "writes elems", "shard", "sync", "async");
    for (const RankMemory& r : p.memory->per_rank)
      s += fmt::format("  {:>7} {:>14} {:>11} {:>11} {:>11}\n", r.pp_rank, r.save.elements,
                       mib_or_gib(12.0 * double(r.save.elements)), mib_or_gib(r.save.sync_bytes),
                       mib_or_gib(r.save.async_bytes));
    for (const auto& n : p.memory->notes) s += "  note: " + n + "\n";
  }
  if (p.performance) {
    const PerformanceReport& r = *p.performance;
    s += fmt::format("\nstep time ({})\n", r.timing);
    s += fmt::format("  {:>5} {:>10} {:>10} {:>10} {:>12}\n", "stage", "F ms", "B ms", "W ms", "tp comm ms");
    for (const StageTimes& t : r.stages)
      s += fmt::format("  {:>5} {:>10.3f} {:>10.3f} {:>10.3f} {:>12.3f}\n", t.stage, 1e3 * t.f, 1e3 * t.b, 1e3 * t.w,
                       1e3 * t.tp_comm);
    s += fmt::format("  pipeline {:.3f} ms (bubble {:.1f}%, transfer {:.3f} ms), data-parallel reduction {:.3f} ms "
                     "({:.3f} ms exposed), optimizer and norm {:.3f} ms, small collectives {:.3f} ms\n",
                     1e3 * r.pipeline_s, 100 * r.bubble, 1e3 * r.p2p_s, 1e3 * r.dp_total_s, 1e3 * r.dp_exposed_s,
                     1e3 * r.optimizer_s, 1e3 * r.other_s);
    s += fmt::format("  step {:.3f} ms | tokens/s {:.0f} | TFLOP/s per GPU {:.3f} | MFU {:.1f}%\n", 1e3 * r.step_s,
                     r.tokens_per_s, r.tflops_per_gpu, 100 * r.mfu);
    for (const auto& n : r.notes) s += "  note: " + n + "\n";
  }
  return s;
}

}  // namespace primus::projection
