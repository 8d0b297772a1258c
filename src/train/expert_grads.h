// Expert parallelism's side of the gradient reduction and the optimizer. Under ep > 1 the ranks
// of a dp group hold different experts in the same slots of their flat buffers, so the dp
// buckets (which sum every slot over dp) must not sum those slots: each expert tensor's local
// gradient is kept aside the moment it is final (before its bucket starts), and summed over the
// expert-data-parallel group instead (the ranks that hold the same experts). Dense tensors are
// untouched.
//
// With the plain optimizer the summed gradients go back into their slots and the replicated
// AdamW steps them like any tensor. With the distributed optimizer (ZeRO-1), whose parameter
// all-gather fills every slot from the slot's dp owner, the experts get a distributed optimizer
// of their own over edp, as Megatron's over the expert data-parallel group: the packed expert
// gradients are reduce-scattered over edp, each rank keeps the AdamW state of its shards only,
// and the updated values are all-gathered and written back into the expert slots after the dense
// step.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/param_store.h"
#include "optim/flat_adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/distributed_optimizer.h"
#include "parallel/process_group.h"

namespace primus::train {

class ExpertGradients {
 public:
  // The expert tensors of params (model/moe.h is_expert_param) that train (LlamaModel::trains: under
  // LoRA the experts' adapters, their frozen bases having no gradient). sharded: the dense optimizer
  // is the distributed one, so the experts get their own, sharded over edp, with these options.
  ExpertGradients(ParamStore& params, const std::function<bool(int)>& trains, parallel::ProcessGroup& edp,
                  bool sharded, const AdamWOptions& adam);
  ~ExpertGradients();

  const std::vector<int>& tensors() const { return tensors_; }  // ascending tensor ids
  bool is_expert(int tensor) const;
  // Tensor `tensor`'s local gradient is final: saved before any dp collective reads its slot.
  void keep(int tensor);
  // After the dp buckets finished, the sum over edp: in every expert slot (replicated), or in
  // this rank's shards of the packed gradients (sharded).
  void reduce();
  // Distributed optimizer only: the sum of squares of the experts' reduced gradients in this rank's
  // shards, summed over edp (collective over edp); the caller sums it over the expert-parallel and
  // model-parallel groups (every expert is on one rank of those). With the plain optimizer the
  // sums are in the model's slots, where the caller's AdamW reads them.
  double grad_sq_sum() const;

  // Distributed optimizer only: around the dense step, which overwrites the expert slots.
  void save_values();
  void step(double lr, double grad_scale);  // AdamW on this rank's shards, all-gather, values back into the slots
  // The experts' moments loaded from the flat layout of params (exp_avg, exp_avg_sq at each
  // expert tensor's offset; local; both null: only the step count, the moments loaded in place
  // through state_ranges()).
  void load_state(int64_t step, const float* exp_avg, const float* exp_avg_sq);
  // Distributed optimizer only, for checkpoint writers and loads: this rank's shards of the experts' AdamW
  // state in the flat layout of params ([begin, begin + numel) of one expert tensor), each with the
  // AdamW that holds it and where in its state.
  struct StateRange {
    int tensor = 0;
    int64_t begin = 0, numel = 0;
    FlatAdamW* adam = nullptr;
    int64_t adam_offset = 0;
  };
  std::vector<StateRange> state_ranges() const;
  // Parameters this rank keeps optimizer state for (its shards).
  int64_t state_numel() const { return dist_ ? dist_->shard_numel() : 0; }
  int64_t state_bytes() const { return dist_ ? dist_->state_bytes() : 0; }
  // The packed buffers it holds beside the model's: the experts' gradients, and (sharded) their
  // values, which the distributed optimizer steps.
  int64_t gradient_bytes() const { return grads_.defined() ? int64_t(grads_.nbytes()) : 0; }
  // The packed gradients (undefined without experts): under the distributed optimizer this rank's
  // shards of them hold the sums after reduce().
  const Tensor& packed_gradients() const { return grads_; }
  int64_t value_bytes() const { return values_.defined() ? int64_t(values_.nbytes()) : 0; }

 private:
  ParamStore& params_;
  parallel::ProcessGroup& edp_;
  std::vector<int> tensors_;
  std::vector<int64_t> at_;      // per expert tensor: its offset in grads_ / values_
  std::vector<uint8_t> kept_;
  Tensor grads_, values_;        // the expert slots, packed
  std::unique_ptr<parallel::GradBuckets> buckets_;          // sharded: reduce-scatter over edp
  std::unique_ptr<parallel::DistributedOptimizer> dist_;    // sharded: AdamW on this rank's shards
};

}  // namespace primus::train
