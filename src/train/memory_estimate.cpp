#include "train/memory_estimate.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "safe/disk.h"

namespace primus::train {
namespace {

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(uint64_t(1) << 30)); }

// A decoder tensor's split over tp: the column- and row-parallel linears (attention's, the dense
// MLP's, MLA's up projections) are divided; the rest is whole on every tp rank: norms, MLA's down
// projections, and in an MoE block the router, and the routed and shared experts unless
// expert_tensor_parallel_size splits them (etp > 1, model/moe.h).
bool split_over_tp(const ParamInfo& info, int etp) {
  if (info.name.find(".mlp.router.") != std::string::npos || info.name.find(".gate_weight") != std::string::npos)
    return false;
  if (info.expert >= 0 || info.name.find(".mlp.shared_experts.") != std::string::npos) return etp > 1;
  for (const char* split : {".linear_qkv.", ".linear_proj.", ".mlp.linear_fc1.", ".mlp.linear_fc2.", ".linear_q_proj.",
                            ".linear_q_up_proj.", ".linear_kv_up_proj."})
    if (info.name.find(split) != std::string::npos) return true;
  return false;
}

// Parameters a rank holds of the embedding, of one decoder layer, of the final norm and of the
// output layer, under tp (vocabulary and linears divided), ep (num_experts / ep routed experts per
// MoE layer) and etp (the experts divided by tp too).
struct Parts {
  double embedding = 0, final_norm = 0, output = 0;
  std::vector<double> layers;  // per decoder layer (MoE and dense layers differ)
  double layer = 0;            // the largest
};
Parts parameter_parts(const ModelSpec& spec, int tp, int ep, int etp) {
  Parts p;
  std::vector<double>& layers = p.layers;
  layers.assign(size_t(spec.num_layers), 0.0);
  for (const auto& info : model_parameter_layout(spec)) {
    const double n = double(info.numel);
    if (info.name.starts_with("embedding.")) p.embedding += n / tp;
    else if (info.name.starts_with("output_layer.")) p.output += n / tp;
    else if (info.name.starts_with("decoder.final_layernorm.")) p.final_norm += n;
    else
      layers[size_t(std::stoll(info.name.substr(std::string("decoder.layers.").size())))] +=
          n / (info.expert >= 0 ? ep : 1) / (split_over_tp(info, etp) ? tp : 1);
  }
  p.layer = layers.empty() ? 0 : *std::max_element(layers.begin(), layers.end());
  return p;
}

}  // namespace

std::string MemoryEstimate::describe() const {
  return fmt::format("{} for {:.1f}M parameters on this rank ({:.0f} bytes each): parameters {}, gradients {}, "
                     "optimizer state {}, activations {}",
                     gib(total_bytes()), double(parameters) / 1e6, bytes_per_parameter, gib(parameter_bytes),
                     gib(gradient_bytes), gib(optimizer_bytes), gib(activation_bytes));
}

MemoryEstimate estimate_memory(const ModelSpec& spec, const ParallelLayout& layout, const config::TrainingArgs& args,
                               bool mixed) {
  const int tp = std::max(1, layout.tp), dp = std::max(1, layout.dp), pp = std::max(1, layout.pp);
  const Parts parts = parameter_parts(spec, tp, std::max(1, layout.ep), std::max(1, layout.etp));
  const int vpp = std::max(1, layout.vpp);
  // Layers per pipeline rank: a rank holds vpp stages. Take the most loaded rank; the first holds
  // the embedding, the last the final norm and the output layer (tied: the last holds its copy).
  std::vector<double> held_of_rank(size_t(pp), 0.0);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges_of_rank(static_cast<size_t>(pp));  // [first, count)
  auto add_layers = [&](int rank, int64_t first, int64_t count) {
    ranges_of_rank[size_t(rank)].push_back({first, count});
    for (int64_t l = first; l < first + count && l < int64_t(parts.layers.size()); ++l)
      held_of_rank[size_t(rank)] += parts.layers[size_t(l)];
  };
  if (layout.stages.empty()) {
    add_layers(0, 0, spec.num_layers);
  } else {
    for (size_t s = 0; s < layout.stages.size(); ++s) {
      const int rank = layout.schedule ? layout.schedule->rank_of_stage(int(s)) : 0;
      add_layers(std::clamp(rank, 0, pp - 1), layout.stages[s].first_layer, layout.stages[s].num_layers);
    }
  }
  const double output = spec.untie_embeddings_and_output_weights ? parts.output : parts.embedding;
  MemoryEstimate e;
  for (int r = 0; r < pp; ++r) {
    double held = held_of_rank[size_t(r)];
    if (r == 0) held += parts.embedding;
    if (r == pp - 1) held += parts.final_norm + (pp > 1 || spec.untie_embeddings_and_output_weights ? output : 0.0);
    const int64_t n = int64_t(held);
    e.parameters = std::max(e.parameters, n);
  }
  const double n = double(e.parameters);
  // ZeRO: the moments (optim), the gradients (optim_grads) and the master weights with their working
  // copy (optim_grads_params) are split over dp x cp; ZeRO-2 keeps the working weights whole, and
  // ZeRO-3 holds two gathered layers (the one computing and the one prefetched) at a time.
  const double shards = double(dp) * double(std::max(1, layout.cp));
  const double master = 4.0, working = mixed ? 2.0 : 0.0;
  e.parameter_bytes = n * (master + working);
  if (layout.shard_gradients()) e.parameter_bytes = n * (master + working) / shards + n * (mixed ? 2.0 : 4.0);
  if (layout.shard_parameters())
    e.parameter_bytes = n * (master + working) / shards + 2.0 * parts.layer * (mixed ? 2.0 : 4.0);
  e.gradient_bytes = n * 4.0 / (layout.shard_gradients() ? shards : 1.0);
  if (layout.shard_gradients()) e.gradient_bytes += 3.0 * parts.layer * 4.0;  // a unit whole, two in flight
  e.optimizer_bytes = n * 8.0 / (layout.shard_optimizer() ? shards : 1.0);
  e.bytes_per_parameter = (e.parameter_bytes + e.gradient_bytes + e.optimizer_bytes) / std::max(1.0, n);

  // Activations saved per token per layer (fp32 words, as docs/model_math.md counts them): the
  // attention half (MLA's packed heads and latents in place of qkv), then the dense MLP, or the
  // MoE block's saves (its input rows, and per routed choice the permuted row, gate|up, the
  // activation and the output; the shared expert's gate|up and activation), which recompute keeps.
  const double h = double(spec.hidden_size), f = double(spec.ffn_hidden_size);
  const double heads = double(spec.num_attention_heads);
  double q = double(spec.q_size()), qkv = double(spec.qkv_size());
  if (spec.multi_latent_attention) {
    const double w = double(std::max(spec.qk_head_dim + spec.qk_pos_emb_head_dim, spec.v_head_dim));
    qkv = 3 * heads * w + double(spec.q_lora_rank + spec.kv_lora_rank + spec.qk_pos_emb_head_dim);
    q = heads * w + heads * double(spec.v_head_dim);
  }
  double attention = 4 * h + 2 + qkv + q + heads, dense_mlp = 3 * f;
  if (args.recompute_granularity == Recompute::Full) attention = h, dense_mlp = 0;  // the layer input only
  else if (args.recompute_granularity == Recompute::Selective) attention -= q + heads;  // attention internals recomputed
  // Whole experts (etp 1) run on all of a tp rank's rows alike unless sequence parallelism splits
  // them. Split experts (etp = tp) run on all rows (gathered under sequence parallelism, one more
  // row of h per token) with their ffn widths divided.
  const double etp = double(std::max(1, layout.etp));
  const bool gathered = etp > 1 && layout.sequence_parallel;
  const double moe = double(spec.moe_router_topk) * (2 * h + 3 * double(spec.expert_ffn()) / etp) +
                     3 * double(spec.moe_shared_expert_intermediate_size) / etp + (gathered ? h : 0.0);
  const double moe_share = layout.sequence_parallel && etp == 1 ? double(tp) : 1.0;
  auto layer_words = [&](int64_t l) {
    return (attention + (spec.is_moe_layer(l) ? 0.0 : dense_mlp)) / tp + (spec.is_moe_layer(l) ? moe / moe_share : 0.0);
  };
  double words = 0;  // the most loaded pipeline rank's
  for (int r = 0; r < pp; ++r) {
    double w = 0;
    for (const auto& [first, count] : ranges_of_rank[size_t(r)])
      for (int64_t l = first; l < first + count; ++l) w += layer_words(l);
    words = std::max(words, w);
  }
  const double word_bytes = mixed ? 2.0 : 4.0;
  const int64_t seq = args.seq_length > 0 ? args.seq_length : spec.max_position_embeddings;
  const double tokens = double(args.micro_batch_size) * double(seq) / std::max(1, layout.cp);  // a cp rank's share
  const double in_flight = layout.schedule ? double(std::min<int64_t>(layout.microbatches_per_rank, int64_t(pp) * vpp)) : 1.0;
  e.activation_bytes = words * word_bytes * tokens * in_flight;
  return e;
}

uint64_t host_available_bytes() {
  uint64_t avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") avail = kb * 1024;
  }
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (cg >> limit && limit != "max") {
    const uint64_t l = std::strtoull(limit.c_str(), nullptr, 10);
    if (l > 0 && (avail == 0 || l < avail)) avail = l;
  }
  return avail;
}

void check_memory(const MemoryEstimate& e, int ranks_here, uint64_t available, const std::string& where) {
  if (available == 0) return;
  const double need = e.total_bytes() * std::max(1, ranks_here);
  if (need <= double(available)) return;
  fail("this run needs about {} of memory but {} has {} free: {} per rank ({}), {} rank(s) here. Make the model or "
       "the batch smaller (num_layers, hidden_size, ffn_hidden_size, vocab_size; micro_batch_size, seq_length), split "
       "it over more ranks (tensor_model_parallel_size, pipeline_model_parallel_size, use_distributed_optimizer), or "
       "save activations (recompute_granularity: full)",
       gib(need), where, gib(double(available)), gib(e.total_bytes()), e.describe(), ranks_here);
}

}  // namespace primus::train
