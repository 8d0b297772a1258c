// The data-parallel strategy of a run: how the ranks of a data-parallel group share the gradient
// reduction, the optimizer and (ZeRO-2 / FSDP) the weights. The trainer talks to one of these and
// never asks which it is:
//
//   replicated   (data_parallel_sharding_strategy no_shard) gradient buckets all-reduced over dp as
//                the W passes finish (parallel::GradBuckets), AdamW on every rank
//   ZeRO-1       (optim, use_distributed_optimizer) the buckets reduce-scattered, each rank steps
//                its shard of the AdamW state and all-gathers the parameters
//                (parallel::DistributedOptimizer)
//   ZeRO-2/FSDP  (optim_grads, optim_grads_params, use_torch_fsdp2) each rank keeps its shards of
//                the weights, gradients and AdamW state (train/sharded_weights.h), which also serve
//                the model its weights
//
// Under expert parallelism the experts' gradients are the strategy's too: the bucketed ones keep
// them out of the dp sum and reduce them over the expert-data-parallel group (train/expert_grads.h,
// with an optimizer of their own under ZeRO-1); ZeRO-2 / FSDP shards them over edp x cp itself.
// The model-parallel sums (tp, tied embedding) and the tensors the norm counts come from
// ModelParallelGrads (train/model_parallel_grads.h), which every strategy calls.
//
// Every collective a strategy posts is posted in the same order on every rank of its groups.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "plan/parallel_layout.h"
#include "train/resident_load.h"

namespace primus::train {

// What a strategy is built from. The model must be built with resident_weights false exactly when
// the layout shards the gradients (ParallelLayout::shard_gradients()).
struct DpSetup {
  LlamaModel& model;
  const plan::ParallelLayout& layout;
  const parallel::MeshGroups& groups;
  parallel::MeshCoord me;
  AdamWOptions adam;
  int64_t bucket_size = 0;  // ddp_bucket_size in elements; 0: parallel::default_bucket_size(dp)
  bool overlap_grad_reduce = true;
  uint64_t seed = 0;        // the weights' initialization
  // main_grads_dtype bf16 (docs/optim.md#low-precision-optimizer-state): each tensor's gradient
  // rounded to bf16 after every W pass adds into it (before its bucket or unit is reduced), and
  // after the data-parallel reduction. adam.main_params_dtype bf16 rounds the initial and loaded weights too.
  bool bf16_main_grads = false;
  // ZeRO-2 / FSDP (train/sharded_weights.h, ShardedSchedule): reduce_sharded_grads_once_per_step and
  // torch_fsdp2_reshard_after_forward.
  bool reduce_sharded_grads_once_per_step = false;
  bool reshard_after_forward = true;
};

// This rank's persistent buffers in bytes, for the log's peak-memory split: the weights (master
// and working copy), the fp32 gradients and the AdamW moments (fp32 or bf16). Gathered units are
// not in these.
struct DpMemory {
  double parameters = 0, gradients = 0, optimizer = 0;
};

// What this rank writes of a checkpoint: the elements of its tensor- and pipeline-parallel part
// that it owns (checkpoint::ShardSource), with host pointers to their values and moments: into
// its own buffers on the CPU, or into `copies` of device buffers. Under ZeRO-1 the rank's
// optimizer shards, under ZeRO-2 / FSDP its pieces; a tensor that several ranks hold identically
// (dp and cp replicas, tp-replicated norms) is split between them, so that every element is
// written once. Valid until the next step changes the buffers.
struct DpShardState {
  checkpoint::ShardSource source;
  std::vector<std::vector<float>> copies;
  int64_t numel() const;  // elements written
};

class DataParallelStrategy {
 public:
  virtual ~DataParallelStrategy() = default;

  // ---- a step ----
  virtual void begin_step() = 0;  // zeroes the gradients this rank accumulates
  // After the backward: the dp (and edp) reductions finished and the model-parallel sums done;
  // the gradients then equal one process's.
  virtual void finish_gradients() = 0;
  virtual double gradient_norm() = 0;  // the global L2 norm, the same on every rank (collective)
  // AdamW with the clipping factor grad_scale folded in; the model's working weights follow.
  virtual void step(double lr, double grad_scale) = 0;
  virtual int64_t step_count() const = 0;
  // The flat fp32 gradient buffer this rank holds (the model's, or its shards): fault injection.
  virtual const Tensor& gradients() const = 0;

  // ---- checkpoints ----
  virtual DpShardState shard_state() const = 0;  // local: no collectives, no full-state gather
  // A resume reads straight into this rank's own state: load_targets says where the checkpoint's
  // values (and, with `optimizer`, the moments) go (ResidentLoad: the rank's buffers, host copies
  // only of device memory), the ranges that dp replicas hold alike marked as such (each replica
  // reads a share, checkpoint::LoadTarget::replicas); after the load and ResidentLoad::commit,
  // finish_load derives the rest (the working weights, ZeRO-2's whole copy: collective) and sets
  // the optimizers' step count. A load that fails leaves the state partly written.
  virtual void load_targets(ResidentLoad& load, bool optimizer) = 0;
  virtual void finish_load(int64_t step, bool optimizer) = 0;

  // ---- memory ----
  virtual DpMemory memory() const = 0;
};

// The strategy the layout asks for (ParallelLayout::sharding), attached to the model: its weight
// gradient hook, its weight source (ZeRO-2 / FSDP), and the weights initialized from setup.seed.
std::unique_ptr<DataParallelStrategy> make_dp_strategy(const DpSetup& setup);

}  // namespace primus::train
