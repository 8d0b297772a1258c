// Soft-capping (Gemma 2's and Grok's logits): z = cap * tanh(x / cap), which keeps every logit
// inside (-cap, cap) and is the identity near 0; cap 0 means none. Its derivative, written from
// the capped value as the backward passes have it: dz/dx = 1 - (z / cap)^2. The host's and the
// reference's definition; the fused kernels (the cross-entropy's, kernels/backend.h) compute the
// same, the CPU fp32 one with fast_tanh (kernels/cpu/fast_math.h).
#pragma once

#include <cmath>

namespace primus::ops {

template <typename T>
inline T softcap(T x, T cap) {
  return cap > T(0) ? cap * std::tanh(x / cap) : x;
}

template <typename T>
inline T softcap_slope(T capped, T cap) {
  if (!(cap > T(0))) return T(1);
  const T u = capped / cap;
  return T(1) - u * u;
}

}  // namespace primus::ops
