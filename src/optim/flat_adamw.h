// AdamW and the squared gradient norm over the flat fp32 buffers of a ParamStore, wherever they
// live: on the CPU the loops of adamw.cpp and grad_clip.cpp, on a GPU one fused kernel each
// (kernels/cuda/fused.h) that also refreshes the model's bf16 working weights. The bf16
// mixed-precision trainer uses it; the arithmetic is the same on both devices.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "optim/adamw.h"

namespace primus {

class FlatAdamW {
 public:
  // segments: every tensor of the buffers (ParamStore order); numel: the buffers' length.
  FlatAdamW(AdamWOptions options, std::vector<ParamSegment> segments, int64_t numel, Device device);
  ~FlatAdamW();
  FlatAdamW(const FlatAdamW&) = delete;
  FlatAdamW& operator=(const FlatAdamW&) = delete;

  // Sum of squares of the gradients of the tensors listed (indices into segments), in double.
  double grad_sq_sum(const Tensor& grads, const std::vector<int>& tensors) const;
  double grad_sq_sum(const float* grads, const std::vector<int>& tensors) const;  // numel elements on device()

  // One step on every segment: gradients times grad_scale (the clipping factor; on the host the
  // segments' gradients are scaled in place, in the update's pass), then AdamW. When working is
  // given (bf16, laid out like values), each segment of it receives bf16(updated values); what
  // lies between segments (the ParamStore's alignment padding) is left as it is, on both devices.
  void step(const Tensor& values, const Tensor& grads, Tensor* working, double lr, double grad_scale = 1.0);
  // The same on buffers of numel elements on device() (a shard of larger buffers).
  void step(float* values, float* grads, bf16* working, double lr, double grad_scale = 1.0);

  void set_weight_decay(double wd);

  int64_t step_count() const { return step_; }
  Device device() const { return device_; }
  const AdamWOptions& options() const { return options_; }
  // Checkpointing: the moments as host fp32 vectors of numel elements (a bf16, fp16 or fp8 moment's
  // values exactly), and their restore (rounded to nearest even into a bf16 moment, stored with each
  // segment's recomputed scale into an fp16 or fp8 one: AdamW::set_state).
  std::vector<float> exp_avg() const { return moment(false); }
  std::vector<float> exp_avg_sq() const { return moment(true); }
  // exp_avg and exp_avg_sq both null: only the step count (the moments were written in place,
  // through host_moment).
  void set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq);
  int64_t numel() const { return numel_; }
  // The bytes of the state: the moments, and a scaled moment's scale per segment that is not empty.
  int64_t state_bytes() const;
  // Checkpoint loads: the moment's own host memory (numel elements) to read into; nullptr when
  // it is not host fp32 (on a GPU): then set_state from a host copy.
  float* host_moment(bool second);
  // Checkpoint writers: a host pointer to elements [begin, begin + n) of a moment, the optimizer's
  // own memory on the CPU (fp32 moments), or a copy appended to `copies` (a GPU's, or moments not in fp32).
  const float* moment_range(bool second, int64_t begin, int64_t n, std::vector<std::vector<float>>& copies) const;

 private:
  struct DeviceState;
  std::vector<float> moment(bool second) const;
  void copy_moment(bool second, int64_t begin, int64_t n, float* out) const;
  AdamWOptions options_;
  std::vector<ParamSegment> segments_;
  int64_t numel_;
  Device device_;
  int64_t step_ = 0;
  std::unique_ptr<AdamW> host_;         // Device::CPU
  std::unique_ptr<DeviceState> dev_;    // Device::CUDA: moments and the segment table
};

}  // namespace primus
