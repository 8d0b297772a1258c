#include "parallel/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/device.h"
#include "core/error.h"
#include "optim/grad_clip.h"

namespace primus::parallel {

DistributedOptimizer::DistributedOptimizer(GradBuckets& buckets, float* params,
                                           AdamWOptions options)
    : buckets_(buckets), params_(params), options_(options) {
  if (buckets_.options().reduce != GradReduce::ReduceScatter)
    fail("DistributedOptimizer: the gradient buckets must reduce-scatter (GradReduce::ReduceScatter), "
         "not {}: each rank updates only its shard",
         grad_reduce_name(buckets_.options().reduce));
  if (!params_ && buckets_.buffer_numel() > 0)
    fail("DistributedOptimizer: the parameter buffer is null");
  AdamW check(options_, 0);  // validates the options even when there is no bucket
  (void)check;
  const auto& tensors = buckets_.tensors();
  for (const auto& b : buckets_.buckets()) {
    std::vector<ParamSegment> bucket_tensors(tensors.begin() + b.first_tensor,
                                             tensors.begin() + b.last_tensor + 1);
    std::vector<ParamSegment> shard = shard_segments(bucket_tensors, b.shard_begin, b.shard_end);
    // shard_segments keeps, in order, the tensors that intersect the shard: the same filter
    // gives the tensor index of each segment (for the norm's TensorFilter).
    std::vector<int> idx;
    for (int t = b.first_tensor; t <= b.last_tensor; ++t) {
      const auto& s = tensors[static_cast<size_t>(t)];
      if (std::max(b.shard_begin, s.offset) < std::min(b.shard_end, s.offset + s.numel))
        idx.push_back(t);
    }
    PRIMUS_CHECK(idx.size() == shard.size(), "{} segments for {} tensors", shard.size(), idx.size());
    segment_tensor_.push_back(std::move(idx));
    adams_.push_back(std::make_unique<FlatAdamW>(options_, std::move(shard), b.shard_end - b.shard_begin, device()));
  }
}

int64_t DistributedOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& a : adams_) bytes += a->state_bytes();
  return bytes;
}

int64_t DistributedOptimizer::shard_numel() const {
  int64_t n = 0;
  for (const auto& b : buckets_.buckets()) n += b.shard_end - b.shard_begin;
  return n;
}

void DistributedOptimizer::set_weight_decay(double wd) {
  if (!(wd >= 0) || !std::isfinite(wd)) fail("weight_decay must be a non-negative number, got {}", wd);
  options_.weight_decay = wd;
  for (auto& a : adams_) a->set_weight_decay(wd);
}

double DistributedOptimizer::local_grad_sq_sum(const TensorFilter& counted) const {
  if (!buckets_.finished())
    fail("DistributedOptimizer: gradient norm asked before the gradients were reduced; call "
         "GradBuckets::finish() first");
  double sum = 0.0;
  const auto& bks = buckets_.buckets();
  for (size_t b = 0; b < bks.size(); ++b) {
    std::vector<int> segs;  // the shard's segments whose tensor counts
    for (size_t k = 0; k < segment_tensor_[b].size(); ++k)
      if (!counted || counted(segment_tensor_[b][k])) segs.push_back(int(k));
    sum += adams_[b]->grad_sq_sum(grads() + bks[b].shard_begin, segs);
  }
  return sum;
}

double DistributedOptimizer::grad_norm(ProcessGroup* model_parallel, const TensorFilter& counted) {
  double sq = buckets_.group().all_reduce_value(local_grad_sq_sum(counted));
  if (model_parallel) sq = model_parallel->all_reduce_value(sq);
  return std::sqrt(sq);
}

void DistributedOptimizer::scale_grads(double factor) {
  if (!buckets_.finished())
    fail("DistributedOptimizer::scale_grads before GradBuckets::finish(): the shards are not reduced yet");
  if (device() != Device::CPU)
    fail("DistributedOptimizer::scale_grads on {} buffers: pass the factor to step() instead", device_name(device()));
  for (const auto& b : buckets_.buckets())
    primus::scale_grads(buckets_.grads() + b.shard_begin, b.shard_end - b.shard_begin, factor);
}

double DistributedOptimizer::clip_grad_norm(double max_norm, ProcessGroup* model_parallel,
                                            const TensorFilter& counted) {
  const double norm = grad_norm(model_parallel, counted);
  const double c = clip_coefficient(norm, max_norm);
  if (c < 1.0) scale_grads(c);
  return norm;
}

void DistributedOptimizer::step(double lr, double grad_scale) {
  if (!buckets_.finished())
    fail("DistributedOptimizer::step before GradBuckets::finish(): the gradient shards are not "
         "reduced yet");
  const auto& bks = buckets_.buckets();
  // Update first (AdamW checks lr before touching anything), then all-gather.
  for (size_t b = 0; b < bks.size(); ++b)
    adams_[b]->step(params_ + bks[b].shard_begin, grads() + bks[b].shard_begin, nullptr, lr, grad_scale);
  ++step_;

  // The parameter all-gather. MPI forbids a send buffer inside the receive buffer, so the
  // rank's updated shard is copied into the bucket's shard receive buffer (free since finish())
  // and sent from there; a staged bucket is received into its staging buffer and copied back,
  // so that no padding lands on another bucket's parameters.
  ProcessGroup& dp = buckets_.group();
  if (dp.size() == 1) return;  // the one rank updated the whole buffer in place
  const Device dev = device();
  std::vector<WorkPtr> works(bks.size());
  for (size_t b = 0; b < bks.size(); ++b) {
    const GradBucket& bk = bks[b];
    float* send = buckets_.shard_recv_[b].data<float>();
    const int64_t mine = bk.shard_end - bk.shard_begin;
    device_copy(dev, send, params_ + bk.shard_begin, sizeof(float) * static_cast<size_t>(mine));
    device_zero(dev, send + mine, sizeof(float) * static_cast<size_t>(bk.shard_numel - mine));
    float* recv = bk.staged ? buckets_.staging_[b].data<float>() : params_ + bk.begin;
    works[b] = dp.iall_gather(send, recv, bk.shard_numel, CommType::F32);
  }
  for (size_t b = 0; b < bks.size(); ++b) {
    works[b]->wait();
    const GradBucket& bk = bks[b];
    if (bk.staged)
      device_copy(dev, params_ + bk.begin, buckets_.staging_[b].data<float>(),
                  sizeof(float) * static_cast<size_t>(bk.end - bk.begin));
  }
}

std::vector<DistributedOptimizer::Shard> DistributedOptimizer::shards() const {
  std::vector<Shard> out;
  const auto& bks = buckets_.buckets();
  for (size_t b = 0; b < bks.size(); ++b)
    out.push_back({bks[b].shard_begin, bks[b].shard_end - bks[b].shard_begin, adams_[b].get()});
  return out;
}

FullOptimizerState DistributedOptimizer::gather_state() const {
  FullOptimizerState out;
  out.step = step_;
  const int64_t n = buckets_.buffer_numel();
  out.exp_avg.assign(static_cast<size_t>(n), 0.0f);
  out.exp_avg_sq.assign(static_cast<size_t>(n), 0.0f);
  ProcessGroup& dp = buckets_.group();
  const auto& bks = buckets_.buckets();
  const auto& tensors = buckets_.tensors();
  for (size_t b = 0; b < bks.size(); ++b) {
    const GradBucket& bk = bks[b];
    const int64_t mine = bk.shard_end - bk.shard_begin;
    // Host staging, and the group's device for the collective (NCCL moves device memory only).
    Tensor send = Tensor::zeros({bk.shard_numel}), recv = Tensor::zeros({bk.padded_numel});
    for (int which = 0; which < 2; ++which) {
      const std::vector<float> state = which == 0 ? adams_[b]->exp_avg() : adams_[b]->exp_avg_sq();
      std::copy(state.begin(), state.begin() + mine, send.data<float>());
      if (dp.device() == Device::CPU) {
        dp.all_gather(send.data<float>(), recv.data<float>(), bk.shard_numel, CommType::F32);
      } else {
        const Tensor send_dev = send.to(dp.device());
        Tensor recv_dev = Tensor::empty({bk.padded_numel}, DType::F32, dp.device());
        dp.all_gather(send_dev.raw(), recv_dev.raw(), bk.shard_numel, CommType::F32);
        recv.copy_from(recv_dev);
      }
      // Tensor elements only: gaps and padding stay 0 in the full state.
      auto& dst = which == 0 ? out.exp_avg : out.exp_avg_sq;
      const float* r = recv.data<float>();
      for (int t = bk.first_tensor; t <= bk.last_tensor; ++t) {
        const auto& s = tensors[static_cast<size_t>(t)];
        std::copy(r + (s.offset - bk.begin), r + (s.offset - bk.begin + s.numel), dst.begin() + s.offset);
      }
    }
  }
  return out;
}

void DistributedOptimizer::load_state(int64_t step, const float* exp_avg, const float* exp_avg_sq,
                                      int64_t numel) {
  if (numel != buckets_.buffer_numel())
    fail("DistributedOptimizer::load_state: the saved optimizer state has {} elements but the "
         "parameter buffer has {}",
         numel, buckets_.buffer_numel());
  if (step < 0) fail("DistributedOptimizer::load_state: negative step count {}", step);
  const bool in_place = !exp_avg && !exp_avg_sq;  // only the step count: the moments were loaded in place
  if (numel > 0 && !in_place && (!exp_avg || !exp_avg_sq))
    fail("DistributedOptimizer::load_state: null exp_avg or exp_avg_sq");
  const auto& bks = buckets_.buckets();
  for (size_t b = 0; b < bks.size(); ++b)
    adams_[b]->set_state(step, in_place ? nullptr : exp_avg + bks[b].shard_begin,
                         in_place ? nullptr : exp_avg_sq + bks[b].shard_begin);
  step_ = step;
}

void DistributedOptimizer::load_state(const FullOptimizerState& s) {
  if (s.exp_avg.size() != s.exp_avg_sq.size())
    fail("DistributedOptimizer::load_state: exp_avg has {} elements but exp_avg_sq {}",
         s.exp_avg.size(), s.exp_avg_sq.size());
  load_state(s.step, s.exp_avg.data(), s.exp_avg_sq.data(), static_cast<int64_t>(s.exp_avg.size()));
}

}  // namespace primus::parallel
