// The gradient sums that model parallelism adds to data parallelism's, in one place, and which
// tensors the global gradient norm counts on this rank. Every data-parallel strategy
// (train/dp_strategy.h) calls them at its point of the step:
//
//   tied embedding   a tied embedding split over pipeline stages lives on the first and the last
//                    stage; its two gradients are summed over the embedding group (Megatron's)
//                    before data parallelism reduces it
//   tensor parallel  under sequence parallelism every tp-replicated tensor saw only this rank's
//                    rows; without it, only the tensors whose gradient covers this rank's heads
//                    (QK norms, StoredParam::tp_partial_grads): summed over tp. The sum commutes
//                    with the dp reduction, and tp peers share the dp shard layout under ZeRO
//
// A tensor's gradient is whatever the strategy holds of it (GradOf): the whole tensor, or (ZeRO-2
// / FSDP) this rank's piece, which is the same piece on its tp peers and on the other stage of a
// tied embedding (same shapes, same dp rank).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/llama.h"
#include "parallel/mesh.h"
#include "parallel/process_group.h"
#include "plan/parallel_layout.h"

namespace primus::train {

class ModelParallelGrads {
 public:
  using GradOf = std::function<Tensor(int tensor)>;

  // Collective over pp (the embedding group is made here).
  ModelParallelGrads(LlamaModel& model, const plan::ParallelLayout& layout, const parallel::MeshGroups& groups,
                     const parallel::MeshCoord& me);

  // This rank's copy of a tied embedding split over stages; -1 when it has none.
  int tied_tensor() const { return tied_tensor_; }
  // The tied embedding's gradient summed over its two stages (nothing without one).
  void sum_tied_embedding(const GradOf& grad) const;
  // The tensor-parallel sums above (nothing with tp 1).
  void sum_tensor_parallel(const GradOf& grad) const;

  // The norm counts each tensor of the whole model once: tp-replicated tensors on tp rank 0, the
  // tied embedding on the first stage. Expert-parallel experts are apart (experts()): each is on
  // one rank of ep x pp, and by the same tp rule counted on tp rank 0 when every tp rank holds it
  // whole, on every tp rank when expert_tensor_parallel_size splits it (an expert's LoRA factor
  // beside a split base is whole: tp rank 0 only).
  const std::vector<int>& counted() const { return counted_; }
  const std::vector<int>& experts() const { return experts_; }

 private:
  parallel::ProcessGroup* tp_ = nullptr;
  std::unique_ptr<parallel::ProcessGroup> embedding_group_;
  int tied_tensor_ = -1;
  std::vector<int> tp_summed_;  // tensors summed over tp
  std::vector<int> counted_, experts_;
};

}  // namespace primus::train
