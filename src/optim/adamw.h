// AdamW over flat fp32 buffers. The model keeps every parameter in one contiguous buffer and
// every gradient in another; a ParamSegment names a tensor's slice of them. A distributed
// optimizer builds one AdamW per shard and passes shard_segments() of the full list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace primus {

struct ParamSegment {
  std::string name;
  int64_t offset = 0;  // in elements, into the buffer step() receives
  int64_t numel = 0;
  bool weight_decay = true;  // Megatron skips decay on biases and norm weights
};

// The segments that fall inside [begin, end) of the full buffer, clipped to it and re-based so
// that offset 0 is `begin` (for a rank that owns that shard of the flat buffer).
std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segments, int64_t begin,
                                         int64_t end);

// Megatron's names: adam_beta1, adam_beta2, adam_eps, weight_decay.
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // Decay every segment, its weight_decay flag aside (torchtitan's and MaxText's AdamW).
  bool decay_norms_and_biases = false;
};

// Decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW and Megatron's fused Adam:
//   t += 1;  p -= lr * wd * p   (decayed segments only)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State (m, v) is fp32 and covers the `numel` elements the optimizer was built for.
class AdamW {
 public:
  AdamW(AdamWOptions options, int64_t numel);

  // One update of params[seg] for every segment. Segments must lie inside [0, numel) and not
  // overlap; elements outside every segment (padding) are left untouched.
  void step(float* params, const float* grads, const std::vector<ParamSegment>& segments, double lr);

  const AdamWOptions& options() const { return options_; }
  void set_weight_decay(double wd) { options_.weight_decay = wd; }  // for a wd schedule
  int64_t numel() const { return numel_; }
  int64_t step_count() const { return step_; }

  // Checkpointing: the moments and the step count that drives bias correction.
  const float* exp_avg() const { return m_.data<float>(); }
  const float* exp_avg_sq() const { return v_.data<float>(); }
  float* exp_avg() { return m_.data<float>(); }
  float* exp_avg_sq() { return v_.data<float>(); }
  // Restores a saved state; both arrays hold numel() elements (both null: only the step count).
  void set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq);

 private:
  AdamWOptions options_;
  int64_t numel_;
  int64_t step_ = 0;
  Tensor m_, v_;  // 64-byte aligned fp32 storage
};

}  // namespace primus
