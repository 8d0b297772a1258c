#include "plan/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "checkpoint/format.h"
#include "core/error.h"
#include "core/meta_device.h"
#include "model/moe.h"
#include "parallel/data_parallel.h"
#include "parallel/fsdp.h"
#include "parallel/recording_process_group.h"
#include "pipeline/executor.h"
#include "plan/model_walk.h"

namespace primus::plan {
namespace {

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(uint64_t(1) << 30)); }

// A tensor of n elements of `size` bytes as the host pool and the meta device hold it.
double held(double n, double size) { return std::max(64.0, std::ceil(n * size / 64.0) * 64.0); }

// AdamW's two moments of n parameters over `segments` tensors (or pieces of them): each moment its
// own allocation, of exp_avg_dtype / exp_avg_sq_dtype's size (fp32 4, bf16 and fp16 2, fp8 1), and
// an fp16 or fp8 moment's fp32 scale per segment (optim/adamw.h, adamw_state_bytes).
double moments(double n, int64_t segments, const config::TrainingArgs& a) {
  using config::OptimDtype;
  const auto size = [](OptimDtype d) {
    return d == OptimDtype::Fp8 ? 1.0 : d == OptimDtype::Bf16 || d == OptimDtype::Fp16 ? 2.0 : 4.0;
  };
  const auto scaled = [](OptimDtype d) { return d == OptimDtype::Fp16 || d == OptimDtype::Fp8 ? 1.0 : 0.0; };
  return held(n, size(a.exp_avg_dtype)) + held(n, size(a.exp_avg_sq_dtype)) +
         4.0 * double(segments) * (scaled(a.exp_avg_dtype) + scaled(a.exp_avg_sq_dtype));
}

// The activations a rank holds at each op of its schedule: F keeps the chunk's context, B keeps
// what W needs, W frees it; the peak adds the op's own peak to what the other microbatches hold.
// A microbatch's token ids and targets live from its first F to its last W.
double walk_schedule(const RankRecord& rec, const ParallelLayout& L, int pp_rank, double* in_flight) {
  const auto& chunks = rec.chunks;
  double total = 0, peak = 0;
  int alive = 0, peak_alive = 0;
  auto note = [&](double v, int a) {
    if (v > peak) peak = v, peak_alive = a;
  };
  if (!L.schedule) {  // one microbatch at a time: F, then B and W layer by layer (LlamaModel::backward)
    const ChunkRecord& c = chunks.front();
    note(rec.microbatch_bytes + c.peak_f, 1);
    note(rec.microbatch_bytes + c.peak_b, 1);
    if (in_flight) *in_flight = peak_alive;
    return peak;
  }
  std::map<std::pair<int, int>, double> held_by;  // (microbatch, chunk) -> bytes
  std::map<int, int> weights_left;                // microbatch -> chunks without their W yet
  const int n = int(chunks.size());
  auto set = [&](int mb, int c, double v) {
    double& h = held_by[{mb, c}];
    total += v - h;
    if (h == 0 && v > 0) ++alive;
    if (h > 0 && v == 0) --alive;
    h = v;
  };
  for (const pipeline::Op& op : L.schedule->ranks[size_t(pp_rank)]) {
    const ChunkRecord& c = chunks[size_t(op.chunk)];
    const double mine = held_by.count({op.microbatch, op.chunk}) ? held_by[{op.microbatch, op.chunk}] : 0;
    if (op.type == pipeline::OpType::F) {
      if (!weights_left.count(op.microbatch)) {
        weights_left[op.microbatch] = n;
        total += rec.microbatch_bytes;
      }
      note(total + c.peak_f, alive + 1);
      set(op.microbatch, op.chunk, c.kept_after_f);
      continue;
    }
    if (op.type == pipeline::OpType::B) {
      note(total - mine + c.peak_b, alive);
      set(op.microbatch, op.chunk, c.kept_after_b);
      continue;
    }
    // W, or B and W back to back
    const double pass_peak = op.type == pipeline::OpType::W ? c.peak_w : std::max(c.peak_b, c.peak_w);
    note(total - mine + pass_peak, alive);
    set(op.microbatch, op.chunk, 0);
    if (--weights_left[op.microbatch] == 0) {
      weights_left.erase(op.microbatch);
      total -= rec.microbatch_bytes;
    }
  }
  if (in_flight) *in_flight = peak_alive;
  return peak;
}

// A data-parallel group of `size` ranks that communicates nothing, for building the reduction's
// real buffers on the meta device.
struct MetaGroup {
  parallel::CommLog log;
  parallel::RecordingProcessGroup group;
  MetaGroup(const char* name, int size) : group(name, size, 0, log) {}
};

// The buckets the trainer builds (train/trainer.cpp: bucket size ddp_bucket_size or Megatron's
// default for dp; reduce-scatter under ZeRO-1) over `segments` of a flat fp32 buffer of `numel`
// elements, on the meta device: their scratch bytes (exact) and this rank's shard elements.
struct Buckets {
  double scratch = 0;
  int64_t shard = 0;
  int64_t segments = 0;  // the tensors (pieces) in this rank's shards, AdamW's segments over them
};
Buckets meta_buckets(int group_size, int64_t bucket_size, int64_t numel, std::vector<ParamSegment> segments,
                     std::vector<std::pair<int64_t, int64_t>>* shards = nullptr) {
  MetaGroup g("dp", group_size);
  const Tensor grads = Tensor::empty({std::max<int64_t>(numel, 1)}, DType::F32, Device::Meta);
  parallel::GradBucketsOptions bo;
  bo.bucket_size = bucket_size;
  bo.reduce = parallel::GradReduce::ReduceScatter;
  const parallel::GradBuckets b(g.group, grads.data<float>(), numel, std::move(segments), bo);
  Buckets out;
  out.scratch = double(b.scratch_bytes());
  for (const auto& bk : b.buckets()) {
    out.shard += bk.shard_end - bk.shard_begin;
    for (int t = bk.first_tensor; t <= bk.last_tensor; ++t) {
      const ParamSegment& s = b.tensors()[size_t(t)];
      out.segments += std::max(bk.shard_begin, s.offset) < std::min(bk.shard_end, s.offset + s.numel);
    }
    if (shards) shards->push_back({bk.shard_begin, bk.shard_end});
  }
  return out;
}

// ZeRO-2 / FSDP (train/sharded_weights.h): every tensor split along its first dim over its group
// (dp x cp; the experts over edp x cp under expert parallelism), a unit's pieces laid out as
// parallel::fsdp_shard_unit lays them out for the weight source.
struct Shards {
  int64_t numel = 0;     // this rank's shard elements
  int64_t trained = 0;   // of them, those of the units that train (LoRA: the adapters')
  int64_t trained_units = 0;  // the units that train, whole (LoRA under FSDP keeps them whole)
  int64_t max_unit = 0;  // the largest unit's whole elements
  int64_t buffers = 0;   // buffer tensors, kept whole (the MoE expert bias)
  int64_t trained_tensors = 0;  // the pieces of the units that train (rank 0 holds rows of each)
};
Shards shards_of(const RankRecord& rec, int dense_group, int expert_group) {
  Shards s;
  for (const WeightUnit& u : rec.units) {
    s.max_unit = std::max(s.max_unit, u.end - u.begin);
    const bool trains = u.first_param >= rec.first_trainable;
    if (trains) s.trained_units += u.end - u.begin;
    for (int expert = 0; expert < 2; ++expert) {
      std::vector<parallel::FsdpTensor> tensors;
      for (int p = u.first_param; p <= u.last_param; ++p) {
        const StoredParam& info = rec.params[size_t(p)];
        if (is_expert_param(info.name) != bool(expert)) continue;
        const int64_t rows = info.shape.empty() ? 1 : info.shape[0];
        tensors.push_back({1, rows, info.numel / rows, info.offset - u.begin, 0});
        if (trains && p >= rec.first_trainable && info.numel > 0) ++s.trained_tensors;
      }
      if (tensors.empty()) continue;
      const int64_t n = parallel::fsdp_shard_unit(std::move(tensors), u.end - u.begin,
                                                  expert ? expert_group : dense_group, 0)
                            .shard_numel;
      s.numel += n;
      if (trains) s.trained += n;
    }
  }
  for (const StoredParam& p : rec.params)
    if (p.buffer) s.buffers += p.numel;
  return s;
}

// The expert tensors of a rank under expert parallelism that train (under LoRA the experts'
// adapters), packed as train/expert_grads.h packs them.
struct Experts {
  int64_t numel = 0;
  std::vector<ParamSegment> segments;
};
Experts experts_of(const RankRecord& rec, int ep) {
  Experts x;
  for (size_t t = size_t(std::max(0, rec.first_trainable)); t < rec.params.size(); ++t)
    if (const StoredParam& p = rec.params[t]; ep > 1 && is_expert_param(p.name)) {
      x.segments.push_back({p.name, x.numel, p.numel, p.weight_decay});
      x.numel += p.numel;
    }
  return x;
}

// no_shard and ZeRO-1: the model's own master, working copy and gradients; AdamW over everything
// or over this rank's shards of the trainer's buckets; the experts' packed gradients (and their
// own distributed optimizer over edp) under expert parallelism. Under LoRA (a frozen base) ZeRO-1
// runs as no_shard, AdamW over the adapters' range alone (train/dp_strategy.cpp make_dp_strategy).
void replicated_state(MemoryEstimate& e, const RankRecord& rec, const ParallelLayout& L, const config::TrainingArgs& a,
                      config::DpSharding sharding) {
  const double P = double(rec.param_numel), master = double(dtype_size(rec.master));
  const int dp = L.dp * L.cp, edp = std::max(1, L.dp / std::max(1, L.ep)) * L.cp;
  if (rec.first_trainable > 0) sharding = config::DpSharding::NoShard;
  e.parameter_bytes = held(P, master);
  e.working_bytes = rec.activation != rec.master ? held(P, double(dtype_size(rec.activation))) : 0;
  e.gradient_bytes = held(P, master);
  if (sharding == config::DpSharding::NoShard) {
    int64_t trained = 0;
    for (size_t t = size_t(std::max(0, rec.first_trainable)); t < rec.params.size(); ++t)
      trained += rec.params[t].numel > 0;
    e.optimizer_bytes = moments(P - double(rec.trainable_begin), trained, a);
  } else {
    std::vector<ParamSegment> segments;
    for (const StoredParam& p : rec.params) segments.push_back({p.name, p.offset, p.numel, p.weight_decay});
    const int64_t bucket = a.ddp_bucket_size > 0 ? a.ddp_bucket_size : parallel::default_bucket_size(L.dp);
    const Buckets b = meta_buckets(dp, bucket, rec.param_numel, std::move(segments));
    e.optimizer_bytes = moments(double(b.shard), b.segments, a);
    e.buffer_bytes += b.scratch;
  }
  const Experts x = experts_of(rec, L.ep);
  if (x.numel == 0) return;
  e.gradient_bytes += held(double(x.numel), 4);
  if (sharding == config::DpSharding::NoShard) return;
  const Buckets b = meta_buckets(edp, parallel::default_bucket_size(edp), x.numel, x.segments);
  e.parameter_bytes += held(double(x.numel), 4);
  e.optimizer_bytes += moments(double(b.shard), b.segments, a);
  e.buffer_bytes += b.scratch;
}

// ZeRO-2 and FSDP: the rank's shards of master, gradients and moments (and of the working copy
// in bf16), ZeRO-2's whole working copy, the buffers kept whole. While the passes run, the
// weight source holds a unit's whole fp32 gradient accumulating beside the reductions in flight
// (parallel::kFsdpReductionsInFlight, each a unit's wire buffer), and under FSDP the gathered
// units (parallel::kFsdpGathersInFlight: the one computing and the next); counted at the largest
// unit. These transients are not in DataParallelStrategy::memory() (its persistent buffers, which
// the shards above reproduce: tests/unit/train/test_memory_estimate.cpp builds the strategies and
// compares), and they exist only once the strategy runs, so they are counted here. With
// reduce_sharded_grads_once_per_step the units' whole gradients are held through the step: counted
// as gradients, as DataParallelStrategy::memory() counts them. Under LoRA only the units that
// train have gradient shards, moments and (once per step) whole gradients, and FSDP keeps them
// whole beside the frozen units' shards (train/sharded_weights.h).
void sharded_state(MemoryEstimate& e, const RankRecord& rec, const ParallelLayout& L, const config::TrainingArgs& a,
                   config::DpSharding sharding) {
  const int dp = L.dp * L.cp, edp = std::max(1, L.dp / std::max(1, L.ep)) * L.cp;
  const double act = double(dtype_size(rec.activation));
  const Shards s = shards_of(rec, dp, edp);
  const double S = double(s.numel);
  e.parameter_bytes = held(S, 4);
  const bool frozen_base = rec.first_trainable > 0;
  e.working_bytes = (rec.activation != rec.master ? held(S, act) : 0) +
                    (sharding == config::DpSharding::OptimGrads ? held(double(rec.param_numel), act)
                     : frozen_base                              ? held(double(s.trained_units), act)
                                                                : 0);
  const double T = double(s.trained);
  e.gradient_bytes = held(T, 4);
  // reduce_sharded_grads_once_per_step: every trainable unit's whole fp32 gradient through the step
  // (ShardedWeights::accumulation_bytes), as no_shard holds it.
  if (a.reduce_sharded_grads_once_per_step && L.microbatches_per_rank > 1)
    e.gradient_bytes += held(double(s.trained_units), 4);
  e.optimizer_bytes = moments(T, s.trained_tensors, a);
  if (s.buffers > 0) e.buffer_bytes += held(double(s.buffers), 4);
  const double unit = double(s.max_unit);
  e.buffer_bytes += (1 + parallel::kFsdpReductionsInFlight) * held(unit, 4);
  if (sharding == config::DpSharding::OptimGradsParams)
    e.buffer_bytes += parallel::kFsdpGathersInFlight * held(unit, act);
}

// The elements of tensor `p` (flat [p.offset, p.offset + p.numel)) inside [lo, hi) that tp rank 0
// writes: of a tensor every tp rank holds whole, only its first 1/tp (ShardStateBuilder,
// train/dp_strategy.cpp).
int64_t written_of(const StoredParam& p, int64_t lo, int64_t hi, int tp) {
  if (p.tp_replicated && tp > 1) hi = std::min(hi, p.offset + p.numel / tp);
  lo = std::max(lo, p.offset);
  hi = std::min(hi, p.offset + p.numel);
  return std::max<int64_t>(0, hi - lo);
}

// The elements rank 0 of its groups writes (DataParallelStrategy::shard_state).
int64_t save_elements(const RankRecord& rec, const ParallelLayout& L, const config::TrainingArgs& a,
                      config::DpSharding sharding) {
  const int dp = L.dp * L.cp, edp = std::max(1, L.dp / std::max(1, L.ep)) * L.cp;
  const auto expert = [&](const StoredParam& p) { return L.ep > 1 && is_expert_param(p.name); };
  int64_t n = 0;
  // rank 0's share [0, numel / holders) of each (LoRA's ZeRO-1 is no_shard: make_dp_strategy)
  if (sharding == config::DpSharding::NoShard || (sharding == config::DpSharding::Optim && rec.first_trainable > 0)) {
    for (const StoredParam& p : rec.params)
      n += written_of(p, p.offset, p.offset + p.numel / (expert(p) ? edp : dp), L.tp);
    return n;
  }
  if (sharding == config::DpSharding::Optim) {  // its bucket shards (the experts': their own, over edp)
    std::vector<ParamSegment> segments;
    for (const StoredParam& p : rec.params) segments.push_back({p.name, p.offset, p.numel, p.weight_decay});
    std::vector<std::pair<int64_t, int64_t>> shards;
    const int64_t bucket = a.ddp_bucket_size > 0 ? a.ddp_bucket_size : parallel::default_bucket_size(L.dp);
    meta_buckets(dp, bucket, rec.param_numel, std::move(segments), &shards);
    for (const auto& [lo, hi] : shards)
      for (const StoredParam& p : rec.params)
        if (!expert(p)) n += written_of(p, lo, hi, L.tp);
    const Experts x = experts_of(rec, L.ep);
    if (x.numel == 0) return n;
    shards.clear();
    meta_buckets(edp, parallel::default_bucket_size(edp), x.numel, x.segments, &shards);
    for (const auto& [lo, hi] : shards)
      for (const ParamSegment& seg : x.segments)
        n += std::max<int64_t>(0, std::min(hi, seg.offset + seg.numel) - std::max(lo, seg.offset));
    return n;
  }
  for (const StoredParam& p : rec.params) {  // ZeRO-2 / FSDP: its rows of each tensor
    const int64_t rows = p.shape.empty() ? 1 : p.shape[0];
    const parallel::FsdpRows r = parallel::fsdp_rows(rows, expert(p) ? edp : dp, 0);
    n += written_of(p, p.offset, p.offset + r.count * (p.numel / std::max<int64_t>(1, rows)), L.tp);
  }
  return n;
}

}  // namespace

SaveMemory estimate_save_memory(const RankRecord& rec, const ParallelLayout& L, const config::TrainingArgs& a,
                                config::DpSharding sharding, bool device_state) {
  SaveMemory m;
  m.elements = save_elements(rec, L, a, sharding);
  const double copy = 3.0 * double(sizeof(float)) * double(m.elements);  // values, exp_avg, exp_avg_sq
  m.staging_bytes = std::min(double(checkpoint::kWriteBufferBytes), copy);
  m.sync_bytes = m.staging_bytes + (device_state ? copy : 0.0);
  m.async_bytes = m.sync_bytes + copy;
  return m;
}

MemoryEstimate estimate_rank_memory(const RankRecord& rec, const ParallelLayout& L, const config::TrainingArgs& a,
                                    config::DpSharding sharding, int pp_rank) {
  MemoryEstimate e;
  e.pp_rank = pp_rank;
  for (const StoredParam& p : rec.params) e.parameters += p.numel;
  e.buffer_bytes = rec.model_bytes;
  if (sharding == config::DpSharding::NoShard || sharding == config::DpSharding::Optim)
    replicated_state(e, rec, L, a, sharding);
  else
    sharded_state(e, rec, L, a, sharding);
  if (L.schedule) {  // the executor's posted receives and a send in flight, one message each
    const double message = double(rec.message[0]) * double(rec.message[1]);
    e.buffer_bytes += double(pipeline::ExecutorOptions{}.recv_ahead + 1) *
                      held(message, double(dtype_size(rec.activation)));
  }
  e.activation_bytes = walk_schedule(rec, L, pp_rank, &e.peak_in_flight);
  return e;
}

double MemoryEstimate::bytes_per_parameter() const {
  return (parameter_bytes + working_bytes + gradient_bytes + optimizer_bytes) / std::max<double>(1, double(parameters));
}

std::string MemoryEstimate::describe() const {
  return fmt::format("{} for {:.1f}M parameters on this rank ({:.0f} bytes each): parameters {}, gradients {}, "
                     "optimizer state {}, activations {}, buffers {}",
                     gib(total_bytes()), double(parameters) / 1e6, bytes_per_parameter(),
                     gib(parameter_bytes + working_bytes), gib(gradient_bytes), gib(optimizer_bytes),
                     gib(activation_bytes), gib(buffer_bytes));
}

std::vector<MemoryEstimate> estimate_memory_per_rank(const ModelSpec& spec, const ParallelLayout& L,
                                                     const config::TrainingArgs& a, Precision precision,
                                                     config::DpSharding sharding) {
  std::vector<MemoryEstimate> out;
  const std::vector<RankRecord> walks = walk_ranks(spec, L, a, precision);
  for (int r = 0; r < L.pp; ++r) out.push_back(estimate_rank_memory(walks[size_t(r)], L, a, sharding, r));
  return out;
}

MemoryEstimate estimate_memory(const ModelSpec& spec, const ParallelLayout& L, const config::TrainingArgs& a,
                               bool mixed) {
  const std::vector<MemoryEstimate> all =
      estimate_memory_per_rank(spec, L, a, mixed ? Precision::Bf16 : Precision::Fp32, L.sharding);
  return *std::max_element(all.begin(), all.end(), [](const MemoryEstimate& x, const MemoryEstimate& y) {
    return x.total_bytes() < y.total_bytes();
  });
}

uint64_t host_available_bytes() {
  uint64_t avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") avail = kb * 1024;
  }
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (cg >> limit && limit != "max") {
    const uint64_t l = std::strtoull(limit.c_str(), nullptr, 10);
    if (l > 0 && (avail == 0 || l < avail)) avail = l;
  }
  return avail;
}

void check_memory(const MemoryEstimate& e, int ranks_here, uint64_t available, const std::string& where) {
  if (available == 0) return;
  const double need = e.total_bytes() * std::max(1, ranks_here);
  if (need <= double(available)) return;
  fail("this run needs about {} of memory but {} has {} free: {} per rank ({}), {} rank(s) here. Make the model or "
       "the batch smaller (num_layers, hidden_size, ffn_hidden_size, vocab_size; micro_batch_size, seq_length), split "
       "it over more ranks (tensor_model_parallel_size, pipeline_model_parallel_size, use_distributed_optimizer), or "
       "save activations (recompute_granularity: full)",
       gib(need), where, gib(double(available)), gib(e.total_bytes()), e.describe(), ranks_here);
}

}  // namespace primus::plan
