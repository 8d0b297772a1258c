#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/adam_state.h"

namespace primus {
namespace adamw_detail {  // named: AdamW::SegmentStep holds one
struct StepConsts {
  float b1, b2, one_minus_b1, one_minus_b2, step_size, inv_sqrt_bc2, eps, grad_scale;
};
}  // namespace adamw_detail
namespace {

using adam_state::Scaling;
using adamw_detail::StepConsts;

// A moment's storage as the update loop reads and writes it: fp32, bf16 (to nearest even on store)
// or a scaled fp16 / E4M3 state (kernels/adam_state.h).
struct F32Ref {
  float* x;
  float load(int64_t i) const { return x[i]; }
  void store(int64_t i, float v) const { x[i] = v; }
};
struct Bf16Ref {
  bf16* x;
  float load(int64_t i) const { return bf16_bits_to_float(x[i].bits); }
  void store(int64_t i, float v) const { x[i].bits = float_to_bf16_bits(v); }
};
using adam_state::E4m3Ref;
using adam_state::F16Ref;

enum class ParamMode : uint8_t { Fp32, Bf16, Fp16Master };

// The update of one element, with its fused multiply-adds written out (the CUDA kernel,
// fused_optimizer.cu, writes the same ones): the moments from the stored ones and the gradient,
// then the parameter from the moments.
inline void next_moments(float m, float v, float g, const StepConsts& c, float& mo, float& vo) {
  mo = std::fma(c.b1, m, c.one_minus_b1 * g);
  vo = std::fma(c.b2, v, c.one_minus_b2 * g * g);
}
inline float next_param(float p, float m, float v, float decay, const StepConsts& c) {
  return std::fma(p, decay, -(c.step_size * m) / std::fma(std::sqrt(v), c.inv_sqrt_bc2, c.eps));
}

// One segment's update; M and V are the moments' storage (the refs above), kParams how the
// parameters are kept, kWorking also writes them rounded to bf16 into w, kScaled multiplies the
// gradients by c.grad_scale first, in place (the clipping factor). master: an fp16 master's scaling.
template <class M, class V, ParamMode kParams, bool kWorking, bool kScaled>
void update_segment(float* __restrict p, float* __restrict g, const M m, const V v, bf16* __restrict w, int64_t n,
                    float decay, const StepConsts c, const Scaling master) {  // by value: no store can alias them
#pragma omp parallel for simd schedule(static) if (parallel : n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if constexpr (kScaled) g[i] = gi = gi * c.grad_scale;
    float mi, vi;
    next_moments(m.load(i), v.load(i), gi, c, mi, vi);
    m.store(i, mi);
    v.store(i, vi);
    float pi = p[i];
    if constexpr (kParams == ParamMode::Fp16Master) pi = adam_state::f16_round_trip(pi, master);
    pi = next_param(pi, mi, vi, decay, c);
    if constexpr (kParams == ParamMode::Bf16) pi = bf16_bits_to_float(float_to_bf16_bits(pi));
    p[i] = pi;
    if constexpr (kWorking) w[i].bits = float_to_bf16_bits(pi);
  }
}

// The amax of a segment's updated moments (before anything is stored: the scales they will be
// stored with), computed as update_segment computes them.
struct MomentAmax {
  uint32_t m = 0, v = 0;
  bool m_nan = false, v_nan = false;
};
template <class M, class V>
MomentAmax moments_amax(const float* __restrict g, const M m, const V v, int64_t n, const StepConsts c) {
  uint32_t am = 0, av = 0;
  bool nm = false, nv = false;
#pragma omp parallel for simd schedule(static) reduction(max : am, av) reduction(|| : nm, nv) if (parallel : n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float mi, vi;
    next_moments(m.load(i), v.load(i), g[i] * c.grad_scale, c, mi, vi);  // times 1: exact
    const uint32_t a = adam_state::abs_bits(mi), b = adam_state::abs_bits(vi);
    nm = nm || adam_state::is_nan_bits(a);
    nv = nv || adam_state::is_nan_bits(b);
    am = std::max(am, adam_state::is_nan_bits(a) ? 0u : a);
    av = std::max(av, adam_state::is_nan_bits(b) ? 0u : b);
  }
  return {am, av, nm, nv};
}

float amax_of(const float* x, int64_t n) {
  uint32_t am = 0;
  bool nan = false;
#pragma omp parallel for simd schedule(static) reduction(max : am) reduction(|| : nan) if (parallel : n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = adam_state::abs_bits(x[i]);
    nan = nan || adam_state::is_nan_bits(a);
    am = std::max(am, adam_state::is_nan_bits(a) ? 0u : a);
  }
  return adam_state::amax_value(am, nan);
}

Scaling scaling_of(DType d, float amax) {
  return d == DType::F16 ? adam_state::f16_scaling(amax) : adam_state::e4m3_scaling(amax);
}

void check_state_dtype(const char* key, DType d) {
  if (d != DType::F32 && d != DType::BF16 && d != DType::F16 && d != DType::F8E4M3)
    fail("AdamW: {} {} is not a state dtype (fp32, bf16, fp16, fp8_e4m3)", key, dtype_name(d));
}

}  // namespace

bool scaled_state(DType d) { return d == DType::F16 || d == DType::F8E4M3; }

int64_t adamw_state_bytes_per_param(const AdamWOptions& o) {
  return int64_t(dtype_size(o.exp_avg_dtype) + dtype_size(o.exp_avg_sq_dtype));
}

int64_t adamw_state_bytes(const AdamWOptions& o, int64_t numel, int64_t segments) {
  const int64_t scales = int64_t(scaled_state(o.exp_avg_dtype)) + int64_t(scaled_state(o.exp_avg_sq_dtype));
  return numel * adamw_state_bytes_per_param(o) + segments * scales * int64_t(sizeof(float));
}

float load_scaled_state(DType d, const float* values, int64_t n, void* codes) {
  PRIMUS_CHECK(scaled_state(d), "load_scaled_state of a {} state", dtype_name(d));
  const Scaling s = scaling_of(d, amax_of(values, n));
  // The codes as the step stores them; a reader's factor reproduces the values, or not.
  auto reproduces = [&](float dequant) {
    for (int64_t i = 0; i < n; ++i) {
      const float x = d == DType::F16 ? F16Ref{static_cast<uint16_t*>(codes), dequant, 0}.load(i)
                                      : E4m3Ref{static_cast<uint8_t*>(codes), dequant, 0}.load(i);
      if (adam_state::bits(x) != adam_state::bits(values[i])) return false;
    }
    return true;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (d == DType::F16)
      F16Ref{static_cast<uint16_t*>(codes), 0, s.quant}.store(i, values[i]);
    else
      E4m3Ref{static_cast<uint8_t*>(codes), 0, s.quant}.store(i, values[i]);
  }
  if (n == 0 || !std::isfinite(s.dequant) || reproduces(s.dequant)) return s.dequant;
  // The codes are the stored state's (its values times a factor within an ulp or two of this one
  // round back to them); its own factor is near.
  float lo = s.dequant, hi = s.dequant;
  for (int k = 0; k < 4; ++k) {
    lo = std::nextafter(lo, 0.0f);
    hi = std::nextafter(hi, INFINITY);
    if (reproduces(hi)) return hi;
    if (reproduces(lo)) return lo;
  }
  return s.dequant;  // values of another state (fp32, another layout): TE's scale
}

void read_scaled_state(DType d, const void* codes, int64_t n, float dequant, float* out) {
  PRIMUS_CHECK(scaled_state(d), "read_scaled_state of a {} state", dtype_name(d));
  if (d == DType::F16) {
    const F16Ref r{const_cast<uint16_t*>(static_cast<const uint16_t*>(codes)), dequant, 0};
    for (int64_t i = 0; i < n; ++i) out[i] = r.load(i);
  } else {
    const E4m3Ref r{const_cast<uint8_t*>(static_cast<const uint8_t*>(codes)), dequant, 0};
    for (int64_t i = 0; i < n; ++i) out[i] = r.load(i);
  }
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
  if (o.main_params_dtype != DType::F32 && o.main_params_dtype != DType::BF16 && o.main_params_dtype != DType::F16)
    fail("AdamW: main_params_dtype {} is not a parameter dtype (fp32, bf16, fp16)", dtype_name(o.main_params_dtype));
  // One element at least, so that an empty shard still has valid (unused) storage.
  m_ = Tensor::zeros({std::max<int64_t>(numel, 1)}, o.exp_avg_dtype);
  v_ = Tensor::zeros({std::max<int64_t>(numel, 1)}, o.exp_avg_sq_dtype);
}

// A scaled state's scales follow the segments it was first stepped (or loaded) with.
void AdamW::bind_segments(const std::vector<ParamSegment>& segments, const char* what) {
  if (scales_.empty()) {
    for (const auto& s : segments) scales_.push_back({s.offset, s.numel});
    return;
  }
  bool same = scales_.size() == segments.size();
  for (size_t k = 0; same && k < segments.size(); ++k)
    same = scales_[k].offset == segments[k].offset && scales_[k].numel == segments[k].numel;
  if (!same)
    fail("AdamW::{}: exp_avg_dtype {} / exp_avg_sq_dtype {} keep one scale per segment, and these segments are not "
         "the ones the state was built over ({} segments then, {} now)",
         what, dtype_name(m_.dtype()), dtype_name(v_.dtype()), scales_.size(), segments.size());
}

void AdamW::moment(bool second, int64_t begin, int64_t n, float* out) const {
  if (begin < 0 || n < 0 || begin + n > numel_)
    fail("AdamW::moment: [{}, +{}) outside the {} elements", begin, n, numel_);
  const Tensor& t = second ? v_ : m_;
  if (t.dtype() == DType::F32) {
    std::copy(t.data<float>() + begin, t.data<float>() + begin + n, out);
    return;
  }
  if (t.dtype() == DType::BF16) {
    const Bf16Ref r{const_cast<bf16*>(t.data<bf16>()) + begin};
    for (int64_t i = 0; i < n; ++i) out[i] = r.load(i);
    return;
  }
  std::fill(out, out + n, 0.0f);  // outside the segments: never written, zeros
  const size_t es = dtype_size(t.dtype());
  for (const SegmentScale& s : scales_) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(begin + n, s.offset + s.numel);
    if (lo < hi)
      read_scaled_state(t.dtype(), static_cast<const char*>(t.raw()) + size_t(lo) * es, hi - lo, second ? s.v : s.m,
                        out + (lo - begin));
  }
}

void AdamW::set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq,
                      const std::vector<ParamSegment>* segments) {
  if (step_count < 0) fail("AdamW::set_state: step count must be non-negative, got {}", step_count);
  step_ = step_count;
  if (numel_ == 0 || (!exp_avg && !exp_avg_sq)) return;  // only the step: the moments are in place
  if (any_scaled()) {
    if (!segments)
      fail("AdamW::set_state: exp_avg_dtype {} / exp_avg_sq_dtype {} keep one scale per segment: a load needs the "
           "segments",
           dtype_name(m_.dtype()), dtype_name(v_.dtype()));
    bind_segments(*segments, "set_state");
  }
  for (int which = 0; which < 2; ++which) {
    Tensor& t = which == 0 ? m_ : v_;
    const float* src = which == 0 ? exp_avg : exp_avg_sq;
    if (!src) continue;  // loaded in place
    if (t.dtype() == DType::F32) {
      std::memcpy(t.data<float>(), src, sizeof(float) * numel_);
    } else if (t.dtype() == DType::BF16) {
      const Bf16Ref r{t.data<bf16>()};
      for (int64_t i = 0; i < numel_; ++i) r.store(i, src[i]);
    } else {
      std::memset(t.raw(), 0, dtype_size(t.dtype()) * size_t(numel_));
      const size_t es = dtype_size(t.dtype());
      for (SegmentScale& s : scales_)
        (which == 0 ? s.m : s.v) = load_scaled_state(t.dtype(), src + s.offset, s.numel,
                                                     static_cast<char*>(t.raw()) + size_t(s.offset) * es);
    }
  }
}

// One step's update of one segment: the scales of its scaled states first (an fp16 master's from
// the parameters' amax, the moments' from the amax of their updated values), then the update loop
// for its storage.
using adamw_detail::StepConsts;

class AdamW::SegmentStep {
 private:
  // f called with the moment's storage ref at the segment's offset.
  template <class F>
  auto with_state(bool second, int64_t offset, float dequant, float quant, F&& f) {
    Tensor& t = second ? a_.v_ : a_.m_;
    switch (t.dtype()) {
      case DType::BF16: return f(Bf16Ref{t.data<bf16>() + offset});
      case DType::F16: return f(F16Ref{static_cast<uint16_t*>(t.raw()) + offset, dequant, quant});
      case DType::F8E4M3: return f(E4m3Ref{static_cast<uint8_t*>(t.raw()) + offset, dequant, quant});
      default: return f(F32Ref{t.data<float>() + offset});
    }
  }
  template <class M, class V>
  void dispatch(const M& m, const V& v) {
    switch (a_.options_.main_params_dtype) {
      case DType::BF16: return dispatch<M, V, ParamMode::Bf16>(m, v);
      case DType::F16: return dispatch<M, V, ParamMode::Fp16Master>(m, v);
      default: return dispatch<M, V, ParamMode::Fp32>(m, v);
    }
  }
  template <class M, class V, ParamMode P>
  void dispatch(const M& m, const V& v) {
    if (w_) return dispatch<M, V, P, true>(m, v);
    dispatch<M, V, P, false>(m, v);
  }
  template <class M, class V, ParamMode P, bool W>
  void dispatch(const M& m, const V& v) {
    if (c_.grad_scale != 1.0f) return update_segment<M, V, P, W, true>(p_, g_, m, v, w_, n_, decay_, c_, master_);
    update_segment<M, V, P, W, false>(p_, g_, m, v, w_, n_, decay_, c_, master_);
  }

 public:
  SegmentStep(AdamW& a, const StepConsts& c, double lr, bf16* working) : a_(a), c_(c), lr_(lr), working_(working) {}

  void run(const ParamSegment& s, SegmentScale* scale, float* params, float* grads) {
    p_ = params + s.offset;
    g_ = grads + s.offset;
    w_ = working_ ? working_ + s.offset : nullptr;
    n_ = s.numel;
    const double lr_wd = lr_ * a_.options_.weight_decay;
    decay_ = s.weight_decay || a_.options_.decay_norms_and_biases ? float(1.0 - lr_wd) : 1.0f;
    master_ = {};
    if (a_.options_.main_params_dtype == DType::F16) master_ = adam_state::f16_scaling(amax_of(p_, n_));
    Scaling ms, vs;  // the moments' scalings this step (scaled states only)
    if (scale) {
      const MomentAmax am = with_state(false, s.offset, scale->m, 0, [&](auto m) {
        return with_state(true, s.offset, scale->v, 0, [&](auto v) { return moments_amax(g_, m, v, n_, c_); });
      });
      ms = scaling_of(a_.m_.dtype(), adam_state::amax_value(am.m, am.m_nan));
      vs = scaling_of(a_.v_.dtype(), adam_state::amax_value(am.v, am.v_nan));
    }
    const float m_deq = scale ? scale->m : 1.0f, v_deq = scale ? scale->v : 1.0f;
    with_state(false, s.offset, m_deq, ms.quant, [&](auto m) {
      with_state(true, s.offset, v_deq, vs.quant, [&](auto v) {
        dispatch(m, v);
        return 0;
      });
      return 0;
    });
    if (scale) {
      if (scaled_state(a_.m_.dtype())) scale->m = ms.dequant;
      if (scaled_state(a_.v_.dtype())) scale->v = vs.dequant;
    }
  }

 private:
  AdamW& a_;
  const StepConsts c_;
  const double lr_;
  bf16* const working_;
  float *p_ = nullptr, *g_ = nullptr;
  bf16* w_ = nullptr;
  int64_t n_ = 0;
  float decay_ = 1.0f;
  Scaling master_;
};

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
  if (any_scaled()) bind_segments(segments, "step");

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
  SegmentStep seg(*this, c, lr, working);
  for (size_t k = 0; k < segments.size(); ++k)
    seg.run(segments[k], any_scaled() ? &scales_[k] : nullptr, params, grads);
}

}  // namespace primus
