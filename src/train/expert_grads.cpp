#include "train/expert_grads.h"

#include <algorithm>

#include "core/error.h"
#include "model/moe.h"

namespace primus::train {

ExpertGradients::ExpertGradients(ParamStore& params, const std::function<bool(int)>& trains,
                                 parallel::ProcessGroup& edp, bool sharded, const AdamWOptions& adam)
    : params_(params), edp_(edp) {
  const auto& infos = params.infos();
  std::vector<ParamSegment> packed;  // the expert tensors at their offsets in the packed buffers
  int64_t n = 0;
  for (size_t t = 0; t < infos.size(); ++t)
    if (is_expert_param(infos[t].name) && trains(int(t))) {
      tensors_.push_back(int(t));
      at_.push_back(n);
      packed.push_back({infos[t].name, n, infos[t].numel, infos[t].weight_decay});
      n += infos[t].numel;
    }
  kept_.assign(tensors_.size(), 0);
  if (n == 0) return;
  grads_ = Tensor::zeros({n}, DType::F32, params.device());
  if (!sharded) return;
  values_ = Tensor::zeros({n}, DType::F32, params.device());
  parallel::GradBucketsOptions bo;
  bo.bucket_size = parallel::default_bucket_size(edp.size());
  bo.overlap_grad_reduce = false;  // one reduce-scatter pass after the dp buckets
  bo.reduce = parallel::GradReduce::ReduceScatter;
  buckets_ = std::make_unique<parallel::GradBuckets>(edp, grads_.data<float>(), n, std::move(packed), bo);
  dist_ = std::make_unique<parallel::DistributedOptimizer>(*buckets_, values_.data<float>(), adam);
}

ExpertGradients::~ExpertGradients() = default;

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
  if (buckets_) {  // this rank's shards hold the sums; the slots keep what the dense step does to them
    buckets_->reset();
    buckets_->finish();
    return;
  }
  if (edp_.size() > 1) edp_.all_reduce(grads_);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StoredParam& p = params_.infos()[size_t(tensors_[i])];
    Tensor dst = params_.grads().slice(0, p.offset, p.numel);
    dst.copy_from(grads_.slice(0, at_[i], p.numel));
  }
}

double ExpertGradients::grad_sq_sum() const {
  PRIMUS_CHECK(dist_ || tensors_.empty(), "ExpertGradients::grad_sq_sum without the distributed optimizer");
  return dist_ ? edp_.all_reduce_value(dist_->local_grad_sq_sum()) : 0.0;
}

void ExpertGradients::save_values() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StoredParam& p = params_.infos()[size_t(tensors_[i])];
    Tensor dst = values_.slice(0, at_[i], p.numel);
    dst.copy_from(params_.values().slice(0, p.offset, p.numel));
  }
}

void ExpertGradients::step(double lr, double grad_scale) {
  PRIMUS_CHECK(dist_ || tensors_.empty(), "ExpertGradients::step without the distributed optimizer");
  if (!dist_) return;
  dist_->step(lr, grad_scale);  // this rank's shards of values_, then the all-gather over edp
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StoredParam& p = params_.infos()[size_t(tensors_[i])];
    Tensor dst = params_.values().slice(0, p.offset, p.numel);
    dst.copy_from(values_.slice(0, at_[i], p.numel));
  }
}

std::vector<ExpertGradients::StateRange> ExpertGradients::state_ranges() const {
  std::vector<StateRange> out;
  if (!dist_) return out;
  for (const parallel::DistributedOptimizer::Shard& sh : dist_->shards())  // packed coordinates
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const StoredParam& p = params_.infos()[size_t(tensors_[i])];
      const int64_t lo = std::max(sh.begin, at_[i]), hi = std::min(sh.begin + sh.numel, at_[i] + p.numel);
      if (lo < hi) out.push_back({tensors_[i], p.offset + (lo - at_[i]), hi - lo, sh.adam, lo - sh.begin});
    }
  return out;
}

void ExpertGradients::load_state(int64_t step, const float* exp_avg, const float* exp_avg_sq) {
  if (!dist_) return;
  const int64_t n = grads_.numel();
  if (!exp_avg && !exp_avg_sq) return dist_->load_state(step, nullptr, nullptr, n);  // loaded in place
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const StoredParam& p = params_.infos()[size_t(tensors_[i])];
    std::copy_n(exp_avg + p.offset, p.numel, m.begin() + at_[i]);
    std::copy_n(exp_avg_sq + p.offset, p.numel, v.begin() + at_[i]);
  }
  dist_->load_state(step, m.data(), v.data(), n);
}

}  // namespace primus::train
