#include "train/expert_grads.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/moe.h"

namespace primus::train {

ExpertGradients::ExpertGradients(ParamStore& params, parallel::ProcessGroup& edp, bool sharded,
                                 const AdamWOptions& adam)
    : params_(params), edp_(edp) {
  const auto& infos = params.infos();
  std::vector<ParamSegment> segments;
  int64_t n = 0;
  for (size_t t = 0; t < infos.size(); ++t)
    if (is_expert_param(infos[t].name)) {
      tensors_.push_back(int(t));
      at_.push_back(n);
      n += infos[t].numel;
      segments.push_back({infos[t].name, infos[t].offset, infos[t].numel, infos[t].weight_decay});
    }
  kept_.assign(tensors_.size(), 0);
  if (n == 0) return;
  grads_ = Tensor::zeros({n}, DType::F32, params.device());
  if (sharded) {
    values_ = Tensor::zeros({n}, DType::F32, params.device());
    adam_ = std::make_unique<FlatAdamW>(adam, std::move(segments), params.numel(), params.device());
  }
}

bool ExpertGradients::is_expert(int tensor) const {
  return std::binary_search(tensors_.begin(), tensors_.end(), tensor);
}

void ExpertGradients::keep(int tensor) {
  const size_t i = size_t(std::lower_bound(tensors_.begin(), tensors_.end(), tensor) - tensors_.begin());
  PRIMUS_CHECK(i < tensors_.size() && tensors_[i] == tensor, "tensor {} is not an expert's", tensor);
  const StoredParam& p = params_.infos()[size_t(tensor)];
  Tensor dst = grads_.slice(0, at_[i], p.numel);
  dst.copy_from(params_.grads().slice(0, p.offset, p.numel));
  kept_[i] = 1;
}

void ExpertGradients::reduce() {
  for (size_t i = 0; i < tensors_.size(); ++i)
    PRIMUS_CHECK(kept_[i], "expert tensor {} was not saved before the dp reduction",
                 params_.infos()[size_t(tensors_[i])].name);
  std::fill(kept_.begin(), kept_.end(), 0);
  if (!grads_.defined()) return;
  if (edp_.size() > 1) edp_.all_reduce(grads_);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StoredParam& p = params_.infos()[size_t(tensors_[i])];
    Tensor dst = params_.grads().slice(0, p.offset, p.numel);
    dst.copy_from(grads_.slice(0, at_[i], p.numel));
  }
}

double ExpertGradients::grad_sq_sum(const FlatAdamW* replicated) const {
  if (adam_) {
    std::vector<int> all(tensors_.size());
    std::iota(all.begin(), all.end(), 0);
    return adam_->grad_sq_sum(params_.grads(), all);
  }
  PRIMUS_CHECK(replicated, "expert gradient norm without an optimizer");
  return replicated->grad_sq_sum(params_.grads(), tensors_);
}

void ExpertGradients::save_values() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StoredParam& p = params_.infos()[size_t(tensors_[i])];
    Tensor dst = values_.slice(0, at_[i], p.numel);
    dst.copy_from(params_.values().slice(0, p.offset, p.numel));
  }
}

void ExpertGradients::step(double lr, double grad_scale) {
  PRIMUS_CHECK(adam_, "ExpertGradients::step without the distributed optimizer");
  // The dense step scaled the expert slots of its shard in place (by grad_scale): take the
  // reduced gradients again from grads_.
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StoredParam& p = params_.infos()[size_t(tensors_[i])];
    Tensor dst = params_.values().slice(0, p.offset, p.numel);
    dst.copy_from(values_.slice(0, at_[i], p.numel));
    Tensor g = params_.grads().slice(0, p.offset, p.numel);
    g.copy_from(grads_.slice(0, at_[i], p.numel));
  }
  adam_->step(params_.values(), params_.grads(), nullptr, lr, grad_scale);
}

}  // namespace primus::train
