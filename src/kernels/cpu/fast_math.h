// exp for the softmax inner loops. std::exp does not vectorise without -ffast-math, and the
// attention's softmax is exp-bound on CPU; this float version (Cephes' range reduction and
// polynomial, about 1 ulp on the softmax's range) vectorises under `omp simd`. Doubles, used by
// the gradient tests, keep std::exp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace primus::cpu {

inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);  // exp(-87) ~ 1.6e-38: masked terms vanish; NaN passes through
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return y * std::bit_cast<float>(e);
}

inline double fast_exp(double x) { return std::exp(x); }

// tanh through fast_exp, so that soft-capped logits (kernels/softcap.h) vectorise: (e - 1) / (e + 1)
// with e = exp(2y), saturating to +-1 where fast_exp clamps; about 1e-7 absolute near 0. Doubles keep
// std::tanh.
inline float fast_tanh(float y) {
  const float e = fast_exp(2.0f * y);
  return (e - 1.0f) / (e + 1.0f);
}

inline double fast_tanh(double y) { return std::tanh(y); }

}  // namespace primus::cpu
