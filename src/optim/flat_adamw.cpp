#include "optim/flat_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "optim/grad_clip.h"

#ifdef PRIMUS_HAVE_CUDA
#include "kernels/cuda/fused.h"
#include "kernels/cuda/runtime.h"
#endif

namespace primus {

#ifdef PRIMUS_HAVE_CUDA
struct FlatAdamW::DeviceState {
  Tensor m, v;       // the moments on the GPU (in AdamWOptions' dtypes)
  Tensor table;      // the segments as cuda::AdamWChunk, on the GPU
  // Scaled moments (fp16, E4M3): per chunk (the segments that are not empty, in order) the
  // dequantizing factors of exp_avg and exp_avg_sq, on the GPU (cuda::AdamWParams::state_scales).
  Tensor scales;
  std::vector<ParamSegment> chunks;  // the host's copy of the table
  Tensor norm_out;   // one double
  // The table of the tensors grad_sq_sum was last asked for (the trainer asks for the same set
  // every step): built and uploaded again only when the set changes.
  std::vector<int> norm_ids;
  Tensor norm_table;
  int norm_chunks = 0;
};

static Tensor chunk_table(const std::vector<ParamSegment>& segs, const std::vector<int>* only) {
  std::vector<cuda::AdamWChunk> chunks;
  auto add = [&](const ParamSegment& s) {
    if (s.numel > 0) chunks.push_back({s.offset, s.numel, s.weight_decay ? 1 : 0, 0});
  };
  if (only)
    for (int t : *only) add(segs.at(size_t(t)));
  else
    for (const auto& s : segs) add(s);
  const int64_t words = int64_t(chunks.size() * sizeof(cuda::AdamWChunk) / sizeof(int32_t));
  Tensor host = Tensor::empty({std::max<int64_t>(words, 1)}, DType::I32);
  std::memcpy(host.raw(), chunks.data(), chunks.size() * sizeof(cuda::AdamWChunk));
  return host.to(Device::CUDA);
}

static cuda::StateStorage storage_of(DType d) {
  switch (d) {
    case DType::BF16: return cuda::StateStorage::BF16;
    case DType::F16: return cuda::StateStorage::F16;
    case DType::F8E4M3: return cuda::StateStorage::E4M3;
    default: return cuda::StateStorage::F32;
  }
}
#else
struct FlatAdamW::DeviceState {};
#endif

FlatAdamW::FlatAdamW(AdamWOptions options, std::vector<ParamSegment> segments, int64_t numel, Device device)
    : options_(options), segments_(std::move(segments)), numel_(numel), device_(device) {
  host_ = std::make_unique<AdamW>(options_, device == Device::CPU ? numel : 0);  // validates the options
  if (options_.decay_norms_and_biases)  // the device table reads the segments' flags
    for (auto& seg : segments_) seg.weight_decay = true;
  for (const auto& s : segments_)
    if (s.offset < 0 || s.numel < 0 || s.offset + s.numel > numel_)
      fail("FlatAdamW: segment '{}' [{}, {}) lies outside the {} elements", s.name, s.offset, s.offset + s.numel,
           numel_);
  if (device == Device::CPU) return;
#ifdef PRIMUS_HAVE_CUDA
  dev_ = std::make_unique<DeviceState>();
  dev_->m = Tensor::zeros({std::max<int64_t>(numel, 1)}, options_.exp_avg_dtype, Device::CUDA);
  dev_->v = Tensor::zeros({std::max<int64_t>(numel, 1)}, options_.exp_avg_sq_dtype, Device::CUDA);
  dev_->table = chunk_table(segments_, nullptr);
  for (const auto& s : segments_)
    if (s.numel > 0) dev_->chunks.push_back(s);
  if (scaled_state(options_.exp_avg_dtype) || scaled_state(options_.exp_avg_sq_dtype)) {
    Tensor ones = Tensor::empty({std::max<int64_t>(2 * int64_t(dev_->chunks.size()), 1)});
    std::fill(ones.data<float>(), ones.data<float>() + ones.numel(), 1.0f);  // TE's initial scale (zero state)
    dev_->scales = ones.to(Device::CUDA);
  }
  dev_->norm_out = Tensor::zeros({1}, DType::F64, Device::CUDA);
#else
  fail("FlatAdamW on {} needs the CUDA backend, which this build lacks", device_name(device));
#endif
}

FlatAdamW::~FlatAdamW() = default;

double FlatAdamW::grad_sq_sum(const Tensor& grads, const std::vector<int>& tensors) const {
  PRIMUS_CHECK(grads.device() == device_ && grads.numel() >= numel_, "gradients on {} of {} elements",
               device_name(grads.device()), grads.numel());
  return grad_sq_sum(grads.data<float>(), tensors);
}

double FlatAdamW::grad_sq_sum(const float* grads, const std::vector<int>& tensors) const {
  if (device_ == Device::CPU) {
    double sq = 0;
    for (int t : tensors) sq += primus::grad_sq_sum(grads + segments_.at(size_t(t)).offset, segments_.at(size_t(t)).numel);
    return sq;
  }
#ifdef PRIMUS_HAVE_CUDA
  if (tensors.empty()) return 0;
  if (!dev_->norm_table.defined() || tensors != dev_->norm_ids) {
    dev_->norm_table = chunk_table(segments_, &tensors);
    dev_->norm_ids = tensors;
    dev_->norm_chunks = 0;
    for (int t : tensors) dev_->norm_chunks += segments_.at(size_t(t)).numel > 0;
  }
  if (dev_->norm_chunks == 0) return 0;
  cuda::sum_squares(grads, static_cast<const cuda::AdamWChunk*>(dev_->norm_table.raw()), dev_->norm_chunks,
                    dev_->norm_out.data<double>(), cuda::stream());
  double out = 0;
  cuda::copy_to_host(&out, dev_->norm_out.raw(), sizeof(double));
  return out;
#else
  return 0;
#endif
}

void FlatAdamW::step(const Tensor& values, const Tensor& grads, Tensor* working, double lr, double grad_scale) {
  PRIMUS_CHECK(values.device() == device_ && grads.device() == device_, "optimizer buffers on another device");
  PRIMUS_CHECK(values.numel() >= numel_ && grads.numel() >= numel_, "optimizer buffers of {} and {} elements for {}",
               values.numel(), grads.numel(), numel_);
  step(values.data<float>(), const_cast<float*>(grads.data<float>()), working ? working->data<bf16>() : nullptr, lr,
       grad_scale);
}

void FlatAdamW::step(float* values, float* grads, bf16* working, double lr, double grad_scale) {
  if (!std::isfinite(lr) || lr < 0) fail("AdamW step: learning rate must be a non-negative number, got {}", lr);
  if (device_ == Device::CPU) {
    // The gradients' scaling and the working copy in the update's own pass (every segment,
    // nothing between segments, as the fused GPU step writes the working copy).
    host_->step(values, grads, segments_, lr, working, grad_scale);
    step_ = host_->step_count();
    return;
  }
#ifdef PRIMUS_HAVE_CUDA
  ++step_;
  cuda::AdamWParams p;
  p.lr = lr;
  p.beta1 = options_.beta1;
  p.beta2 = options_.beta2;
  p.eps = options_.eps;
  p.weight_decay = options_.weight_decay;
  p.step = step_;
  p.grad_scale = grad_scale;
  p.exp_avg = storage_of(options_.exp_avg_dtype);
  p.exp_avg_sq = storage_of(options_.exp_avg_sq_dtype);
  p.params = options_.main_params_dtype == DType::BF16  ? cuda::ParamStorage::BF16
             : options_.main_params_dtype == DType::F16 ? cuda::ParamStorage::F16Master
                                                        : cuda::ParamStorage::F32;
  p.state_scales = dev_->scales.defined() ? dev_->scales.data<float>() : nullptr;
  cuda::adamw_step(values, grads, dev_->m.raw(), dev_->v.raw(), reinterpret_cast<cuda::bf16*>(working),
                   static_cast<const cuda::AdamWChunk*>(dev_->table.raw()), int(dev_->chunks.size()), p,
                   cuda::stream());
#endif
}

int64_t FlatAdamW::state_bytes() const {
  int64_t segments = 0;
  for (const auto& s : segments_) segments += s.numel > 0;
  return adamw_state_bytes(options_, numel_, segments);
}

void FlatAdamW::set_weight_decay(double wd) {
  if (!(wd >= 0) || !std::isfinite(wd)) fail("weight_decay must be a non-negative number, got {}", wd);
  options_.weight_decay = wd;
  host_->set_weight_decay(wd);
}

// One moment as a host vector: the host optimizer's, or a copy of the device's.
std::vector<float> FlatAdamW::moment(bool second) const {
  std::vector<float> out(static_cast<size_t>(numel_));
  copy_moment(second, 0, numel_, out.data());
  return out;
}

// Elements [begin, begin + n) of a moment as fp32 (a bf16 moment's values exactly).
void FlatAdamW::copy_moment(bool second, int64_t begin, int64_t n, float* out) const {
  if (n == 0) return;
  if (device_ == Device::CPU) {
    host_->moment(second, begin, n, out);
    return;
  }
#ifdef PRIMUS_HAVE_CUDA
  const Tensor& t = second ? dev_->v : dev_->m;
  const size_t es = dtype_size(t.dtype());
  if (t.dtype() == DType::F32) {
    cuda::copy_to_host(out, static_cast<const char*>(t.raw()) + begin * es, es * size_t(n));
    return;
  }
  std::vector<char> staged(es * size_t(n));
  cuda::copy_to_host(staged.data(), static_cast<const char*>(t.raw()) + begin * es, es * size_t(n));
  if (t.dtype() == DType::BF16) {
    const bf16* b = reinterpret_cast<const bf16*>(staged.data());
    for (int64_t i = 0; i < n; ++i) out[i] = b[i].to_float();
    return;
  }
  // Scaled: each chunk's codes times its dequantizing factor; zeros outside the chunks.
  const Tensor scales = dev_->scales.to(Device::CPU);
  std::fill(out, out + n, 0.0f);
  for (size_t k = 0; k < dev_->chunks.size(); ++k) {
    const ParamSegment& s = dev_->chunks[k];
    const int64_t lo = std::max(begin, s.offset), hi = std::min(begin + n, s.offset + s.numel);
    if (lo < hi)
      read_scaled_state(t.dtype(), staged.data() + size_t(lo - begin) * es, hi - lo,
                        scales.data<float>()[2 * k + (second ? 1 : 0)], out + (lo - begin));
  }
#endif
}

const float* FlatAdamW::moment_range(bool second, int64_t begin, int64_t n,
                                     std::vector<std::vector<float>>& copies) const {
  if (begin < 0 || n < 0 || begin + n > numel_)
    fail("FlatAdamW::moment_range: [{}, +{}) outside the {} elements", begin, n, numel_);
  if (device_ == Device::CPU && host_->moment_is_fp32(second))
    return (second ? host_->exp_avg_sq() : host_->exp_avg()) + begin;
  std::vector<float>& out = copies.emplace_back(size_t(n));
  copy_moment(second, begin, n, out.data());
  return out.data();
}

float* FlatAdamW::host_moment(bool second) {
  if (device_ != Device::CPU || !host_->moment_is_fp32(second)) return nullptr;  // bf16: through set_state
  return second ? host_->exp_avg_sq() : host_->exp_avg();
}

void FlatAdamW::set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq) {
  if (step_count < 0) fail("FlatAdamW::set_state: step count must be non-negative, got {}", step_count);
  step_ = step_count;
  if (!exp_avg && !exp_avg_sq) {
    if (device_ == Device::CPU) host_->set_state(step_count, nullptr, nullptr);
    return;
  }
  if (device_ == Device::CPU) {
    host_->set_state(step_count, exp_avg, exp_avg_sq, &segments_);
    return;
  }
#ifdef PRIMUS_HAVE_CUDA
  if (numel_ == 0) return;
  Tensor scales = dev_->scales.defined() ? dev_->scales.to(Device::CPU) : Tensor();
  for (int which = 0; which < 2; ++which) {
    Tensor& t = which == 0 ? dev_->m : dev_->v;
    const float* src = which == 0 ? exp_avg : exp_avg_sq;
    if (!src) continue;  // loaded in place
    if (t.dtype() == DType::F32) {
      cuda::copy_to_device(t.raw(), src, sizeof(float) * numel_);
      continue;
    }
    const size_t es = dtype_size(t.dtype());
    std::vector<char> staged(es * size_t(numel_), 0);  // as the step stores them
    if (t.dtype() == DType::BF16) {
      bf16* b = reinterpret_cast<bf16*>(staged.data());
      for (int64_t i = 0; i < numel_; ++i) b[i] = bf16::from_float(src[i]);  // rounded to nearest even
    } else {
      for (size_t k = 0; k < dev_->chunks.size(); ++k) {
        const ParamSegment& s = dev_->chunks[k];
        scales.data<float>()[2 * k + size_t(which)] = load_scaled_state(t.dtype(), src + s.offset, s.numel,
                                                                        staged.data() + size_t(s.offset) * es);
      }
    }
    cuda::copy_to_device(t.raw(), staged.data(), staged.size());
  }
  if (scales.defined()) dev_->scales.copy_from(scales);
#endif
}

}  // namespace primus
