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
  // The precision-aware optimizer (Megatron's use_precision_aware_optimizer with exp_avg_dtype and
  // exp_avg_sq_dtype, Transformer Engine's FusedAdam): each moment stored as DType::F32 or
  // DType::BF16. The update is computed in fp32 from the stored values; a bf16 moment is rounded to
  // nearest even when it is stored, and the parameter's update uses the fp32 value before that
  // rounding (as TE's kernel does).
  DType exp_avg_dtype = DType::F32;
  DType exp_avg_sq_dtype = DType::F32;
  // Parameters kept in bf16 (main_params_dtype bf16; MaxText's weight_dtype: bfloat16): each
  // updated parameter is rounded to bf16 (nearest even) where it is stored.
  bool bf16_params = false;
};

// The bytes AdamW keeps per parameter for its two moments (8 in fp32, 4 with both in bf16).
int64_t adamw_state_bytes_per_param(const AdamWOptions& o);

// Decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW and Megatron's fused Adam:
//   t += 1;  p -= lr * wd * p   (decayed segments only)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State (m, v) is fp32 or bf16 (AdamWOptions) and covers the `numel` elements the optimizer was
// built for.
class AdamW {
 public:
  AdamW(AdamWOptions options, int64_t numel);

  // One update of params[seg] for every segment. Segments must lie inside [0, numel) and not
  // overlap; elements outside every segment (padding) are left untouched. working (optional, the
  // params' layout): each updated param rounded to bf16 there too, in the same pass (bf16 mixed
  // precision's working copy; nothing between segments is written).
  void step(float* params, const float* grads, const std::vector<ParamSegment>& segments, double lr,
            bf16* working = nullptr);
  // The same with the gradients times grad_scale (the clipping factor, as a float): each
  // segment's gradients are multiplied by it in place first, in that pass.
  void step(float* params, float* grads, const std::vector<ParamSegment>& segments, double lr, bf16* working,
            double grad_scale);

  const AdamWOptions& options() const { return options_; }
  void set_weight_decay(double wd) { options_.weight_decay = wd; }  // for a wd schedule
  int64_t numel() const { return numel_; }
  int64_t step_count() const { return step_; }

  // Checkpointing: the moments and the step count that drives bias correction. The pointers are
  // for fp32 moments only; moment() copies either dtype out as fp32 (a bf16 value is exact in fp32).
  const float* exp_avg() const { return m_.data<float>(); }
  const float* exp_avg_sq() const { return v_.data<float>(); }
  float* exp_avg() { return m_.data<float>(); }
  float* exp_avg_sq() { return v_.data<float>(); }
  void moment(bool second, int64_t begin, int64_t n, float* out) const;  // elements [begin, begin + n)
  bool moment_is_fp32(bool second) const { return (second ? v_ : m_).dtype() == DType::F32; }
  // Restores a saved state; both arrays hold numel() fp32 elements (rounded to nearest even when a
  // moment is stored in bf16); both null: only the step count.
  void set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq);

 private:
  AdamWOptions options_;
  int64_t numel_;
  int64_t step_ = 0;
  Tensor m_, v_;  // 64-byte aligned storage, fp32 or bf16
};

}  // namespace primus
