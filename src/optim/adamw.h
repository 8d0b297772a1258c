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
  // The precision-aware optimizer (Megatron's use_precision_aware_optimizer with exp_avg_dtype,
  // exp_avg_sq_dtype and main_params_dtype; Transformer Engine's FusedAdam; docs/optim.md): each
  // moment stored as DType::F32, BF16, F16 or F8E4M3. The update is computed in fp32 from the stored
  // values, and the parameter's update uses the fp32 moments before they are stored (as TE's kernel
  // does). A bf16 moment is rounded to nearest even; an fp16 or E4M3 one is stored as TE stores it,
  // with one fp32 scale per segment recomputed from the segment's amax after every update
  // (kernels/adam_state.h).
  DType exp_avg_dtype = DType::F32;
  DType exp_avg_sq_dtype = DType::F32;
  // The parameters (main_params_dtype): F32; BF16 (ours: MaxText's weight_dtype: bfloat16): each
  // updated parameter rounded to bf16 (nearest even) where it is stored, no fp32 master; F16 (TE's
  // fp16 master weights): each step reads the master as the parameter stored in fp16 with its
  // segment's scale from the amax of the parameters it starts from, and stores the fp32 update (the
  // values TE's master is quantized from, and the bf16 working copy rounded from).
  DType main_params_dtype = DType::F32;
};

// The bytes AdamW keeps per parameter for its two moments (8 in fp32, 4 with both in bf16, 2 in
// E4M3), and for an optimizer of `numel` elements over `segments` segments (each scaled moment
// keeps one fp32 scale per segment).
int64_t adamw_state_bytes_per_param(const AdamWOptions& o);
int64_t adamw_state_bytes(const AdamWOptions& o, int64_t numel, int64_t segments);
// Whether a moment dtype keeps a per-segment scale (F16, F8E4M3).
bool scaled_state(DType d);

// A scaled moment's segment as a checkpoint load stores it (TE's set_scaled_state): the scale
// recomputed from the values' amax, the codes (fp16 bits or E4M3 bytes) written to `codes`; returns
// the dequantizing factor. When the values are exactly those of a stored state whose dequantizing
// factor this recomputation moves by a few ulps (E4M3's 1 / (1 / s) does for some scales), that
// factor is kept instead, so that a saved state loads back bit for bit.
float load_scaled_state(DType d, const float* values, int64_t n, void* codes);
// The fp32 values of a scaled moment's segment: code value times the dequantizing factor.
void read_scaled_state(DType d, const void* codes, int64_t n, float dequant, float* out);

// Decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW and Megatron's fused Adam:
//   t += 1;  p -= lr * wd * p   (decayed segments only)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State (m, v) is stored as AdamWOptions says and covers the `numel` elements the optimizer was
// built for.
class AdamW {
 public:
  AdamW(AdamWOptions options, int64_t numel);

  // One update of params[seg] for every segment. Segments must lie inside [0, numel) and not
  // overlap; elements outside every segment (padding) are left untouched. working (optional, the
  // params' layout): each updated param rounded to bf16 there too, in the same pass (bf16 mixed
  // precision's working copy; nothing between segments is written). A scaled state (fp16 or E4M3
  // moments) keeps a scale per segment: every step (and set_state) must then name the same
  // segments, in the same order.
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
  // for fp32 moments only; moment() copies any dtype out as fp32 (a bf16 value is exact in fp32, a
  // scaled one is its code's value times its segment's scale; 0 outside the segments).
  const float* exp_avg() const { return m_.data<float>(); }
  const float* exp_avg_sq() const { return v_.data<float>(); }
  float* exp_avg() { return m_.data<float>(); }
  float* exp_avg_sq() { return v_.data<float>(); }
  void moment(bool second, int64_t begin, int64_t n, float* out) const;  // elements [begin, begin + n)
  bool moment_is_fp32(bool second) const { return (second ? v_ : m_).dtype() == DType::F32; }
  // Restores a saved state; both arrays hold numel() fp32 elements (rounded to nearest even when a
  // moment is stored in bf16, stored as a load does when it is scaled: load_scaled_state per
  // segment, and then `segments` are needed); both null: only the step count.
  void set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq,
                 const std::vector<ParamSegment>* segments = nullptr);

 private:
  class SegmentStep;
  // A scaled moment's dequantizing factors, one per segment (in the segments' order).
  struct SegmentScale {
    int64_t offset = 0, numel = 0;
    float m = 1.0f, v = 1.0f;  // TE's initial scale: 1 (the state is zeros)
  };
  bool any_scaled() const { return scaled_state(m_.dtype()) || scaled_state(v_.dtype()); }
  void bind_segments(const std::vector<ParamSegment>& segments, const char* what);
  AdamWOptions options_;
  int64_t numel_;
  int64_t step_ = 0;
  Tensor m_, v_;                      // 64-byte aligned storage, in the moments' dtypes
  std::vector<SegmentScale> scales_;  // scaled moments only
};

}  // namespace primus
