// The distributed optimizer (Megatron's use_distributed_optimizer, ZeRO stage 1): the AdamW
// state is split over the data-parallel ranks instead of replicated.
//
// Sharding scheme (Megatron's): the shards are the ones GradBuckets' reduce-scatter produces.
// Every bucket is split dp ways, and rank r owns shard r of every bucket (see data_parallel.h
// for the exact ranges). A rank's shard is therefore one range per bucket, not one range of the
// whole buffer: that is what lets each bucket's reduce-scatter start during the backward. For
// each bucket the rank keeps one AdamW over its range (exp_avg and exp_avg_sq in AdamWOptions' dtypes), driven
// with shard_segments() so that weight decay follows the tensors a range cuts through.
//
// A step: GradBuckets::finish() (reduce-scatter: the rank's ranges hold the summed gradients);
// optionally clip_grad_norm(); step(lr) updates the rank's ranges of the parameters and
// all-gathers every bucket, so every rank ends with the full updated buffer. AdamW is
// elementwise, so the result is exactly one AdamW over the whole buffer given the same summed
// gradients.
//
// The buffers live on the dp group's device: host memory with MPI, GPU memory with NCCL (each
// shard's AdamW is then the fused GPU kernel of FlatAdamW).
//
// Memory per parameter (fp32 everywhere): plain DP keeps params 4 + grads 4 + exp_avg 4 +
// exp_avg_sq 4 = 16 bytes on every rank; here params 4 + grads 4 + 8/dp of state + 4/dp of
// shard receive buffer (reused as the all-gather send buffer), plus a staging copy for buckets
// whose size is not a multiple of dp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "parallel/data_parallel.h"

namespace primus::parallel {

// The full (unsharded) optimizer state, laid out like the flat parameter buffer. Elements
// outside every tensor (alignment gaps) are 0.
struct FullOptimizerState {
  int64_t step = 0;
  std::vector<float> exp_avg, exp_avg_sq;
};

class DistributedOptimizer {
 public:
  // buckets: built over the same flat layout as params, in GradReduce::ReduceScatter mode; it
  // supplies the dp group, the tensor list (with weight_decay flags) and the shard ranges.
  // params: the flat parameter buffer (buckets.buffer_numel() elements, on the dp group's
  // device), identical on every dp rank at the start (same seed). Both must outlive this object.
  // Throws primus::Error on a wrong mode or bad options.
  DistributedOptimizer(GradBuckets& buckets, float* params, AdamWOptions options);

  // Which tensors the gradient norm counts: e.g. under tensor parallelism a tensor every tp
  // rank holds whole (StoredParam::tp_replicated) is counted on tp rank 0 only, as Megatron does.
  using TensorFilter = std::function<bool(int tensor)>;

  // Sum of squares of this rank's reduced gradient shards (tensor elements only, never gaps or
  // padding), in double. Sum it over dp (and over the model-parallel group) for the global norm.
  double local_grad_sq_sum(const TensorFilter& counted = {}) const;
  // The global L2 norm: local_grad_sq_sum all-reduced over dp, then over model_parallel if given.
  double grad_norm(ProcessGroup* model_parallel = nullptr, const TensorFilter& counted = {});
  // Scales this rank's gradient shards in place (the only gradients step() reads). Host buffers
  // only: on a device, pass the factor to step() instead.
  void scale_grads(double factor);
  // grad_norm, then scales the shards by clip_coefficient(norm, max_norm) (optim/grad_clip.h);
  // returns the norm before clipping. max_norm <= 0 only measures. Host buffers only, as above.
  double clip_grad_norm(double max_norm, ProcessGroup* model_parallel = nullptr,
                        const TensorFilter& counted = {});

  // AdamW on this rank's shards (gradients times grad_scale first: the clipping factor), then the
  // parameter all-gather (blocking: on return every rank holds the full updated buffer).
  // Requires buckets.finished().
  void step(double lr, double grad_scale = 1.0);

  // Checkpointing. gather_state: every dp rank receives the full exp_avg / exp_avg_sq (8 bytes
  // per parameter, transient), so that any rank, or a checkpoint writer of another layout, can
  // save it; collective over dp. load_state: full arrays of buffer_numel() elements (the same
  // on every rank, e.g. read from a checkpoint); each rank keeps its shards. Local, no messages,
  // so a state saved under one dp size or bucket size loads under another. Both arrays null:
  // only the step count (the shards' moments were loaded in place, FlatAdamW::host_moment).
  FullOptimizerState gather_state() const;
  void load_state(int64_t step, const float* exp_avg, const float* exp_avg_sq, int64_t numel);
  void load_state(const FullOptimizerState& s);

  // Checkpoint writers: this rank's shards, per bucket the range of the flat buffer and the AdamW
  // whose state covers it (its element 0 at `begin`).
  struct Shard {
    int64_t begin = 0, numel = 0;
    FlatAdamW* adam = nullptr;
  };
  std::vector<Shard> shards() const;

  int64_t step_count() const { return step_; }
  const AdamWOptions& options() const { return options_; }
  void set_weight_decay(double wd);
  // Parameters this rank holds optimizer state for, and the bytes of that state.
  int64_t shard_numel() const;
  int64_t state_bytes() const;

 private:
  float* grads() const { return buckets_.grads(); }
  Device device() const { return buckets_.group().device(); }

  GradBuckets& buckets_;
  float* params_;
  AdamWOptions options_;
  std::vector<std::unique_ptr<FlatAdamW>> adams_;    // per bucket: over the rank's shard
  std::vector<std::vector<int>> segment_tensor_;     // per bucket: tensor index of each shard segment
  int64_t step_ = 0;
};

}  // namespace primus::parallel
