// Expert parallelism's side of the gradient reduction and the optimizer. Under ep > 1 the ranks
// of a dp group hold different experts in the same slots of their flat buffers, so the dp
// buckets (which sum every slot over dp) must not sum those slots: each expert tensor's local
// gradient is kept aside the moment it is final (before its bucket starts), put back after the
// buckets, and summed over the expert-data-parallel group instead (the ranks that hold the same
// experts). With the distributed optimizer, whose parameter all-gather fills every slot from the
// slot's dp owner, the expert values are kept across its step and the experts get an AdamW of
// their own (replicated over edp, not sharded). Dense tensors are untouched.
#pragma once

#include <memory>
#include <vector>

#include "model/param_store.h"
#include "optim/flat_adamw.h"
#include "parallel/process_group.h"

namespace primus::train {

class ExpertGradients {
 public:
  // The expert tensors of params (model/moe.h is_expert_param). sharded: the dense optimizer is
  // the distributed one, so the experts get their own AdamW with these options.
  ExpertGradients(ParamStore& params, parallel::ProcessGroup& edp, bool sharded, const AdamWOptions& adam);

  const std::vector<int>& tensors() const { return tensors_; }  // ascending tensor ids
  bool is_expert(int tensor) const;
  // Tensor `tensor`'s local gradient is final: saved before any dp collective reads its slot.
  void keep(int tensor);
  // After the dp buckets finished: every expert slot holds its gradient summed over edp.
  void reduce();
  // Sum of squares of this rank's expert gradients (after reduce()); the caller sums it over the
  // expert-parallel and model-parallel groups (every expert is on one rank of those).
  double grad_sq_sum(const FlatAdamW* replicated) const;

  // Distributed optimizer only: around its step, which overwrites the expert slots.
  void save_values();
  void step(double lr, double grad_scale);  // restores values and reduced gradients, then AdamW on the experts
  FlatAdamW* optimizer() const { return adam_.get(); }

 private:
  ParamStore& params_;
  parallel::ProcessGroup& edp_;
  std::vector<int> tensors_;
  std::vector<int64_t> at_;      // per expert tensor: its offset in grads_ / values_
  std::vector<uint8_t> kept_;
  Tensor grads_, values_;        // the expert slots, packed
  std::unique_ptr<FlatAdamW> adam_;
};

}  // namespace primus::train
