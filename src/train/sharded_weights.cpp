#include "train/sharded_weights.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "model/moe.h"

namespace primus::train {
namespace {

Tensor host_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

}  // namespace

ShardedWeights::ShardedWeights(LlamaModel& model, parallel::ProcessGroup& dp, parallel::ProcessGroup* expert_dp,
                               ShardedStage stage, AdamWOptions adam, bool bf16_grads, ShardedSchedule schedule)
    : model_(model),
      be_(model.backend()),
      dp_(dp),
      stage_(stage),
      work_dtype_(activation_dtype(model.precision())),
      bf16_grads_(bf16_grads),
      bf16_params_(adam.main_params_dtype == DType::BF16),
      schedule_(schedule) {
  PRIMUS_CHECK(schedule_.reduce_every >= 1, "reduce_every {} microbatches", schedule_.reduce_every);
  const ParamStore& params = model_.params();
  PRIMUS_CHECK(params.dtype() == DType::F32, "sharded weights keep fp32 masters");
  PRIMUS_CHECK(dp_.device() == be_.device(), "the dp group's buffers must live on the backend's device");
  const auto& infos = params.infos();
  const auto& units = model_.weight_units();
  std::vector<parallel::ProcessGroup*> comms = {&dp_};
  if (expert_dp) comms.push_back(expert_dp);
  auto group_of = [&](int p) { return expert_dp && is_expert_param(infos[size_t(p)].name) ? 1 : 0; };
  pieces_.resize(infos.size());
  parts_.resize(units.size());
  std::vector<std::vector<parallel::FsdpUnit>> fsdp_units(comms.size());
  train_begin_ = -1;
  for (size_t u = 0; u < units.size(); ++u) {
    const WeightUnit& wu = units[u];
    trains_.push_back(model_.trains(wu.first_param));
    PRIMUS_CHECK(model_.trains(wu.last_param) == bool(trains_[u]), "unit {} mixes frozen and trainable tensors", u);
    if (trains_[u] && train_begin_ < 0) train_begin_ = shard_numel_;
    PRIMUS_CHECK(trains_[u] || train_begin_ < 0, "frozen unit {} after a trainable one", u);
    int passes = 0;
    for (int p = wu.first_param; p <= wu.last_param; ++p) passes += model_.weight_grad_passes(p);
    per_microbatch_.push_back(passes);
    for (int g = 0; g < int(comms.size()); ++g) {
      const int n = comms[size_t(g)]->size(), r = comms[size_t(g)]->rank();
      std::vector<parallel::FsdpTensor> tensors;
      std::vector<int> ids;
      for (int p = wu.first_param; p <= wu.last_param; ++p) {
        if (group_of(p) != g) continue;
        const StoredParam& info = infos[size_t(p)];
        const int64_t rows = info.shape.empty() ? 1 : info.shape[0];
        tensors.push_back({1, rows, info.numel / rows, info.offset - wu.begin, 0});
        ids.push_back(p);
      }
      if (tensors.empty()) continue;  // (the same on every rank of the group: same stage, same ep slot)
      parallel::FsdpUnit fu = parallel::fsdp_shard_unit(std::move(tensors), wu.end - wu.begin, n, r);
      for (size_t i = 0; i < ids.size(); ++i) {
        const parallel::FsdpTensor& t = fu.tensors[i];
        const parallel::FsdpRows mine = parallel::fsdp_rows(t.length, n, r);
        pieces_[size_t(ids[i])] = {infos[size_t(ids[i])].offset + mine.first * t.inner, shard_numel_ + t.shard_offset,
                                   mine.count * t.inner};
      }
      parts_[u].push_back({g, int(fsdp_units[size_t(g)].size()), shard_numel_, fu.shard_numel});
      shard_numel_ += fu.shard_numel;
      fsdp_units[size_t(g)].push_back(std::move(fu));
    }
  }
  if (train_begin_ < 0) train_begin_ = shard_numel_;
  for (size_t g = 0; g < comms.size(); ++g)
    groups_.push_back(std::make_unique<parallel::FsdpGroup>(*comms[g], std::move(fsdp_units[g])));
  const Device dev = be_.device();
  master_ = Tensor::zeros({shard_numel_}, DType::F32, dev);
  grads_ = Tensor::zeros({shard_numel_ - train_begin_}, DType::F32, dev);
  working_ = work_dtype_ == DType::F32 ? master_ : Tensor::zeros({shard_numel_}, work_dtype_, dev);
  whole_.resize(units.size());
  for (size_t u = 0; u < units.size(); ++u)
    if (stage_ == ShardedStage::OptimGrads || (model_.frozen_base() && trains_[u]))
      whole_[u] = Tensor::zeros({units[u].end - units[u].begin}, work_dtype_, dev);
  gathered_.resize(units.size());
  gathering_.resize(units.size());
  holds_.assign(units.size(), 0);
  unit_grads_.resize(units.size());
  buffers_.resize(infos.size());
  for (size_t p = 0; p < infos.size(); ++p)
    if (infos[p].buffer) buffers_[p] = Tensor::zeros({infos[p].numel}, DType::F32, dev);
  reported_.assign(units.size(), 0);
  microbatches_.assign(units.size(), 0);
  kept_.assign(units.size(), 0);
  std::vector<ParamSegment> segments;  // the tensors that train, from model_.first_trainable()
  for (size_t p = 0; p < infos.size(); ++p)
    if (model_.trains(int(p)))
      segments.push_back(
          {infos[p].name, pieces_[p].shard_offset - train_begin_, pieces_[p].numel, infos[p].weight_decay});
  adam_ = std::make_unique<FlatAdamW>(adam, std::move(segments), shard_numel_ - train_begin_, dev);
}

ShardedWeights::~ShardedWeights() {
  // Collectives still posted complete before their buffers go (an abandoned step).
  try {
    while (!reductions_.empty()) {
      reductions_.front().work->wait();
      reductions_.pop_front();
    }
    for (auto& unit : gathering_)
      for (auto& g : unit) g->wait();
  } catch (...) {
  }
}

// ---- WeightSource ---------------------------------------------------------------------------

void ShardedWeights::acquire(int unit, int next) {
  if (whole_[size_t(unit)].defined()) return;
  auto start = [&](int u) {
    const WeightUnit& wu = model_.weight_units()[size_t(u)];
    Tensor full = Tensor::zeros({wu.end - wu.begin}, work_dtype_, be_.device());
    for (const Part& part : parts_[size_t(u)])
      gathering_[size_t(u)].push_back(
          groups_[size_t(part.group)]->start_gather(part.index, shard_of(working_, part), full));
    gathered_[size_t(u)] = full;
    // Kept for the backward of the microbatch (freed once its W passes are done).
    kept_[size_t(u)] = !schedule_.reshard_after_forward;
  };
  ++holds_[size_t(unit)];
  if (!gathered_[size_t(unit)].defined()) start(unit);
  // Prefetch: the next unit's gather runs while this one computes (parallel::kFsdpGathersInFlight).
  if (next >= 0 && !whole_[size_t(next)].defined() && !gathered_[size_t(next)].defined()) start(next);
  for (auto& g : gathering_[size_t(unit)]) g->wait();
  gathering_[size_t(unit)].clear();
}

void ShardedWeights::release(int unit) {
  if (whole_[size_t(unit)].defined()) return;
  PRIMUS_CHECK(holds_[size_t(unit)] > 0, "release of unit {} that no pass holds", unit);
  if (--holds_[size_t(unit)] == 0 && gathering_[size_t(unit)].empty() && !kept_[size_t(unit)])
    gathered_[size_t(unit)] = Tensor();
}

Tensor ShardedWeights::weights(int unit) {
  if (whole_[size_t(unit)].defined()) return whole_[size_t(unit)];
  PRIMUS_CHECK(holds_[size_t(unit)] > 0 && gathered_[size_t(unit)].defined() && gathering_[size_t(unit)].empty(),
               "the weights of unit {} read while no pass holds it (FSDP gathers a unit only for its passes)", unit);
  return gathered_[size_t(unit)];
}

Tensor ShardedWeights::buffer(int param) {
  PRIMUS_CHECK(buffers_[size_t(param)].defined(), "parameter {} is not a buffer", param);
  return buffers_[size_t(param)];
}

Tensor ShardedWeights::grads(int unit) {
  Tensor& g = unit_grads_[size_t(unit)];
  if (!g.defined()) {
    const WeightUnit& u = model_.weight_units()[size_t(unit)];
    g = Tensor::zeros({u.end - u.begin}, DType::F32, be_.device());
  }
  return g;
}

// ---- gradients ------------------------------------------------------------------------------

void ShardedWeights::begin_step() {
  PRIMUS_CHECK(reductions_.empty(), "a step began with gradient reductions in flight");
  grads_.zero_();
  std::fill(reported_.begin(), reported_.end(), 0);
  std::fill(microbatches_.begin(), microbatches_.end(), 0);
  drop_kept();  // e.g. kept by an evaluation's forwards
}

void ShardedWeights::weights_done(const std::vector<int>& ids) {
  for (int id : ids) {
    const int u = model_.unit_of(id);
    if (++reported_[size_t(u)] == per_microbatch_[size_t(u)]) {
      reported_[size_t(u)] = 0;
      unit_microbatch_done(u);
    }
  }
}

void ShardedWeights::unit_microbatch_done(int unit) {
  const auto u = size_t(unit);
  if (kept_[u]) {  // its backward is done: reshard now
    kept_[u] = 0;
    if (holds_[u] == 0 && gathering_[u].empty()) gathered_[u] = Tensor();
  }
  if (!trains_[u]) {  // a frozen unit: what its W passes computed is no gradient of ours
    unit_grads_[u] = Tensor();
    return;
  }
  if (++microbatches_[u] < schedule_.reduce_every) {
    if (bf16_grads_) round_to_bf16(be_, grads(unit));  // the bf16 accumulation, as each reduction's
    return;
  }
  microbatches_[u] = 0;
  reduce_unit(unit);
}

void ShardedWeights::reduce_unit(int unit) {
  const Tensor whole = grads(unit);
  if (bf16_grads_) round_to_bf16(be_, whole);  // this microbatch's bf16 weight gradient
  be_.synchronize();  // the W passes' sums are final before the copies into the wire buffers
  for (const Part& part : parts_[size_t(unit)]) {
    while (reductions_.size() >= size_t(parallel::kFsdpReductionsInFlight)) complete_oldest_reduction();
    Tensor sums = Tensor::zeros({std::max<int64_t>(1, part.shard_numel)}, DType::F32, be_.device());
    auto work = groups_[size_t(part.group)]->start_reduce(part.index, whole, sums.slice(0, 0, part.shard_numel));
    reductions_.push_back({part, std::move(sums), std::move(work)});
  }
  unit_grads_[size_t(unit)] = Tensor();  // copied into the wire buffers: freed now
}

void ShardedWeights::complete_oldest_reduction() {
  InFlight f = std::move(reductions_.front());
  reductions_.pop_front();
  f.work->wait();
  if (f.part.shard_numel == 0) return;
  Tensor mine = grad_shard(f.part);
  be_.add(mine, f.sums.slice(0, 0, f.part.shard_numel), mine);
  if (bf16_grads_) round_to_bf16(be_, mine);  // the bf16 gradient shard's accumulation
}

void ShardedWeights::finish_gradients() {
  // A unit whose reports did not complete a microbatch (none in the model's passes) still
  // holds gradients: reduced here, in unit order on every rank.
  for (size_t u = 0; u < unit_grads_.size(); ++u) {
    if (!unit_grads_[u].defined()) continue;
    if (trains_[u])
      reduce_unit(int(u));
    else
      unit_grads_[u] = Tensor();
  }
  while (!reductions_.empty()) complete_oldest_reduction();
  std::fill(reported_.begin(), reported_.end(), 0);
  std::fill(microbatches_.begin(), microbatches_.end(), 0);
  drop_prefetches();
}

void ShardedWeights::drop_prefetches() {
  for (size_t u = 0; u < gathering_.size(); ++u) {
    for (auto& g : gathering_[u]) g->wait();
    gathering_[u].clear();
    if (holds_[u] == 0) {
      gathered_[u] = Tensor();
      kept_[u] = 0;
    }
  }
}

void ShardedWeights::drop_kept() {
  for (size_t u = 0; u < kept_.size(); ++u) {
    if (!kept_[u] || holds_[u] > 0) continue;
    for (auto& g : gathering_[u]) g->wait();
    gathering_[u].clear();
    gathered_[u] = Tensor();
    kept_[u] = 0;
  }
}

int64_t ShardedWeights::accumulation_bytes() const {
  // The trainable units' buffers, allocated as the W passes first ask (a frozen unit's is freed
  // after each microbatch).
  if (schedule_.reduce_every <= 1) return 0;
  int64_t n = 0;
  const auto& units = model_.weight_units();
  for (size_t u = 0; u < units.size(); ++u)
    if (trains_[u]) n += units[u].end - units[u].begin;
  return n * int64_t(sizeof(float));
}

Tensor ShardedWeights::grad_piece(int param) const {
  const Piece& p = pieces_[size_t(param)];
  if (!model_.trains(param)) return grads_.slice(0, 0, 0);  // frozen: no gradient
  return grads_.slice(0, p.shard_offset - train_begin_, p.numel);
}

double ShardedWeights::grad_sq_sum(const std::vector<int>& counted) const {
  std::vector<int> segments;  // AdamW's segments are the trainable tensors, from first_trainable()
  for (int t : counted)
    if (model_.trains(t)) segments.push_back(t - model_.first_trainable());
  return adam_->grad_sq_sum(grads_, segments);
}

// ---- optimizer ------------------------------------------------------------------------------

void ShardedWeights::step(double lr, double grad_scale) {
  drop_kept();  // a kept gathered copy would be stale after the update
  const int64_t n = shard_numel_ - train_begin_;
  Tensor working = working_.dtype() == DType::F32 ? Tensor() : working_.slice(0, train_begin_, n);
  adam_->step(master_.slice(0, train_begin_, n), grads_, working.defined() ? &working : nullptr, lr, grad_scale);
  gather_whole(true);  // the frozen units' whole copies stay as they are
}

void ShardedWeights::gather_whole(bool trained_only) {
  std::deque<std::unique_ptr<parallel::FsdpGroup::Pending>> inflight;
  for (size_t u = 0; u < whole_.size(); ++u) {
    if (!whole_[u].defined() || (trained_only && !trains_[u])) continue;
    const Tensor& dst = whole_[u];
    for (const Part& part : parts_[u]) {
      if (inflight.size() >= 2) {
        inflight.front()->wait();
        inflight.pop_front();
      }
      inflight.push_back(groups_[size_t(part.group)]->start_gather(part.index, shard_of(working_, part), dst));
    }
  }
  for (auto& g : inflight) g->wait();
}

// ---- values and state -----------------------------------------------------------------------

std::vector<float> ShardedWeights::to_shards(const float* full) const {
  std::vector<float> out(size_t(shard_numel_), 0.0f);
  for (const Piece& p : pieces_) std::copy_n(full + p.full_offset, p.numel, out.begin() + p.shard_offset);
  return out;
}

void ShardedWeights::init_weights(uint64_t seed) {
  ParamStore full = model_.params();  // the layout; filled on the host
  full.allocate_values(Device::CPU);
  full.init(seed, model_.spec().init_method_std, model_.spec().scaled_init_std());
  load_values(full.values().data<float>());
}

void ShardedWeights::load_values(const float* full) {
  std::vector<float> rounded;
  if (bf16_params_) {  // bf16 parameters: bf16 from the start, whatever was loaded
    rounded.assign(full, full + model_.params().numel());
    for (float& x : rounded) x = bf16::from_float(x).to_float();
    full = rounded.data();
  }
  const auto& infos = model_.params().infos();
  for (size_t p = 0; p < infos.size(); ++p)
    if (buffers_[p].defined()) {
      Tensor host = Tensor::empty({infos[p].numel});
      std::copy_n(full + infos[p].offset, infos[p].numel, host.data<float>());
      buffers_[p].copy_from(host.to(buffers_[p].device()));
    }
  drop_kept();
  master_.copy_from(host_tensor(to_shards(full)).to(master_.device()));
  if (working_.dtype() != DType::F32) be_.cast(master_, working_);
  gather_whole(false);
}

void ShardedWeights::load_targets(ResidentLoad& load, bool optimizer) {
  const auto& infos = model_.params().infos();
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const Piece& pc = pieces_[p];
    std::array<float*, 3> d{};
    if (optimizer && pc.numel > 0 && model_.trains(int(p))) {  // a frozen tensor has no moments
      d[1] = load.moment(*adam_, false, pc.shard_offset - train_begin_, pc.numel);
      d[2] = load.moment(*adam_, true, pc.shard_offset - train_begin_, pc.numel);
    }
    if (buffers_[p].defined()) {  // whole on every rank; its piece of the master follows (finish_load)
      load.add(infos[p].offset, infos[p].numel, {load.tensor(buffers_[p], 0, infos[p].numel), nullptr, nullptr});
      load.add(pc.full_offset, pc.numel, {nullptr, d[1], d[2]});
    } else if (pc.numel > 0) {
      d[0] = load.tensor(master_, pc.shard_offset, pc.numel);
      load.add(pc.full_offset, pc.numel, d);
    }
  }
}

void ShardedWeights::finish_load(int64_t step, bool optimizer) {
  drop_kept();
  const auto& infos = model_.params().infos();
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const Piece& pc = pieces_[p];
    if (!buffers_[p].defined() || pc.numel == 0) continue;
    Tensor piece = master_.slice(0, pc.shard_offset, pc.numel);
    piece.copy_from(buffers_[p].slice(0, pc.full_offset - infos[p].offset, pc.numel));
  }
  if (bf16_params_) {  // bf16 parameters: bf16 whatever was loaded
    round_to_bf16(be_, master_);
    for (const Tensor& b : buffers_)
      if (b.defined()) round_to_bf16(be_, b);
  }
  if (working_.dtype() != DType::F32) be_.cast(master_, working_);
  gather_whole(false);
  if (optimizer) adam_->set_state(step, nullptr, nullptr);
}

void round_to_bf16(ops::Backend& be, Tensor x) {
  PRIMUS_CHECK(x.dtype() == DType::F32, "round_to_bf16 of a {} tensor", dtype_name(x.dtype()));
  if (x.numel() == 0) return;
  Tensor half = Tensor::empty(x.shape(), DType::BF16, x.device());
  be.cast(x, half);
  be.cast(half, x);
}

const float* host_range(const Tensor& flat, int64_t begin, int64_t n, std::vector<std::vector<float>>& copies) {
  PRIMUS_CHECK(flat.dtype() == DType::F32 && begin >= 0 && begin + n <= flat.numel(), "host_range outside its tensor");
  if (flat.device() == Device::CPU) return flat.data<float>() + begin;
  const Tensor host = flat.slice(0, begin, n).to(Device::CPU);
  std::vector<float>& out = copies.emplace_back(host.data<float>(), host.data<float>() + n);
  return out.data();
}

std::vector<ShardedWeights::HeldPiece> ShardedWeights::held_pieces(std::vector<std::vector<float>>& copies) const {
  const auto& infos = model_.params().infos();
  std::vector<HeldPiece> out;
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const Piece& pc = pieces_[p];
    if (pc.numel == 0) continue;
    HeldPiece h{int(p), pc.full_offset, pc.numel, {}};
    // A buffer's whole copy is authoritative over its piece (buffer()).
    h.data[0] = buffers_[p].defined() ? host_range(buffers_[p], pc.full_offset - infos[p].offset, pc.numel, copies)
                                      : host_range(master_, pc.shard_offset, pc.numel, copies);
    if (model_.trains(int(p))) {
      h.data[1] = adam_->moment_range(false, pc.shard_offset - train_begin_, pc.numel, copies);
      h.data[2] = adam_->moment_range(true, pc.shard_offset - train_begin_, pc.numel, copies);
    } else {  // a frozen tensor: zero moments in the checkpoint, as no_shard writes them
      h.data[1] = h.data[2] = copies.emplace_back(size_t(pc.numel), 0.0f).data();
    }
    out.push_back(h);
  }
  return out;
}

int64_t ShardedWeights::parameter_bytes() const {
  int64_t b = int64_t(master_.nbytes());
  if (working_.dtype() != DType::F32) b += int64_t(working_.nbytes());
  for (const Tensor& w : whole_)
    if (w.defined()) b += int64_t(w.nbytes());
  return b;
}

}  // namespace primus::train
