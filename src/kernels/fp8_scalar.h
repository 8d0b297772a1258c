// The scalar rules of FP8 quantization, written once for the host (kernels/fp8.cpp, vectorized
// loops) and the CUDA kernels (kernels/cuda/fp8_quantize.cu): rounding to a format with
// saturation, a scale from an amax, MXFP8's E8M0 exponent and the blocks' power-of-two scales.
// Bit operations and IEEE fp32 arithmetic only (one rounding per operation, no contraction into
// FMAs, no flush to zero), so that the host and a GPU give the same bits (docs/fp8.md).
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PRIMUS_FP8_HD __host__ __device__ __forceinline__
#else
#define PRIMUS_FP8_HD inline
#endif

namespace primus::fp8::scalar {

PRIMUS_FP8_HD uint32_t bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}

PRIMUS_FP8_HD float from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

PRIMUS_FP8_HD bool is_nan(float x) { return (bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
PRIMUS_FP8_HD bool is_inf(float x) { return (bits(x) & 0x7FFFFFFFu) == 0x7F800000u; }

// 2^k for k in [-149, 127], exactly (a subnormal below 2^-126).
PRIMUS_FP8_HD float pow2(int k) {
  return k >= -126 ? from_bits(uint32_t(k + 127) << 23) : from_bits(1u << uint32_t(k + 149));
}

// A format as the rounding sees it: mantissa bits, the biased fp32 exponents of its smallest normal
// binade and of the first binade whose values all saturate, its largest finite value.
struct Format {
  int32_t mantissa, emin_biased, ecap;
  float max;
};
PRIMUS_FP8_HD Format e4m3() { return {3, -6 + 127, 8 + 128, 448.0f}; }
PRIMUS_FP8_HD Format e5m2() { return {2, -14 + 127, 15 + 128, 57344.0f}; }

// v rounded to the format, ties to even, branch-free: |v| + C - C with C = 2^(e - mantissa + 23)
// rounds |v| < 2^(e + 1) to a multiple of 2^(e - mantissa), e being v's binade (at least the
// smallest normal's, capped where everything saturates so that C stays finite); then saturation
// (infinities included), NaN kept, the sign put back.
PRIMUS_FP8_HD float round(float v, const Format& f) {
  const uint32_t b = bits(v), sign = b & 0x80000000u;
  const float a = from_bits(b & 0x7FFFFFFFu);
  int32_t e = int32_t((b >> 23) & 0xFF);
  e = e < f.emin_biased ? f.emin_biased : e;
  e = e > f.ecap ? f.ecap : e;
  const float c = from_bits(uint32_t(e + 23 - f.mantissa) << 23);
  float r = (a + c) - c;
  r = r >= f.max ? f.max : r;
  r = a != a ? a : r;
  return from_bits(bits(r) | sign);
}

// The FP8 byte of round(v, f): the sign, then for a normal value the exponent field and the top
// mantissa bits, for a subnormal one (or zero) the value in units of the smallest subnormal; NaN as
// the format's NaN (E4M3 S.1111.111, E5M2 S.11111.10).
PRIMUS_FP8_HD uint8_t encode(float v, const Format& f) {
  const uint32_t b = bits(round(v, f)), sign = (b >> 24) & 0x80u, a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint8_t(sign | (f.mantissa == 3 ? 0x7Fu : 0x7Eu));
  const int32_t e = int32_t(a >> 23);
  if (e >= f.emin_biased)
    return uint8_t(sign | uint32_t(e - f.emin_biased + 1) << f.mantissa | (a & 0x7FFFFFu) >> (23 - f.mantissa));
  return uint8_t(sign | uint32_t(from_bits(a) * pow2(f.mantissa + 127 - f.emin_biased)));
}

// The value of an FP8 byte (encode's inverse): a normal value's exponent field and mantissa put
// into an fp32's, a subnormal one as its units of the smallest subnormal (exact); NaN for E4M3's
// S.1111.111 and E5M2's S.11111.xx with a mantissa, E5M2's infinities.
PRIMUS_FP8_HD float decode(uint8_t v, const Format& f) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24, mag = v & 0x7Fu;
  const uint32_t e = mag >> f.mantissa, m = mag & ((1u << f.mantissa) - 1u), e_all = 0x7Fu >> f.mantissa;
  if (f.mantissa == 3 ? mag == 0x7Fu : e == e_all)
    return from_bits(sign | (m == 0 && f.mantissa != 3 ? 0x7F800000u : 0x7FC00000u));
  if (e == 0) return from_bits(sign | bits(float(m) * pow2(f.emin_biased - 127 - f.mantissa)));
  return from_bits(sign | (e - 1 + uint32_t(f.emin_biased)) << 23 | m << (23 - f.mantissa));
}

// TE's compute_scale_from_amax: max / amax; 1 when amax is 0, infinite or NaN; FLT_MAX when the
// quotient overflows; with pow2 the power of two at or below it (the mantissa cleared).
PRIMUS_FP8_HD float scale_from_amax(float amax, float max, bool pow2) {
  if (is_inf(amax) || amax == 0.0f || is_nan(amax)) return 1.0f;
  float scale = max / amax;
  if (is_inf(scale)) scale = FLT_MAX;
  if (pow2) scale = from_bits(bits(scale) & 0xFF800000u);
  return scale;
}

// MXFP8's E8M0 exponent of value rounded up (TE's float_to_e8m0), saturating below NaN (0xFF).
PRIMUS_FP8_HD uint8_t e8m0_of(float value) {
  if (is_nan(value)) return 0xFF;
  if (is_inf(value)) return 0xFE;
  if (value == 0.0f) return 0;
  const uint32_t b = bits(value);
  uint32_t exponent = (b >> 23) & 0xFF;
  const uint32_t mantissa = b & 0x7FFFFF;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return uint8_t(exponent);
}

// 1 / s for a power of two s (normal): exact.
PRIMUS_FP8_HD float inverse_pow2(float s) { return pow2(127 - int((bits(s) >> 23) & 0xFF)); }

// A block's power-of-two scale from its amax: blockwise TE's (scale_from_amax, pow2); MXFP8 2^(127
// - e), e the block's E8M0 exponent of amax / max (NaN for a NaN amax).
PRIMUS_FP8_HD float block_scale(float amax, bool mx, float max) {
  if (!mx) return scale_from_amax(amax, max, true);
  const uint8_t e = e8m0_of(amax * (1.0f / max));
  return e == 0xFF ? from_bits(0x7FC00000u) : pow2(127 - int(e));
}

}  // namespace primus::fp8::scalar
