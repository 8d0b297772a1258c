// ZeRO-2 and ZeRO-3 / FSDP (Megatron's data_parallel_sharding_strategy optim_grads and
// optim_grads_params; use_torch_fsdp2 is the latter): this rank's shards of the weights, of their
// gradients and of the AdamW state, and the weight source (model/weight_source.h) that serves the
// model whole units from them.
//
// Every tensor is split along its first dim over the data-parallel group (dp, or dp x cp under
// context parallel) as parallel/fsdp.h describes (FSDP2's per-parameter sharding): rank r holds
// rows [r k, (r + 1) k) with k = ceil(rows / dp), so its piece of a tensor is one contiguous range
// of it. A rank keeps, for its pieces only: the fp32 master values, their bf16 working copy (mixed
// precision), the fp32 gradient sums and the two AdamW moments.
//
// Gradients (both stages): a W pass adds into a whole fp32 gradient buffer of its unit, allocated
// when first asked for. Once every tensor of the unit has had its W passes for `reduce_every`
// microbatches (ShardedSchedule), the buffer is reduce-scattered over dp and freed; each rank adds
// the result to its gradient shard. By default (reduce_every 1) at most a unit's worth of gradients
// is whole at a time (two reductions stay in flight while the backward goes on), at the cost of one
// reduce-scatter per unit and microbatch, as ZeRO-2 in DeepSpeed and FSDP2's default do. With
// reduce_every = the microbatches per step (reduce_sharded_grads_once_per_step), every unit's
// gradient stays whole through the step (4 bytes per parameter more, as no_shard holds) and is
// reduce-scattered once, during the last microbatch's backward, as Megatron's DDP and FSDP2's
// set_requires_gradient_sync(False) do. Any partial sum may be reduced (the reduction is linear),
// so the order in which a schedule runs its W passes never matters for the result.
//
// Weights: under optim_grads every rank keeps the whole working copy (re-gathered unit by unit
// after each optimizer step); under optim_grads_params a unit is all-gathered (in the working
// dtype) when a pass acquires it, the next unit's gather starts at the same time (prefetch), and
// the gathered copy is freed when the pass releases it. With reshard_after_forward false (FSDP2's
// and Megatron's torch_fsdp2_reshard_after_forward) a unit gathered for a forward stays gathered
// until its W passes of that microbatch are done, so its backward gathers nothing: one gather per
// unit and microbatch instead of two, at the cost of holding the whole working weights between a
// microbatch's forward and backward. Gathered copies never outlive an optimizer step.
//
// LoRA (LlamaModel::trains): the frozen base is sharded and gathered like any weight, but only
// the units that train (the adapters' unit, after every frozen one) have gradient shards, are
// reduce-scattered and have AdamW state: the shard buffers hold the frozen units' pieces first and
// the trainable ones from train_begin() on, and the gradient shards and moments cover that tail
// alone. A frozen unit's W passes (the norms' gradients the model still computes) are discarded,
// not reduced. Under optim_grads_params the trainable units, small beside a frozen base, are kept
// whole on every rank (all-gathered after each step, as ZeRO-2 keeps every unit): the blocks read
// their adapters without acquiring the adapters' unit.
//
// Expert parallel: the experts of this rank's ep slot are sharded the same way over the
// expert-data-parallel group (the ranks that hold the same experts) instead of dp, so a unit with
// experts has two parts, each gathered and reduced over its own group into the same whole buffers.
//
// Collectives on a group match by posting order. Every rank of the group runs the same
// passes in the same order (same pipeline stage, same schedule, same microbatch count), so the
// gathers and reductions posted from here line up.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/llama.h"
#include "model/weight_source.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "parallel/distributed_optimizer.h"
#include "parallel/fsdp.h"
#include "parallel/process_group.h"
#include "train/resident_load.h"

namespace primus::train {

// A host pointer to fp32 elements [begin, begin + n) of a flat tensor: its own memory on the CPU,
// or a copy appended to `copies` (device memory). For checkpoint writers.
const float* host_range(const Tensor& flat, int64_t begin, int64_t n, std::vector<std::vector<float>>& copies);

// Rounds every element of the fp32 tensor x (any device) to bf16, nearest even, in place, through
// the backend's casts: the bf16 main gradients' and bf16 parameters' one rounding
// (docs/optim.md#low-precision-optimizer-state).
void round_to_bf16(ops::Backend& be, Tensor x);

enum class ShardedStage : uint8_t {
  OptimGrads,        // ZeRO-2: working weights whole on every rank
  OptimGradsParams,  // ZeRO-3 / FSDP: working weights gathered per unit, just in time
};

// When the collectives run (the header's comment): results are the same either way, to fp32's
// summation order.
struct ShardedSchedule {
  int reduce_every = 1;               // microbatches whose gradients a unit accumulates per reduction
  bool reshard_after_forward = true;  // optim_grads_params: free a unit after its forward
};

class ShardedWeights final : public WeightSource {
 public:
  // model: built with LlamaOptions::resident_weights false (its ParamStore is the layout only).
  // dp: the group the shards span, on the backend's device. expert_dp: under expert parallel, the
  // group the experts' shards span (model/moe.h is_expert_param); nullptr: dp, like the rest.
  // bf16_grads (main_grads_dtype bf16): a unit's gradient is rounded to bf16 before each
  // reduction, and the gradient shards after each sum is added to them. adam.main_params_dtype bf16: the
  // master pieces hold bf16 values (rounded where loaded, and by every step).
  ShardedWeights(LlamaModel& model, parallel::ProcessGroup& dp, parallel::ProcessGroup* expert_dp, ShardedStage stage,
                 AdamWOptions adam, bool bf16_grads = false, ShardedSchedule schedule = {});
  ~ShardedWeights() override;

  // ---- WeightSource ----
  void acquire(int unit, int next) override;
  void release(int unit) override;
  Tensor weights(int unit) override;
  Tensor grads(int unit) override;
  Tensor buffer(int param) override;  // whole on every rank (and authoritative over its shard piece)

  // ---- values and optimizer state (full arrays are host buffers in the model's flat layout) ----
  void init_weights(uint64_t seed);  // ParamStore::init's values, whatever the dp size
  void load_values(const float* full);  // each rank keeps its pieces (ZeRO-2 then re-gathers: collective)
  // A resume: this rank's pieces (values and, when `optimizer`, moments) and the buffers whole
  // are read into its own shard buffers (ResidentLoad); then, after ResidentLoad::commit,
  // finish_load derives the rest: the buffers' pieces of the master, the working copy, ZeRO-2's
  // whole copy (collective), the optimizer's step count.
  void load_targets(ResidentLoad& load, bool optimizer);
  void finish_load(int64_t step, bool optimizer);

  // Checkpoint writers: this rank's piece of every tensor that has one ([begin, begin + numel) of
  // the model's flat layout) with host pointers to its values and moments (host_range).
  struct HeldPiece {
    int tensor = 0;
    int64_t begin = 0, numel = 0;
    const float* data[3] = {nullptr, nullptr, nullptr};
  };
  std::vector<HeldPiece> held_pieces(std::vector<std::vector<float>>& copies) const;
  // ---- a step ----
  void begin_step();                                // zeroes the gradient shards (drops kept gathers)
  void weights_done(const std::vector<int>& ids);   // the model's weight-gradient hook
  // Reduces what is left and waits for every reduction: the shards then hold the sums over dp.
  void finish_gradients();
  // This rank's piece of tensor `param`'s gradient shard (may be empty).
  Tensor grad_piece(int param) const;
  double grad_sq_sum(const std::vector<int>& counted) const;  // this rank's pieces of those tensors
  void step(double lr, double grad_scale);          // AdamW on the pieces (then ZeRO-2 re-gathers)
  int64_t step_count() const { return adam_->step_count(); }
  void set_weight_decay(double wd) { adam_->set_weight_decay(wd); }
  const Tensor& grad_shards() const { return grads_; }

  // ---- memory (this rank's persistent buffers) ----
  int64_t parameter_bytes() const;  // master pieces, their working copy, ZeRO-2's whole working copy
  int64_t gradient_bytes() const { return int64_t(grads_.nbytes()); }
  int64_t optimizer_bytes() const { return adam_->state_bytes(); }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t train_begin() const { return train_begin_; }  // the first shard element that trains
  // Whole-unit gradient bytes held through a step (reduce_every > 1: every unit's, 4 per parameter)
  int64_t accumulation_bytes() const;

 private:
  struct Piece {
    int64_t full_offset = 0;   // into the model's flat layout
    int64_t shard_offset = 0;  // into this rank's shard buffers
    int64_t numel = 0;
  };
  // The tensors of a unit that one group shards: a unit of that group's FsdpGroup.
  struct Part {
    int group = 0;             // into groups_
    int index = 0;             // the FsdpGroup's unit
    int64_t shard_begin = 0;   // into this rank's shard buffers
    int64_t shard_numel = 0;
  };
  struct InFlight {
    Part part;
    Tensor sums;
    std::unique_ptr<parallel::FsdpGroup::Pending> work;
  };
  Tensor shard_of(const Tensor& shard_buffer, const Part& part) const {
    return shard_buffer.slice(0, part.shard_begin, part.shard_numel);
  }
  Tensor grad_shard(const Part& part) const {  // a trainable part's gradient shard
    return grads_.slice(0, part.shard_begin - train_begin_, part.shard_numel);
  }
  std::vector<float> to_shards(const float* full) const;  // host
  void reduce_unit(int unit);
  void complete_oldest_reduction();
  void gather_whole(bool trained_only);  // the units kept whole (whole_), or those of them that train
  void drop_prefetches();
  void drop_kept();  // frees units kept gathered from a forward (no pass holds them)
  void unit_microbatch_done(int unit);

  LlamaModel& model_;
  ops::Backend& be_;
  parallel::ProcessGroup& dp_;
  ShardedStage stage_;
  DType work_dtype_;
  bool bf16_grads_ = false, bf16_params_ = false;
  std::vector<Piece> pieces_;                 // per parameter
  std::vector<std::vector<Part>> parts_;      // per unit
  std::vector<int> per_microbatch_;           // per unit: hook reports per microbatch
  std::vector<int> reported_;                 // per unit: hook reports in its current microbatch
  std::vector<int> microbatches_;             // per unit: microbatches accumulated since its last reduction
  ShardedSchedule schedule_;
  std::vector<uint8_t> kept_;                 // per unit: gathered by a forward, kept for its backward
  int64_t shard_numel_ = 0;
  std::vector<std::unique_ptr<parallel::FsdpGroup>> groups_;  // dp's, then (expert parallel) edp's
  std::vector<uint8_t> trains_;                               // per unit: its tensors train (LlamaModel::trains)
  int64_t train_begin_ = 0;                                   // shard elements [train_begin_, shard_numel_) train
  Tensor master_, working_;                                   // shard buffers (working_ is master_ in fp32)
  Tensor grads_;                                              // the gradient shards of [train_begin_, shard_numel_)
  std::vector<Tensor> whole_;                                 // per unit kept whole (ZeRO-2: all): its working weights
  std::vector<Tensor> gathered_;              // ZeRO-3, per unit: the gathered working weights
  std::vector<std::vector<std::unique_ptr<parallel::FsdpGroup::Pending>>> gathering_;  // per unit: in flight
  std::vector<int> holds_;                    // per unit: passes holding it
  std::vector<Tensor> unit_grads_;            // per unit: whole gradients being accumulated
  std::deque<InFlight> reductions_;
  std::vector<Tensor> buffers_;               // per parameter: the whole fp32 values of a buffer
  std::unique_ptr<FlatAdamW> adam_;
};

}  // namespace primus::train
