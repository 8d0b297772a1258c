#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace primus {

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
  // One element at least, so that an empty shard still has valid (unused) storage.
  m_ = Tensor::zeros({std::max<int64_t>(numel, 1)});
  v_ = Tensor::zeros({std::max<int64_t>(numel, 1)});
}

void AdamW::set_state(int64_t step_count, const float* exp_avg, const float* exp_avg_sq) {
  if (step_count < 0) fail("AdamW::set_state: step count must be non-negative, got {}", step_count);
  step_ = step_count;
  if (numel_ == 0 || (!exp_avg && !exp_avg_sq)) return;  // only the step: the moments are in place
  std::memcpy(m_.data<float>(), exp_avg, sizeof(float) * numel_);
  std::memcpy(v_.data<float>(), exp_avg_sq, sizeof(float) * numel_);
}

void AdamW::step(float* params, const float* grads, const std::vector<ParamSegment>& segments, double lr) {
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
  const float fb1 = float(b1), fb2 = float(b2);
  const float f1b1 = float(1.0 - b1), f1b2 = float(1.0 - b2);
  const float step_size = float(lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float eps = float(options_.eps);
  float* m_all = m_.data<float>();
  float* v_all = v_.data<float>();

  for (const auto& s : segments) {
    const bool decayed = s.weight_decay || options_.decay_norms_and_biases;
    const float decay = decayed ? float(1.0 - lr * options_.weight_decay) : 1.0f;
    float* __restrict p = params + s.offset;
    const float* __restrict g = grads + s.offset;
    float* __restrict m = m_all + s.offset;
    float* __restrict v = v_all + s.offset;
    const int64_t n = s.numel;
#pragma omp parallel for simd schedule(static) if (parallel : n > 32768)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i];
      const float mi = fb1 * m[i] + f1b1 * gi;
      const float vi = fb2 * v[i] + f1b2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    }
  }
}

}  // namespace primus
