// The storage rules of AdamW's scaled states, as Transformer Engine's FusedAdam keeps them
// (docs/optim.md#low-precision-optimizer-state), written once for the host (optim/adamw.cpp) and
// the fused CUDA step (kernels/cuda/fused_optimizer.cu): a tensor of fp16 or FP8 E4M3 codes and
// one fp32 scaling per tensor (here: per segment of the flat buffers), recomputed from the
// tensor's amax each time it is stored. Bit operations and IEEE fp32 arithmetic only, one rounding
// per operation (kernels/fp8_scalar.h's rules), so that the host and a GPU give the same bits.
#pragma once

#include <cstdint>

#include "kernels/fp8_scalar.h"

namespace primus::adam_state {

using fp8::scalar::bits;
using fp8::scalar::from_bits;

// fp32 -> IEEE fp16 bits, to nearest even; from 65520 up (the midpoint past 65504, the largest
// finite fp16) the infinity of the sign, as PyTorch's and CUDA's conversions; NaN stays NaN. A
// value below fp16's smallest normal (2^-14) is rounded by one fp32 add: in [0.5, 1) fp32's quantum
// is fp16's subnormal one (2^-24).
PRIMUS_FP8_HD uint16_t f16_bits(float v) {
  const uint32_t b = bits(v), sign = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);
  if (a < 0x38800000u) return uint16_t(sign | (bits(from_bits(a) + 0.5f) - 0x3F000000u));
  // Exponent rebiased (127 -> 15: minus 112 << 23), the 13 dropped bits rounded to nearest even.
  return uint16_t(sign | ((a + 0xC8000FFFu + ((a >> 13) & 1u)) >> 13));
}

// IEEE fp16 bits -> fp32, exactly.
PRIMUS_FP8_HD float f16_value(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) return from_bits(sign | bits(float(m) * 0x1p-24f));  // zero and subnormals
  if (e == 31) return from_bits(sign | 0x7F800000u | (m << 13));
  return from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// TE's range of a scaled state (FusedAdam's dtype_to_range_map): fp16's largest finite value
// halved, E4M3's largest finite value.
constexpr float kF16Range = 32752.0f;
constexpr float kE4m3Range = 448.0f;

// A tensor's scaling: x is stored as the code of x * quant and read back as value(code) * dequant.
struct Scaling {
  float quant = 1.0f, dequant = 1.0f;
};

// TE's _apply_scale for fp16 from the tensor's amax (NaN when it holds a NaN): s = amax / range,
// quant = 1 / s where s > 0, else 0; dequant = s.
PRIMUS_FP8_HD Scaling f16_scaling(float amax) {
  const float s = amax / kF16Range;
  return {s > 0.0f ? 1.0f / s : 0.0f, s};
}

// The same for E4M3: s = amax / 448, quant = 1 / s (TE's quantizer scale), dequant = 1 / quant
// (the scale_inv its cast kernel writes). Where s is 0 (an all-zero tensor) TE stores 0 * (1 / 0),
// NaN; here quant = dequant = 0, so the zeros stay zeros, as TE's fp16 rule keeps them.
PRIMUS_FP8_HD Scaling e4m3_scaling(float amax) {
  const float s = amax / kE4m3Range;
  if (s == 0.0f) return {0.0f, 0.0f};
  const float q = 1.0f / s;
  return {q, 1.0f / q};
}

// A scaled state's codes with the scalings of one step: loads read the stored codes with the
// dequantizing factor they were stored with, stores use this step's quantizing factor.
struct F16Ref {
  uint16_t* x;
  float dequant, quant;
  PRIMUS_FP8_HD float load(int64_t i) const { return f16_value(x[i]) * dequant; }
  PRIMUS_FP8_HD void store(int64_t i, float v) const { x[i] = f16_bits(v * quant); }
};
struct E4m3Ref {
  uint8_t* x;
  float dequant, quant;
  PRIMUS_FP8_HD float load(int64_t i) const { return fp8::scalar::decode(x[i], fp8::scalar::e4m3()) * dequant; }
  PRIMUS_FP8_HD void store(int64_t i, float v) const { x[i] = fp8::scalar::encode(v * quant, fp8::scalar::e4m3()); }
};

// A value of an fp16 master weight (TE's master_weight_dtype fp16): x stored as fp16 with the
// tensor's scaling s, read back in fp32.
PRIMUS_FP8_HD float f16_round_trip(float x, const Scaling& s) { return f16_value(f16_bits(x * s.quant)) * s.dequant; }

// An amax over a tensor, NaN-aware, in a form that reductions in any order give the same bits:
// the largest |x| that is not NaN as its bits (non-negative floats order as their bits), and
// whether a NaN was seen. value(): that |x|, or NaN.
PRIMUS_FP8_HD uint32_t abs_bits(float x) { return bits(x) & 0x7FFFFFFFu; }
PRIMUS_FP8_HD bool is_nan_bits(uint32_t a) { return a > 0x7F800000u; }
PRIMUS_FP8_HD float amax_value(uint32_t max_bits, bool nan) {
  return nan ? from_bits(0x7FC00000u) : from_bits(max_bits);
}

}  // namespace primus::adam_state
