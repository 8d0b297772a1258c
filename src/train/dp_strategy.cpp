#include "train/dp_strategy.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "model/moe.h"
#include "optim/flat_adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/distributed_optimizer.h"
#include "train/expert_grads.h"
#include "train/model_parallel_grads.h"
#include "train/sharded_weights.h"

namespace primus::train {
namespace {

// Where the dp gradients are summed and the ZeRO shards span: dp, or dp x cp under context
// parallelism (each cp rank holds its chunks' share of every gradient; Megatron's data-parallel
// group with context parallel).
parallel::ProcessGroup& gradient_group(const DpSetup& s) { return s.layout.cp > 1 ? *s.groups.dp_cp : *s.groups.dp; }

// Collects the ranges a rank writes of a checkpoint (DpShardState). A range that `holders` ranks
// hold identically is split between them, this rank (`index` among them) writing its share; of a
// tensor every tp rank holds whole (StoredParam::tp_replicated) tp rank j writes only the j-th
// share by position in the tensor (the ranges differ between tp ranks under ZeRO-1, whose buckets
// follow each rank's own layout, but a tensor's position does not).
class ShardStateBuilder {
 public:
  using Data = std::array<const float*, 3>;
  ShardStateBuilder(const ParamStore& params, const parallel::MeshGroups& groups)
      : params_(params), tp_size_(groups.tp ? groups.tp->size() : 1), tp_rank_(groups.tp ? groups.tp->rank() : 0) {
    state_.source.layout = &params;
  }
  std::vector<std::vector<float>>& copies() { return state_.copies; }
  // [begin, begin + numel) of tensor t's flat range, its data at `data` (element begin).
  void add(int t, int64_t begin, int64_t numel, int holders, int index, Data data) {
    int64_t lo = numel * index / holders, hi = numel * (index + 1) / holders;  // from begin
    const StoredParam& p = params_.infos()[size_t(t)];
    if (p.tp_replicated && tp_size_ > 1) {  // and this tp rank's share of the tensor, by position in it
      lo = std::max(lo, p.offset + p.numel * tp_rank_ / tp_size_ - begin);
      hi = std::min(hi, p.offset + p.numel * (tp_rank_ + 1) / tp_size_ - begin);
    }
    if (lo >= hi) return;
    checkpoint::SaveRange r{begin + lo, hi - lo, {}};
    for (int s = 0; s < 3; ++s) r.data[s] = data[size_t(s)] + lo;
    state_.source.ranges.push_back(r);
  }
  DpShardState take() {
    auto& rs = state_.source.ranges;
    std::sort(rs.begin(), rs.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    return std::move(state_);
  }

 private:
  const ParamStore& params_;
  int tp_size_, tp_rank_;
  DpShardState state_;
};

// ---- replicated and ZeRO-1: the model's own flat buffers, reduced in buckets -----------------

// The model holds its weights and gradients; the dp buckets start as the W passes finish (a
// tensor's bucket once the step's last W pass of it is done). Under expert parallelism each
// expert tensor's gradient is kept aside before its bucket starts and reduced over edp x cp.
class BucketedStrategy : public DataParallelStrategy {
 public:
  void begin_step() override {
    model_.params().zero_grad();
    buckets_->reset();
    std::fill(w_done_.begin(), w_done_.end(), 0);
  }
  void finish_gradients() override {
    const auto whole = [this](int t) { return model_.params().grad_tensor(t); };
    if (mp_.tied_tensor() >= 0) {  // its bucket waited for the sum over the two stages
      mp_.sum_tied_embedding(whole);
      buckets_->mark_ready(mp_.tied_tensor());
    }
    buckets_->finish();
    if (experts_) experts_->reduce();
    mp_.sum_tensor_parallel(whole);
    // bf16 main gradients: the reduced sums rounded once (a bf16 all-reduce or reduce-scatter
    // over two ranks rounds each sum once too; the wire itself stays fp32)
    if (bf16_grads_) {
      round_to_bf16(model_.backend(), model_.params().grads());
      if (experts_ && experts_->packed_gradients().defined())
        round_to_bf16(model_.backend(), experts_->packed_gradients());
    }
  }
  const Tensor& gradients() const override { return model_.params().grads(); }
  DpMemory memory() const override {
    const ParamStore& params = model_.params();
    DpMemory m;
    m.parameters = double(params.numel()) * double(dtype_size(params.dtype())) +
                   (model_.has_separate_working_weights() ? double(model_.working_weights().nbytes()) : 0.0);
    m.gradients = double(params.grads().nbytes());
    if (experts_) {  // the experts' packed gradients (and under ZeRO-1 their values) beside the model's
      m.gradients += double(experts_->gradient_bytes());
      m.parameters += double(experts_->value_bytes());
    }
    m.optimizer = optimizer_bytes();
    return m;
  }

 protected:
  BucketedStrategy(const DpSetup& s, parallel::GradReduce reduce);
  virtual double optimizer_bytes() const = 0;
  // After a resume loaded the values in place: bf16 parameters stay bf16 whatever was loaded, and
  // the working weights follow.
  void round_loaded_values() {
    if (bf16_params_) round_to_bf16(model_.backend(), model_.params().values());
    model_.sync_working_weights();
  }
  // Resume targets: the store's values (and, with m and v, the moments of the tensors from
  // `first_moment` on: m and v hold flat element `moment_begin` first), as runs of tensors that
  // the same replicas hold (dp x cp; the experts edp x cp).
  void add_replicated_targets(ResidentLoad& load, int first_moment, int64_t moment_begin, float* m, float* v) {
    const ParamStore& params = model_.params();
    const auto& infos = params.infos();
    float* values = load.tensor(params.values(), 0, params.numel());
    const auto replicas = [&](size_t t) { return expert(int(t)) ? groups_.edp_cp.get() : &gradient_group_; };
    for (size_t t = 0; t < infos.size();) {
      size_t u = t + 1;
      while (u < infos.size() && replicas(u) == replicas(t) && int(u) != first_moment) ++u;
      const int64_t b = infos[t].offset, e = infos[u - 1].offset + infos[u - 1].numel;
      const bool moments = m && int(t) >= first_moment;
      load.add(b, e - b,
               {values + b, moments ? m + (b - moment_begin) : nullptr, moments ? v + (b - moment_begin) : nullptr},
               replicas(t));
      t = u;
    }
  }
  // The experts' squared gradient sum over the whole model from this rank's (collective over ep and
  // mp), 0 without expert parallelism.
  double experts_sq_sum(double mine) const {
    if (!experts_) return 0.0;
    return groups_.mp->all_reduce_value(groups_.ep->all_reduce_value(mine));
  }
  // Whether tensor t is an expert's under expert parallelism, frozen or not: its replicas are the
  // edp x cp group (the ranks that hold the same experts), not dp x cp.
  bool expert(int t) const { return experts_ && is_expert_param(model_.params().infos()[size_t(t)].name); }

  LlamaModel& model_;
  const parallel::MeshGroups& groups_;
  parallel::ProcessGroup& gradient_group_;  // dp, or dp x cp
  ModelParallelGrads mp_;
  std::unique_ptr<ExpertGradients> experts_;  // expert parallel: the experts' reduction over edp x cp
  std::unique_ptr<parallel::GradBuckets> buckets_;
  const bool bf16_grads_, bf16_params_;

 private:
  void weights_done(const std::vector<int>& ids);  // the model's weight-gradient hook
  std::vector<int> w_done_, w_expected_;            // per tensor: W passes seen this step, and expected
};

BucketedStrategy::BucketedStrategy(const DpSetup& s, parallel::GradReduce reduce)
    : model_(s.model),
      groups_(s.groups),
      gradient_group_(gradient_group(s)),
      mp_(s.model, s.layout, s.groups, s.me),
      bf16_grads_(s.bf16_main_grads),
      bf16_params_(s.adam.main_params_dtype == DType::BF16) {
  model_.init_weights(s.seed);
  if (bf16_params_) {  // bf16 parameters from the start
    round_to_bf16(model_.backend(), model_.params().values());
    model_.sync_working_weights();
  }
  ParamStore& params = model_.params();
  if (s.layout.ep > 1)
    experts_ = std::make_unique<ExpertGradients>(
        params, [this](int t) { return model_.trains(t); }, *s.groups.edp_cp,
        reduce == parallel::GradReduce::ReduceScatter, s.adam);  // the experts' own distributed optimizer with ZeRO-1's
  parallel::GradBucketsOptions bo;
  bo.bucket_size = s.bucket_size > 0 ? s.bucket_size : parallel::default_bucket_size(s.layout.dp);
  bo.overlap_grad_reduce = s.overlap_grad_reduce;
  bo.reduce = reduce;
  buckets_ = std::make_unique<parallel::GradBuckets>(gradient_group(s), params.grads().data<float>(), params.numel(),
                                                     segments_of(params), bo);
  const int num_tensors = int(params.infos().size());
  w_done_.assign(num_tensors, 0);
  w_expected_.resize(num_tensors);
  for (int t = 0; t < num_tensors; ++t)
    w_expected_[t] = int(s.layout.microbatches_per_rank) * model_.weight_grad_passes(t);
  model_.set_weight_grad_hook([this](const std::vector<int>& ids) { weights_done(ids); });
}

void BucketedStrategy::weights_done(const std::vector<int>& ids) {
  for (int t : ids) {
    if (bf16_grads_) round_to_bf16(model_.backend(), model_.params().grad_tensor(t));  // the bf16 accumulation
    if (++w_done_[t] == w_expected_[t] && t != mp_.tied_tensor()) {
      if (experts_ && experts_->is_expert(t)) experts_->keep(t);
      buckets_->mark_ready(t);
    }
  }
}

// no_shard: the summed gradients everywhere, AdamW on every rank. Under LoRA (LlamaModel::
// frozen_base) AdamW covers the trainable tensors alone, the flat range from trainable_begin():
// the frozen ones have no optimizer state (a checkpoint holds zero moments for them) and no part
// in the gradient norm.
class ReplicatedStrategy final : public BucketedStrategy {
 public:
  explicit ReplicatedStrategy(const DpSetup& s)
      : BucketedStrategy(s, parallel::GradReduce::AllReduce),
        first_(model_.first_trainable()),
        begin_(model_.trainable_begin()) {
    const ParamStore& params = model_.params();
    std::vector<ParamSegment> segments = segments_of(params);
    segments.erase(segments.begin(), segments.begin() + first_);
    for (ParamSegment& seg : segments) seg.offset -= begin_;
    adam_ = std::make_unique<FlatAdamW>(s.adam, std::move(segments), params.numel() - begin_, params.device());
    for (int t : mp_.counted())
      if (t >= first_) counted_.push_back(t - first_);
    for (int t : mp_.experts())  // under LoRA the experts' adapters (ExpertGradients reduced them in their slots)
      if (t >= first_) experts_counted_.push_back(t - first_);
  }
  double gradient_norm() override {
    const float* grads = model_.params().grads().data<float>() + begin_;
    const double experts = experts_sq_sum(adam_->grad_sq_sum(grads, experts_counted_));
    const double dense = adam_->grad_sq_sum(grads, counted_);
    return std::sqrt(groups_.mp->all_reduce_value(dense) + experts);
  }
  void step(double lr, double grad_scale) override {
    bf16* working = model_.has_separate_working_weights() ? model_.working_weights().data<bf16>() + begin_ : nullptr;
    adam_->step(model_.params().values().data<float>() + begin_, model_.params().grads().data<float>() + begin_,
                working, lr, grad_scale);
  }
  int64_t step_count() const override { return adam_->step_count(); }
  void load_targets(ResidentLoad& load, bool optimizer) override {
    const int64_t n = model_.params().numel() - begin_;
    float* m = optimizer && n > 0 ? load.moment(*adam_, false, 0, n) : nullptr;
    float* v = optimizer && n > 0 ? load.moment(*adam_, true, 0, n) : nullptr;
    add_replicated_targets(load, first_, begin_, m, v);
  }
  void finish_load(int64_t step, bool optimizer) override {
    round_loaded_values();
    if (optimizer) adam_->set_state(step, nullptr, nullptr);
  }
  // Every tensor is whole here and on its replicas (dp x cp; the experts' edp x cp): each writes a share.
  DpShardState shard_state() const override {
    const ParamStore& params = model_.params();
    ShardStateBuilder b(params, groups_);
    const int64_t n = params.numel() - begin_;
    const float* values = host_range(params.values(), 0, params.numel(), b.copies());
    const float* m = adam_->moment_range(false, 0, n, b.copies());
    const float* v = adam_->moment_range(true, 0, n, b.copies());
    const float* zeros = begin_ > 0 ? b.copies().emplace_back(size_t(begin_), 0.0f).data() : nullptr;
    for (size_t t = 0; t < params.infos().size(); ++t) {
      const StoredParam& p = params.infos()[t];
      const parallel::ProcessGroup& g = expert(int(t)) ? *groups_.edp_cp : gradient_group_;
      const bool trains = int(t) >= first_;
      const float* mt = trains ? m + (p.offset - begin_) : zeros + p.offset;
      const float* vt = trains ? v + (p.offset - begin_) : zeros + p.offset;
      b.add(int(t), p.offset, p.numel, g.size(), g.rank(), {values + p.offset, mt, vt});
    }
    return b.take();
  }

 private:
  double optimizer_bytes() const override { return double(adam_->state_bytes()); }
  const int first_;       // the first tensor AdamW steps (0 without LoRA)
  const int64_t begin_;   // its flat offset
  std::vector<int> counted_;  // the tensors the norm counts, as indices of AdamW's segments
  std::vector<int> experts_counted_;  // the same of the expert-parallel experts (ModelParallelGrads::experts)
  std::unique_ptr<FlatAdamW> adam_;
};

// optim (ZeRO-1): the buckets reduce-scattered; each rank steps its shards and all-gathers the
// parameters. The experts, whose slots the all-gather would fill from another rank's experts, get
// a distributed optimizer of their own over edp (ExpertGradients).
class DistributedOptimizerStrategy final : public BucketedStrategy {
 public:
  explicit DistributedOptimizerStrategy(const DpSetup& s) : BucketedStrategy(s, parallel::GradReduce::ReduceScatter) {
    dist_ = std::make_unique<parallel::DistributedOptimizer>(*buckets_, model_.params().values().data<float>(), s.adam);
  }
  double gradient_norm() override {
    // (every expert tensor of this rank is counted, or none: ModelParallelGrads::experts)
    const double experts = experts_sq_sum(mp_.experts().empty() ? 0.0 : experts_->grad_sq_sum());
    const std::vector<int>& counted = mp_.counted();
    const double dense = dist_->grad_norm(groups_.mp.get(), [&counted](int t) {
      return std::binary_search(counted.begin(), counted.end(), t);
    });
    return experts_ ? std::sqrt(dense * dense + experts) : dense;
  }
  void step(double lr, double grad_scale) override {
    if (experts_) experts_->save_values();
    dist_->step(lr, grad_scale);
    if (experts_) experts_->step(lr, grad_scale);  // the experts are not the dp shards'
    model_.sync_working_weights();
  }
  int64_t step_count() const override { return dist_->step_count(); }
  // This rank's optimizer shards (one range per bucket, the experts' over edp), with the values
  // there; a shard range is held by this rank alone within dp x cp.
  DpShardState shard_state() const override {
    const ParamStore& params = model_.params();
    ShardStateBuilder b(params, groups_);
    const float* values = host_range(params.values(), 0, params.numel(), b.copies());
    for_each_state_range([&](int t, int64_t begin, int64_t n, FlatAdamW& adam, int64_t at) {
      b.add(t, begin, n, 1, 0,
            {values + begin, adam.moment_range(false, at, n, b.copies()), adam.moment_range(true, at, n, b.copies())});
    });
    return b.take();
  }
  // The values whole (replicated over dp x cp), the moments of the ranges shard_state writes
  // (the dense step's state at the experts' places is not theirs and stays 0).
  void load_targets(ResidentLoad& load, bool optimizer) override {
    add_replicated_targets(load, 0, 0, nullptr, nullptr);
    if (!optimizer) return;
    for_each_state_range([&](int, int64_t begin, int64_t n, FlatAdamW& adam, int64_t at) {
      load.add(begin, n, {nullptr, load.moment(adam, false, at, n), load.moment(adam, true, at, n)});
    });
  }
  void finish_load(int64_t step, bool optimizer) override {
    round_loaded_values();
    if (!optimizer) return;
    dist_->load_state(step, nullptr, nullptr, buckets_->buffer_numel());
    if (experts_) experts_->load_state(step, nullptr, nullptr);
  }

 private:
  double optimizer_bytes() const override {
    return double(dist_->state_bytes()) + (experts_ ? double(experts_->state_bytes()) : 0.0);
  }
  // Calls fn(tensor, begin, numel, adam, adam_offset) for the ranges of the flat layout whose AdamW
  // state this rank holds: its dense shards within each dense tensor, and the experts' state ranges.
  template <typename Fn>
  void for_each_state_range(Fn&& fn) const {
    const auto& infos = model_.params().infos();
    for (const parallel::DistributedOptimizer::Shard& sh : dist_->shards())
      for (size_t t = 0; t < infos.size(); ++t) {
        if (expert(int(t))) continue;  // the dense step's state there is not theirs
        const int64_t lo = std::max(sh.begin, infos[t].offset),
                      hi = std::min(sh.begin + sh.numel, infos[t].offset + infos[t].numel);
        if (lo < hi) fn(int(t), lo, hi - lo, *sh.adam, lo - sh.begin);
      }
    if (experts_)
      for (const ExpertGradients::StateRange& r : experts_->state_ranges())
        fn(r.tensor, r.begin, r.numel, *r.adam, r.adam_offset);
  }
  std::unique_ptr<parallel::DistributedOptimizer> dist_;
};

// ---- ZeRO-2 and ZeRO-3 / FSDP: the rank's shards ----------------------------------------------

class ShardedStrategy final : public DataParallelStrategy {
 public:
  explicit ShardedStrategy(const DpSetup& s);
  void begin_step() override { sharded_->begin_step(); }
  void finish_gradients() override {
    sharded_->finish_gradients();
    const auto piece = [this](int t) { return sharded_->grad_piece(t); };
    mp_->sum_tied_embedding(piece);
    mp_->sum_tensor_parallel(piece);
    if (bf16_grads_) round_to_bf16(model_.backend(), sharded_->grad_shards());  // those sums in bf16 too
  }
  double gradient_norm() override;
  void step(double lr, double grad_scale) override { sharded_->step(lr, grad_scale); }
  int64_t step_count() const override { return sharded_->step_count(); }
  const Tensor& gradients() const override { return sharded_->grad_shards(); }
  // This rank's pieces: each held by it alone within its shards' group.
  DpShardState shard_state() const override {
    ShardStateBuilder b(model_.params(), groups_);
    for (const ShardedWeights::HeldPiece& h : sharded_->held_pieces(b.copies()))
      b.add(h.tensor, h.begin, h.numel, 1, 0, {h.data[0], h.data[1], h.data[2]});
    return b.take();
  }
  void load_targets(ResidentLoad& load, bool optimizer) override { sharded_->load_targets(load, optimizer); }
  void finish_load(int64_t step, bool optimizer) override { sharded_->finish_load(step, optimizer); }
  DpMemory memory() const override {  // the rank's shards (and ZeRO-2's whole working copy; whole gradients
                                      // accumulated through the step)
    return {double(sharded_->parameter_bytes()), double(sharded_->gradient_bytes() + sharded_->accumulation_bytes()),
            double(sharded_->optimizer_bytes())};
  }

 private:
  LlamaModel& model_;
  const parallel::MeshGroups& groups_;
  parallel::ProcessGroup& shards_group_;
  const bool bf16_grads_;
  std::unique_ptr<ShardedWeights> sharded_;
  std::unique_ptr<ModelParallelGrads> mp_;
};

ShardedSchedule schedule_of(const DpSetup& s) {
  ShardedSchedule out;
  out.reduce_every = s.reduce_sharded_grads_once_per_step ? int(s.layout.microbatches_per_rank) : 1;
  out.reshard_after_forward = s.reshard_after_forward;
  return out;
}

ShardedStrategy::ShardedStrategy(const DpSetup& s)
    : model_(s.model), groups_(s.groups), shards_group_(gradient_group(s)), bf16_grads_(s.bf16_main_grads) {
  sharded_ = std::make_unique<ShardedWeights>(model_, shards_group_, s.layout.ep > 1 ? s.groups.edp_cp.get() : nullptr,
                                              s.layout.shard_parameters() ? ShardedStage::OptimGradsParams
                                                                          : ShardedStage::OptimGrads,
                                              s.adam, s.bf16_main_grads, schedule_of(s));
  model_.set_weight_source(sharded_.get());
  sharded_->init_weights(s.seed);
  mp_ = std::make_unique<ModelParallelGrads>(model_, s.layout, s.groups, s.me);
  // Each unit is reduce-scattered as its W passes finish.
  model_.set_weight_grad_hook([this](const std::vector<int>& ids) { sharded_->weights_done(ids); });
}

// Each element of a tensor is on one rank of its shards' group: dense tensors over dp (x cp),
// experts over edp x cp, then each expert is on one rank of ep.
double ShardedStrategy::gradient_norm() {
  const double dense = shards_group_.all_reduce_value(sharded_->grad_sq_sum(mp_->counted()));
  const double experts =
      mp_->experts().empty()
          ? 0.0
          : groups_.ep->all_reduce_value(groups_.edp_cp->all_reduce_value(sharded_->grad_sq_sum(mp_->experts())));
  return std::sqrt(groups_.mp->all_reduce_value(dense + experts));
}

}  // namespace

int64_t DpShardState::numel() const {
  int64_t n = 0;
  for (const checkpoint::SaveRange& r : source.ranges) n += r.numel;
  return n;
}

// ZeRO-2 / FSDP shard every weight, frozen or not, and reduce and step the trainable ones
// (ShardedWeights). Under LoRA, ZeRO-1 runs the replicated strategy: the adapters' AdamW state is
// small, and the whole frozen weights are on every rank anyway.
std::unique_ptr<DataParallelStrategy> make_dp_strategy(const DpSetup& setup) {
  if (setup.layout.shard_gradients()) return std::make_unique<ShardedStrategy>(setup);
  if (setup.layout.shard_optimizer() && !setup.model.frozen_base())
    return std::make_unique<DistributedOptimizerStrategy>(setup);
  return std::make_unique<ReplicatedStrategy>(setup);
}

}  // namespace primus::train
