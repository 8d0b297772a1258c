// The parallel layout of a training run, planned and checked from the config and the world size
// before any rank builds a model or reads data: every rule that can fail fails here, with a
// message naming the rule, the keys and the numbers. The trainer, the projection and the tools
// (`benchmark gemm --shapes-from`, `analyze schedule`) plan with it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/choices.h"
#include "config/experiment.h"
#include "model/llama.h"
#include "model/model_spec.h"
#include "parallel/mesh.h"
#include "pipeline/balance.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"

namespace primus::plan {

struct ParallelLayout {
  int world_size = 1;
  int tp = 1, pp = 1, cp = 1, dp = 1, vpp = 1;
  int ep = 1;  // expert_model_parallel_size: folded into dp (ep consecutive dp ranks share the experts out)
  // expert_tensor_parallel_size resolved: 1 (experts whole on every tp rank) or tp (each expert's ffn split
  // over the tp group); 1 for a dense model.
  int etp = 1;
  bool sequence_parallel = false;
  bool cp_all_to_all = false;  // cp_comm_type a2a (else p2p ring attention)
  // data_parallel_sharding_strategy resolved (use_torch_fsdp2 is optim_grads_params,
  // use_distributed_optimizer optim; never Unset): no_shard, optim (ZeRO-1), optim_grads (ZeRO-2),
  // optim_grads_params (ZeRO-3 / FSDP); shards span dp x cp.
  config::DpSharding sharding = config::DpSharding::NoShard;
  bool shard_optimizer() const { return sharding != config::DpSharding::NoShard; }
  bool shard_gradients() const {
    return sharding == config::DpSharding::OptimGrads || sharding == config::DpSharding::OptimGradsParams;
  }
  bool shard_parameters() const { return sharding == config::DpSharding::OptimGradsParams; }
  int64_t microbatches_per_rank = 1;           // global_batch_size / (micro_batch_size * dp)
  std::vector<pipeline::LayerRange> stages;    // pp * vpp, in model order
  std::optional<pipeline::Schedule> schedule;  // when the model is split in more than one stage
  // Per stage, the F, B and W work of one microbatch in GFLOP (layer_costs), with the pipeline.
  std::vector<pipeline::StageCost> stage_costs;
  // pipeline_balance auto: what the balancing chose it over.
  std::optional<pipeline::BalanceResult> balance;
  // zb-auto: the part of a microbatch's activation it keeps from its B to its W (M_W / M_B) that
  // the schedule was built for: the model's, measured by layer_costs, unless the caller gave one.
  double activation_after_b = 1.0;
  parallel::ParallelSizes sizes() const;
  // "world 8 = tp 2 x pp 2 x dp 2; 1f1b over 2 stages; 4 microbatches per dp rank", with the
  // layers per stage when they are not even and the balancing report (describe_balance).
  std::string describe() const;
  // pipeline_balance auto: the chosen split and each stage's predicted F+B+W time per
  // microbatch beside the even split's, and both simulated steps. In GFLOP, or in milliseconds
  // at `gflops_per_second` per rank when it is given (e.g. the measured GEMM rate).
  std::string describe_balance(double gflops_per_second = 0) const;
};

// The F, B and W work of one microbatch on one tensor-parallel rank, in GFLOP, per decoder layer
// and for the model's two ends, and the bytes it keeps from B to W over those from F to B (its
// activation_after_b): the FLOPs of every op the real passes run (plan/model_walk.h: the
// model walked on the shape-only backend with one chunk per layer), with the layout's tensor,
// sequence, context and expert parallelism. pipeline_balance auto splits the layers by them.
pipeline::ModelCosts layer_costs(const ModelSpec& spec, const config::TrainingArgs& args, const ParallelLayout& layout);

// This pipeline rank's chunks of the model (one per virtual stage, in chunk order, each with its
// layers and whether it holds the embedding or the head); the whole model without a pipeline.
std::vector<ModelPartition::Chunk> model_chunks(const ParallelLayout& layout, int pp_rank);

// Rules, in order: sizes positive; expert parallel size 1 for a dense model, dividing num_experts;
// the sharding strategy resolved (use_torch_fsdp2, use_distributed_optimizer); the expert
// tensor-parallel size (check_expert_tensor_parallel, model/moe.h); tp x pp x cp divides the world
// size; heads, query groups, ffn and vocabulary divisible by tp (check_tensor_parallel,
// model/llama.h); under cp, seq_length divisible by 2 x cp and, for a2a, heads and query groups per
// tp rank by cp (check_all_to_all_heads, model/attention_core.h); the MoE limits for the ranks that
// split a microbatch's routed tokens (check_moe_supported, moe_routing_ranks); sequence parallel
// needs tokens per microbatch divisible by tp; global_batch_size a multiple of micro_batch_size x
// dp; layers split over pp x vpp stages (even, or as decoder_first/last_pipeline_num_layers say,
// or by pipeline_balance auto from layer_costs, which excludes the two keys); the pipeline
// schedule exists for pp, vpp and the microbatches (e.g. dualpipev needs m >= 2 pp). zb-auto is
// built for the split's per-stage costs and under zero_bubble_max_pending_backward (0: pp)
// microbatch activations, with the paper's heuristic only: its ILP's time limit would make the
// ranks' schedules differ; its memory model keeps activation_after_b of a microbatch from B to W
// (none: the model's own ratio, measured by layer_costs). The model's rules are the model's own
// functions, called here so that a layout fails before any rank builds anything, with the model's
// messages.
ParallelLayout plan_layout(const config::TrainingArgs& args, const ModelSpec& spec, int world_size,
                           std::optional<double> activation_after_b = std::nullopt);

// expert_tensor_parallel_size resolved (0 or null: tensor_model_parallel_size, Megatron's default)
// and checked against the model: 1 or tp, dividing the experts' and the shared expert's ffn; 1
// for a dense model. plan_layout's rule, for the tools that list a rank's work without a world.
int resolve_expert_tensor_parallel_size(const config::TrainingArgs& args, const ModelSpec& spec);

}  // namespace primus::plan
