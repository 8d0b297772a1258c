#include "plan/parallel_layout.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "model/attention_core.h"
#include "model/llama.h"
#include "model/moe.h"
#include "pipeline/schedules/registry.h"
#include "plan/model_walk.h"

namespace primus::plan {

parallel::ParallelSizes ParallelLayout::sizes() const {
  parallel::ParallelSizes s;
  s.tensor_model_parallel_size = tp;
  s.pipeline_model_parallel_size = pp;
  s.context_parallel_size = cp;
  s.expert_model_parallel_size = ep;
  return s;
}

std::string ParallelLayout::describe() const {
  std::string out = fmt::format("world {} = tp {} x pp {} x dp {}", world_size, tp, pp, dp);
  if (cp > 1) out = fmt::format("world {} = tp {} x cp {} x pp {} x dp {}", world_size, tp, cp, pp, dp);
  if (ep > 1 || etp > 1)
    out += ep > 1 && etp > 1 ? fmt::format(" (ep {}, etp {})", ep, etp)
           : ep > 1          ? fmt::format(" (ep {})", ep)
                             : fmt::format(" (etp {})", etp);
  if (sequence_parallel) out += " (sequence parallel)";
  if (cp > 1) out += fmt::format("; context parallel {}", cp_all_to_all ? "a2a" : "p2p (ring)");
  if (shard_optimizer()) out += fmt::format("; data_parallel_sharding_strategy {}", config::choice_name(sharding));
  if (schedule) {
    out += fmt::format("; {} over {} stages ({} chunk{} per rank)", schedule->algorithm, pp * vpp, vpp,
                       vpp > 1 ? "s" : "");
    bool even = true;
    for (const auto& r : stages) even = even && r.num_layers == stages.front().num_layers;
    if (!even) out += fmt::format(", layers per stage {}", pipeline::layer_counts(stages));
  }
  out += fmt::format("; {} microbatch{} per dp rank", microbatches_per_rank, microbatches_per_rank > 1 ? "es" : "");
  if (balance) out += "; " + describe_balance();
  if (schedule && schedule->algorithm == "zb-auto")
    out += fmt::format("; a microbatch keeps {:.3g} of its activation from B to W (M_W / M_B)", activation_after_b);
  if (schedule && !schedule->note.empty()) out += "; " + schedule->note;
  return out;
}

std::string ParallelLayout::describe_balance(double gflops_per_second) const {
  if (!balance) return "pipeline_balance none";
  const bool ms = gflops_per_second > 0;
  auto times = [&](const std::vector<pipeline::StageCost>& c) {
    std::string out;
    for (const auto& t : c)
      out += fmt::format("{}{:.3g}", out.empty() ? "" : " ",
                         (t.forward + t.backward + t.weight) * (ms ? 1e3 / gflops_per_second : 1.0));
    return out;
  };
  auto step = [&](double v) {
    return ms ? fmt::format("{:.4g} ms", v * 1e3 / gflops_per_second) : fmt::format("{:.4g}", v);
  };
  const pipeline::BalanceResult& b = *balance;
  std::string keys;
  if (b.first_rank_layers < 0) keys = "per-stage counts, not expressible by decoder_first/last_pipeline_num_layers";
  if (b.first_rank_layers > 0) keys = fmt::format("decoder_first_pipeline_num_layers {}", b.first_rank_layers);
  if (b.last_rank_layers > 0)
    keys += fmt::format("{}decoder_last_pipeline_num_layers {}", keys.empty() ? "" : ", ", b.last_rank_layers);
  if (keys.empty()) keys = "the even split";
  std::string out = fmt::format(
      "pipeline_balance auto: layers per stage {} ({}); predicted F+B+W per microbatch per stage {} {}; simulated "
      "step {}",
      pipeline::layer_counts(b.split), keys, times(b.stage_costs), ms ? "ms" : "GFLOP", step(b.step));
  if (b.even_valid)
    out += fmt::format(" (even split {}: {}, step {})", pipeline::layer_counts(b.even_split), times(b.even_stage_costs),
                       step(b.even_step));
  if (!ms) out += " [GFLOP-seconds at 1 GFLOP/s]";
  return out;
}

std::vector<ModelPartition::Chunk> model_chunks(const ParallelLayout& L, int pp_rank) {
  PRIMUS_CHECK(pp_rank >= 0 && pp_rank < L.pp, "pipeline rank {} of {}", pp_rank, L.pp);
  if (!L.schedule) {
    const pipeline::LayerRange& r = L.stages.front();
    return {{r.first_layer, r.num_layers, true, true}};
  }
  std::vector<ModelPartition::Chunk> chunks;
  const int stages = L.pp * L.vpp;
  for (int c = 0; c < L.vpp; ++c) {
    const int stage = L.schedule->stage_of(pp_rank, c);
    const pipeline::LayerRange& r = L.stages[size_t(stage)];
    chunks.push_back({r.first_layer, r.num_layers, stage == 0, stage == stages - 1});
  }
  return chunks;
}

pipeline::ModelCosts layer_costs(const ModelSpec& spec, const config::TrainingArgs& a, const ParallelLayout& L) {
  // The whole model on one rank of the layout's tp, cp and ep groups, a chunk per part: the
  // embedding, each decoder layer, the head.
  RankShape shape = rank_shape(spec, L, a, a.bf16 ? Precision::Bf16 : Precision::Fp32);
  shape.pipeline = true;
  shape.chunks = {{0, 0, true, false}};
  for (int64_t l = 0; l < spec.num_layers; ++l) shape.chunks.push_back({l, 1, false, false});
  shape.chunks.push_back({spec.num_layers, 0, false, true});
  const RankRecord rec = walk_rank(spec, shape);
  auto cost = [](const ChunkRecord& c) {
    return pipeline::StageCost{c.f.flops() / 1e9, c.b.flops() / 1e9, c.w.flops() / 1e9};
  };
  pipeline::ModelCosts c;
  c.embedding = cost(rec.chunks.front());
  for (size_t i = 1; i + 1 < rec.chunks.size(); ++i) c.layers.push_back(cost(rec.chunks[i]));
  c.head = cost(rec.chunks.back());
  // M_W / M_B of the whole model: the bytes all its chunks keep after B over those after F.
  double after_f = 0, after_b = 0;
  for (const ChunkRecord& ch : rec.chunks) after_f += ch.kept_after_f, after_b += ch.kept_after_b;
  if (after_f > 0) c.activation_after_b = std::clamp(after_b / after_f, 0.0, 1.0);
  return c;
}

int resolve_expert_tensor_parallel_size(const config::TrainingArgs& a, const ModelSpec& spec) {
  // Megatron's default (null) is tensor_model_parallel_size. The experts' tensor-parallel group is the
  // dense one (or none): other sizes would need a second tp-like group beside ep.
  if (a.expert_tensor_parallel_size < 0)
    fail("expert_tensor_parallel_size must not be negative, got {}", a.expert_tensor_parallel_size);
  const int64_t etp = a.expert_tensor_parallel_size == 0 ? a.tensor_model_parallel_size : a.expert_tensor_parallel_size;
  if (!spec.is_moe()) return 1;
  check_expert_tensor_parallel(spec, int(a.tensor_model_parallel_size), int(etp));
  return int(etp);
}

namespace {

// data_parallel_sharding_strategy as use_torch_fsdp2 and use_distributed_optimizer resolve it.
config::DpSharding resolve_sharding(const config::TrainingArgs& a) {
  using config::DpSharding;
  DpSharding sharding = a.data_parallel_sharding_strategy;
  if (a.use_torch_fsdp2) {
    if (sharding != DpSharding::Unset && sharding != DpSharding::OptimGradsParams)
      fail("use_torch_fsdp2 means data_parallel_sharding_strategy optim_grads_params, the config says {}",
           config::choice_name(sharding));
    sharding = DpSharding::OptimGradsParams;
  }
  if (sharding == DpSharding::Unset) sharding = a.use_distributed_optimizer ? DpSharding::Optim : DpSharding::NoShard;
  if (sharding == DpSharding::NoShard && a.use_distributed_optimizer)
    fail("use_distributed_optimizer shards the optimizer, data_parallel_sharding_strategy no_shard does not: set one");
  return sharding;
}

// pipeline_model_parallel_layout's decoder layers per stage, checked against the keys it replaces;
// empty when the key is unset. Its stages over pp are the vpp (Megatron's rule).
std::vector<int64_t> explicit_layout(const config::TrainingArgs& a, int pp) {
  if (a.pipeline_model_parallel_layout.empty()) return {};
  std::vector<int64_t> layers = pipeline::parse_pipeline_layout(a.pipeline_model_parallel_layout);
  const auto stages = int64_t(layers.size());
  if (stages % pp != 0)
    fail("pipeline_model_parallel_layout has {} stages, not a multiple of pipeline_model_parallel_size {}", stages, pp);
  const char* other = a.decoder_first_pipeline_num_layers > 0  ? "decoder_first_pipeline_num_layers"
                      : a.decoder_last_pipeline_num_layers > 0 ? "decoder_last_pipeline_num_layers"
                      : a.pipeline_balance == config::PipelineBalance::Auto ? "pipeline_balance auto"
                                                               : nullptr;
  if (other) fail("pipeline_model_parallel_layout sets the layers of every stage; unset {} (or the layout)", other);
  const int64_t vpp = a.virtual_pipeline_model_parallel_size;
  if (vpp > 0 && vpp != stages / pp)
    fail("pipeline_model_parallel_layout has {} stages over pipeline_model_parallel_size {}: a vpp of {}, but "
         "virtual_pipeline_model_parallel_size is {}",
         stages, pp, stages / pp, vpp);
  return layers;
}

// The stages and, with more than one pipeline rank, the schedule, the layers per stage and their
// costs (L's sizes and microbatches already planned).
void plan_pipeline(ParallelLayout& L, const config::TrainingArgs& a, const ModelSpec& spec,
                   std::optional<double> activation_after_b) {
  const std::vector<int64_t> layout = explicit_layout(a, L.pp);
  if (!layout.empty() && pipeline::pipeline_layout_mtp_layers(a.pipeline_model_parallel_layout) != spec.mtp_num_layers)
    fail("pipeline_model_parallel_layout '{}' places {} multi-token prediction layers (m), the model has "
         "mtp_num_layers {}",
         a.pipeline_model_parallel_layout, pipeline::pipeline_layout_mtp_layers(a.pipeline_model_parallel_layout),
         spec.mtp_num_layers);
  const int64_t vpp_asked = layout.empty() ? a.virtual_pipeline_model_parallel_size : int64_t(layout.size()) / L.pp;
  if (L.pp == 1) {
    if (layout.size() > 1)
      fail("pipeline_model_parallel_layout has {} stages; with pipeline_model_parallel_size 1 it has one", layout.size());
    if (vpp_asked > 1)
      fail("virtual_pipeline_model_parallel_size {} needs pipeline_model_parallel_size > 1", vpp_asked);
    if (a.decoder_first_pipeline_num_layers > 0 || a.decoder_last_pipeline_num_layers > 0)
      fail("decoder_first/last_pipeline_num_layers need pipeline_model_parallel_size > 1");
    L.stages = layout.empty() ? pipeline::split_layers(spec.num_layers, 1, 1)
                              : pipeline::split_layers(layout, spec.num_layers);
    return;
  }
  if (L.microbatches_per_rank > 0x7fffffff) fail("too many microbatches per rank: {}", L.microbatches_per_rank);
  const bool auto_balance = a.pipeline_balance == config::PipelineBalance::Auto;
  if (auto_balance && (a.decoder_first_pipeline_num_layers > 0 || a.decoder_last_pipeline_num_layers > 0))
    fail("pipeline_balance auto chooses the layers per stage itself; unset decoder_first_pipeline_num_layers ({}) and "
         "decoder_last_pipeline_num_layers ({}), or set pipeline_balance none",
         a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers);
  if (a.zero_bubble_max_pending_backward < 0)
    fail("zero_bubble_max_pending_backward must not be negative (got {}; 0 means pipeline_model_parallel_size)",
         a.zero_bubble_max_pending_backward);
  // Megatron's 1F1B with virtual stages is its interleaved schedule.
  const std::string algorithm =
      a.pipeline_schedule == "1f1b" && vpp_asked > 1 ? std::string("interleaved-1f1b") : a.pipeline_schedule;
  pipeline::ScheduleRequest req;
  req.pp = L.pp;
  req.microbatches = int(L.microbatches_per_rank);
  req.vpp = int(vpp_asked);
  if (a.pipeline_schedule == "zb-auto") req.memory_limit = double(a.zero_bubble_max_pending_backward);
  auto build = [&] {
    try {
      return pipeline::generate(algorithm, req);
    } catch (const Error& e) {
      fail("pipeline_schedule {} with pipeline_model_parallel_size {} and {} microbatches per data-parallel rank "
           "(global_batch_size / (micro_batch_size x dp)): {}",
           algorithm, L.pp, L.microbatches_per_rank, e.what());
    }
  };
  L.schedule = build();
  L.vpp = L.schedule->vpp;
  const pipeline::ModelCosts costs = layer_costs(spec, a, L);
  if (!layout.empty()) {
    if (L.vpp != vpp_asked || L.schedule->placement != pipeline::Placement::Looped)
      fail("pipeline_model_parallel_layout places its {} stages in Megatron's looped order ({} per pipeline rank); "
           "pipeline_schedule {} runs {} stage(s) per rank, placed {}",
           layout.size(), vpp_asked, algorithm, L.vpp, pipeline::placement_name(L.schedule->placement));
    L.stages = pipeline::split_layers(layout, spec.num_layers);
  } else if (auto_balance) {
    L.balance = pipeline::balance_layers(*L.schedule, costs, pipeline::Costs{});
    L.stages = L.balance->split;
  } else {
    L.stages = pipeline::split_layers(*L.schedule, spec.num_layers, a.decoder_first_pipeline_num_layers,
                                      a.decoder_last_pipeline_num_layers);
  }
  L.stage_costs = pipeline::stage_costs(L.stages, costs);
  L.activation_after_b = activation_after_b.value_or(costs.activation_after_b);
  // zb-auto schedules for the times it is given: the split's, from the model.
  if (a.pipeline_schedule == "zb-auto") {
    req.costs.stages = L.stage_costs;
    req.costs.activation_after_b = L.activation_after_b;
    L.schedule = build();
  }
}

}  // namespace

ParallelLayout plan_layout(const config::TrainingArgs& a, const ModelSpec& spec, int world_size,
                           std::optional<double> activation_after_b) {
  ParallelLayout L;
  L.world_size = world_size;
  auto positive = [](int64_t v, const char* key) {
    if (v < 1) fail("{} must be at least 1, got {}", key, v);
    return int(v);
  };
  L.tp = positive(a.tensor_model_parallel_size, "tensor_model_parallel_size");
  L.pp = positive(a.pipeline_model_parallel_size, "pipeline_model_parallel_size");
  L.cp = positive(a.context_parallel_size, "context_parallel_size");
  positive(a.expert_model_parallel_size, "expert_model_parallel_size");
  if (a.virtual_pipeline_model_parallel_size < 0)
    fail("virtual_pipeline_model_parallel_size must not be negative, got {}", a.virtual_pipeline_model_parallel_size);
  L.sharding = resolve_sharding(a);
  L.cp_all_to_all = a.cp_comm_type == CpComm::A2A;
  if (a.expert_model_parallel_size > 1 && !spec.is_moe())
    fail("expert_model_parallel_size {}: model {} has no experts (num_experts is not set); use 1",
         a.expert_model_parallel_size, spec.name);
  if (spec.is_moe() && spec.num_experts % a.expert_model_parallel_size != 0)
    fail("num_experts ({}) of model {} must be divisible by expert_model_parallel_size ({})", spec.num_experts,
         spec.name, a.expert_model_parallel_size);
  L.ep = int(a.expert_model_parallel_size);
  L.etp = resolve_expert_tensor_parallel_size(a, spec);
  const int mp = L.tp * L.pp * L.cp;
  if (world_size % mp != 0)
    fail("tensor_model_parallel_size ({}) x pipeline_model_parallel_size ({}) x context_parallel_size ({}) = {} "
         "must divide the number of ranks ({}); data parallel takes the rest",
         L.tp, L.pp, L.cp, mp, world_size);
  L.dp = world_size / mp;
  if (L.dp % L.ep != 0)
    fail("expert_model_parallel_size ({}) must divide the data-parallel size ({} = {} ranks / tensor x pipeline x "
         "context parallel {}): the expert-parallel groups are made of dp ranks",
         L.ep, L.dp, world_size, mp);
  check_tensor_parallel(spec, L.tp);
  if (L.cp > 1) {
    const int64_t seq = a.seq_length > 0 ? a.seq_length : spec.max_position_embeddings;
    if (seq % (2 * L.cp) != 0)
      fail("context_parallel_size {} cuts each sequence in 2 x {} = {} chunks: seq_length {} is not divisible by {}",
           L.cp, L.cp, 2 * L.cp, seq, 2 * L.cp);
    if (L.cp_all_to_all) check_all_to_all_heads(spec, L.tp, L.cp);
  }

  L.sequence_parallel = a.sequence_parallel && L.tp > 1;
  // The ranks that split a microbatch's routed tokens: cp, and tp under sequence parallelism with
  // whole experts (split experts route every row on every tp rank).
  if (spec.is_moe()) check_moe_supported(spec, moe_routing_ranks(L.sequence_parallel, L.tp, L.etp, L.cp));
  if (a.sequence_parallel && L.tp == 1)
    log::warn("sequence_parallel has no effect with tensor_model_parallel_size 1; running without it");
  if (L.sequence_parallel && (a.micro_batch_size * a.seq_length / L.cp) % L.tp != 0)
    fail("sequence_parallel splits micro_batch_size x seq_length / context_parallel_size = {} tokens over "
         "tensor_model_parallel_size {}: not divisible",
         a.micro_batch_size * a.seq_length / L.cp, L.tp);
  if (a.global_batch_size % (a.micro_batch_size * L.dp) != 0)
    fail("global_batch_size ({}) must be a multiple of micro_batch_size ({}) x data-parallel size ({}) = {}",
         a.global_batch_size, a.micro_batch_size, L.dp, a.micro_batch_size * L.dp);
  L.microbatches_per_rank = a.global_batch_size / (a.micro_batch_size * L.dp);

  plan_pipeline(L, a, spec, activation_after_b);
  return L;
}

}  // namespace primus::plan
