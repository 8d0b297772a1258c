#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace primus {
namespace {

inline float load_state(const float* x, int64_t i) { return x[i]; }
inline float load_state(const bf16* x, int64_t i) { return bf16_bits_to_float(x[i].bits); }
inline void store_state(float* x, int64_t i, float v) { x[i] = v; }
inline void store_state(bf16* x, int64_t i, float v) { x[i].bits = float_to_bf16_bits(v); }
template <bool kBf16>
inline float round_param(float p) {
  if constexpr (kBf16) return bf16_bits_to_float(float_to_bf16_bits(p));
  return p;
}

struct StepConsts {
  float b1, b2, one_minus_b1, one_minus_b2, step_size, inv_sqrt_bc2, eps, grad_scale;
  bool bf16_params;
};

// One segment's update; M and V are float or bf16 (the moments' storage), kBf16Params rounds the
// updated parameters to bf16, kWorking also writes them rounded to bf16 into w, kScaled multiplies
// the gradients by c.grad_scale first, in place (the clipping factor).
template <class M, class V, bool kBf16Params, bool kWorking, bool kScaled>
void update_segment(float* __restrict p, float* __restrict g, M* __restrict m, V* __restrict v, bf16* __restrict w,
                    int64_t n, float decay, const StepConsts c) {  // by value: no store through p can alias it
#pragma omp parallel for simd schedule(static) if (parallel : n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if constexpr (kScaled) g[i] = gi = gi * c.grad_scale;
    const float mi = c.b1 * load_state(m, i) + c.one_minus_b1 * gi;
    const float vi = c.b2 * load_state(v, i) + c.one_minus_b2 * gi * gi;
    store_state(m, i, mi);
    store_state(v, i, vi);
    const float pi = round_param<kBf16Params>(p[i] * decay -
                                              c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps));
    p[i] = pi;
    if constexpr (kWorking) store_state(w, i, pi);
  }
}

template <class M, class V, bool kBf16Params, bool kWorking>
void update_segment(float* p, float* g, M* m, V* v, bf16* w, int64_t n, float decay, const StepConsts& c) {
  if (c.grad_scale != 1.0f)
    update_segment<M, V, kBf16Params, kWorking, true>(p, g, m, v, w, n, decay, c);
  else
    update_segment<M, V, kBf16Params, kWorking, false>(p, g, m, v, w, n, decay, c);
}

template <class M, class V>
void update_segment(float* p, float* g, M* m, V* v, bf16* w, int64_t n, float decay, const StepConsts& c) {
  if (c.bf16_params)
    w ? update_segment<M, V, true, true>(p, g, m, v, w, n, decay, c)
      : update_segment<M, V, true, false>(p, g, m, v, w, n, decay, c);
  else
    w ? update_segment<M, V, false, true>(p, g, m, v, w, n, decay, c)
      : update_segment<M, V, false, false>(p, g, m, v, w, n, decay, c);
}

void check_state_dtype(const char* key, DType d) {
  if (d != DType::F32 && d != DType::BF16)
    fail("AdamW: {} {} is not built: the moments are stored in fp32 or bf16", key, dtype_name(d));
}

}  // namespace

int64_t adamw_state_bytes_per_param(const AdamWOptions& o) {
  return int64_t(dtype_size(o.exp_avg_dtype) + dtype_size(o.exp_avg_sq_dtype));
}

std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segments, int64_t begin,
                                         int64_t end) {
  if (begin < 0 || end < begin) fail("shard_segments: bad shard [{}, {})", begin, end);
  std::vector<ParamSegment> out;
  for (const auto& s : segments) {
    int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo < hi) out.push_back({s.name, lo - begin, hi - lo, s.weight_decay});
  }
  return out;
}

AdamW::AdamW(AdamWOptions options, int64_t numel) : options_(options), numel_(numel) {
  const auto& o = options_;
  if (numel < 0) fail("AdamW: numel must be non-negative, got {}", numel);
  if (!(o.beta1 >= 0 && o.beta1 < 1)) fail("adam_beta1 must be in [0, 1), got {}", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) fail("adam_beta2 must be in [0, 1), got {}", o.beta2);
  if (!(o.eps > 0) || !std::isfinite(o.eps)) fail("adam_eps must be a positive number, got {}", o.eps);
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay))
    fail("weight_decay must be a non-negative number, got {}", o.weight_decay);
  check_state_dtype("exp_avg_dtype", o.exp_avg_dtype);
  check_state_dtype("exp_avg_sq_dtype", o.exp_avg_sq_dtype);
  // One element at least, so that an empty shard still has valid (unused) storage.
  m_ = Tensor::zeros({std::max<int64_t>(numel, 1)}, o.exp_avg_dtype);
  v_ = Tensor::zeros({std::max<int64_t>(numel, 1)}, o.exp_avg_sq_dtype);
}

void AdamW::moment(bool second, int64_t begin, int64_t n, float* out) const {
  if (begin < 0 || n < 0 || begin + n > numel_)
    fail("AdamW::moment: [{}, +{}) outside the {} elements", begin, n, numel_);
  const Tensor& t = second ? v_ : m_;
  if (t.dtype() == DType::F32) {
    std::copy(t.data<float>() + begin, t.data<float>() + begin + n, out);
    return;
  }
  const bf16* x = t.data<bf16>() + begin;
  for (int64_t i = 0; i < n; ++i) out[i] = load_state(x, i);
}

void AdamW::set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq) {
  if (step_count < 0) fail("AdamW::set_state: step count must be non-negative, got {}", step_count);
  step_ = step_count;
  if (numel_ == 0 || (!exp_avg && !exp_avg_sq)) return;  // only the step: the moments are in place
  for (int which = 0; which < 2; ++which) {
    Tensor& t = which == 0 ? m_ : v_;
    const float* src = which == 0 ? exp_avg : exp_avg_sq;
    if (!src) continue;  // loaded in place
    if (t.dtype() == DType::F32) {
      std::memcpy(t.data<float>(), src, sizeof(float) * numel_);
    } else {
      bf16* x = t.data<bf16>();
      for (int64_t i = 0; i < numel_; ++i) store_state(x, i, src[i]);
    }
  }
}

void AdamW::step(float* params, const float* grads, const std::vector<ParamSegment>& segments, double lr,
                 bf16* working) {
  step(params, const_cast<float*>(grads), segments, lr, working, 1.0);  // a factor of 1 writes no gradient
}

void AdamW::step(float* params, float* grads, const std::vector<ParamSegment>& segments, double lr, bf16* working,
                 double grad_scale) {
  if (!std::isfinite(lr) || lr < 0) fail("AdamW::step: learning rate must be a non-negative number, got {}", lr);
  // Check the segments before touching anything, so that a bad list cannot half-apply a step.
  std::vector<const ParamSegment*> order;
  order.reserve(segments.size());
  for (const auto& s : segments) {
    if (s.offset < 0 || s.numel < 0 || s.offset + s.numel > numel_)
      fail("AdamW::step: segment '{}' [{}, {}) lies outside the optimizer's {} elements", s.name, s.offset,
           s.offset + s.numel, numel_);
    order.push_back(&s);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->numel)
      fail("AdamW::step: segments '{}' and '{}' overlap", order[i - 1]->name, order[i]->name);

  ++step_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(step_));
  const double bc2 = 1.0 - std::pow(b2, double(step_));
  // Constants in double, the loop in float: m_hat / (sqrt(v_hat) + eps) rewritten as
  // m * step_size / (sqrt(v) * inv_sqrt_bc2 + eps), as torch does, to keep one sqrt per element.
  StepConsts c;
  c.b1 = float(b1);
  c.b2 = float(b2);
  c.one_minus_b1 = float(1.0 - b1);
  c.one_minus_b2 = float(1.0 - b2);
  c.step_size = float(lr / bc1);
  c.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  c.eps = float(options_.eps);
  c.grad_scale = float(grad_scale);
  c.bf16_params = options_.bf16_params;
  const bool m32 = m_.dtype() == DType::F32, v32 = v_.dtype() == DType::F32;
  for (const auto& s : segments) {
    const bool decayed = s.weight_decay || options_.decay_norms_and_biases;
    const float decay = decayed ? float(1.0 - lr * options_.weight_decay) : 1.0f;
    float* p = params + s.offset;
    float* g = grads + s.offset;
    const int64_t o = s.offset, n = s.numel;
    bf16* w = working ? working + o : nullptr;
    if (m32 && v32)
      update_segment(p, g, m_.data<float>() + o, v_.data<float>() + o, w, n, decay, c);
    else if (m32)
      update_segment(p, g, m_.data<float>() + o, v_.data<bf16>() + o, w, n, decay, c);
    else if (v32)
      update_segment(p, g, m_.data<bf16>() + o, v_.data<float>() + o, w, n, decay, c);
    else
      update_segment(p, g, m_.data<bf16>() + o, v_.data<bf16>() + o, w, n, decay, c);
  }
}

}  // namespace primus
