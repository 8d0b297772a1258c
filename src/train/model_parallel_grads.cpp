#include "train/model_parallel_grads.h"

#include "model/moe.h"

namespace primus::train {
namespace {

void sum_over(parallel::ProcessGroup& g, const Tensor& grad) {
  if (grad.numel() > 0) g.all_reduce(grad.raw(), grad.numel(), parallel::CommType::F32, parallel::ReduceOp::Sum);
}

}  // namespace

ModelParallelGrads::ModelParallelGrads(LlamaModel& model, const plan::ParallelLayout& layout,
                                       const parallel::MeshGroups& groups, const parallel::MeshCoord& me)
    : tp_(groups.tp.get()) {
  const ParamStore& params = model.params();
  const auto& infos = params.infos();
  // The last stage's replica of the embedding: the tied output layer's, or the MTP depths' input.
  const bool replica = !model.spec().untie_embeddings_and_output_weights || model.spec().mtp_num_layers > 0;
  if (replica && layout.schedule) {
    const int last = layout.schedule->rank_of_stage(layout.pp * layout.vpp - 1);
    if (last != 0) {  // (a V-shape puts both ends on rank 0: one copy, nothing to sum)
      embedding_group_ = groups.pp->new_group({0, last}, "embedding");
      if (embedding_group_)
        tied_tensor_ = model.embedding_param() >= 0       ? model.embedding_param()
                       : model.mtp_embedding_param() >= 0 ? model.mtp_embedding_param()
                                                          : model.output_param();
    }
  }
  for (int t = 0; t < int(infos.size()); ++t) {
    const StoredParam& p = infos[size_t(t)];
    if (layout.tp > 1 && (layout.sequence_parallel ? p.tp_replicated : p.tp_partial_grads)) tp_summed_.push_back(t);
    if (p.tp_replicated && me.tp != 0) continue;
    if (layout.ep > 1 && is_expert_param(p.name)) {
      experts_.push_back(t);
      continue;
    }
    if (t == tied_tensor_ && model.embedding_param() < 0) continue;
    counted_.push_back(t);
  }
}

void ModelParallelGrads::sum_tied_embedding(const GradOf& grad) const {
  if (embedding_group_) sum_over(*embedding_group_, grad(tied_tensor_));
}

void ModelParallelGrads::sum_tensor_parallel(const GradOf& grad) const {
  for (int t : tp_summed_) sum_over(*tp_, grad(t));
}

}  // namespace primus::train
