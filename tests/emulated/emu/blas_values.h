// Element access for the emulated BLAS libraries (cublaslt_api.cpp, cublas_api.cpp): the i-th
// element of a bf16, fp32 or FP8 (CUDA_R_8F_E4M3, CUDA_R_8F_E5M2) matrix in device memory (the
// emulated device's memory is host memory), read as float and written rounded once to its type.
//
// FP8 is written here from the formats' definitions (OCP's E4M3FN: bias 7, no infinities, S.1111.111
// the only NaN; E5M2: bias 15, IEEE-like infinities and NaNs), independently of the project's own
// src/kernels/fp8*, so that the emulated cuBLASLt checks them instead of repeating them: a byte is
// decoded with ldexp, and a float is stored as the nearest of the 256 decoded values (ties to the
// even code, past the largest finite value saturated: cuBLASLt's FP8 outputs are "satfinite").
#pragma once

#include <library_types.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "emu/emulator.h"

namespace emu::blas {

inline bool is_fp8(uint32_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }
inline size_t elem_size(uint32_t type) { return type == CUDA_R_16BF ? 2 : is_fp8(type) ? 1 : 4; }

// The value of an FP8 byte.
inline float fp8_decode(uint8_t b, bool e4m3) {
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, ebits = e4m3 ? 4 : 5;
  const int e = (b >> mbits) & ((1 << ebits) - 1), mant = b & ((1 << mbits) - 1);
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (e4m3 && e == 15 && mant == 7) return NAN;
  if (!e4m3 && e == 31) return mant ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(float(mant), 1 - bias - mbits);
  return sign * std::ldexp(float((1 << mbits) + mant), e - bias - mbits);
}

// The byte nearest to v: ties to the even code, beyond the largest finite value the largest finite
// value (infinities too), NaN the format's NaN.
inline uint8_t fp8_encode(float v, bool e4m3) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return uint8_t(sign | (e4m3 ? 0x7F : 0x7E));
  const float a = std::fabs(v);
  const int top = e4m3 ? 0x7E : 0x7B;  // the largest finite magnitude's code
  if (std::isinf(a)) return uint8_t(sign | top);
  uint8_t best = 0;
  for (int c = 1; c <= top; ++c) {
    const float dc = std::fabs(fp8_decode(uint8_t(c), e4m3) - a), db = std::fabs(fp8_decode(best, e4m3) - a);
    if (dc < db || (dc == db && !(c & 1))) best = uint8_t(c);
    if (fp8_decode(uint8_t(c), e4m3) > a) break;  // codes increase with the magnitude
  }
  return uint8_t(sign | best);
}

inline float load(const void* base, uint32_t type, size_t i) {
  if (type == CUDA_R_16BF) {
    uint16_t b;
    std::memcpy(&b, static_cast<const char*>(base) + 2 * i, 2);
    return detail::bf16_to_float(b);
  }
  if (is_fp8(type)) return fp8_decode(static_cast<const uint8_t*>(base)[i], type == CUDA_R_8F_E4M3);
  float f;
  std::memcpy(&f, static_cast<const char*>(base) + 4 * i, 4);
  return f;
}

inline void store(void* base, uint32_t type, size_t i, float v) {
  if (type == CUDA_R_16BF) {
    const uint16_t b = detail::float_to_bf16(v);
    std::memcpy(static_cast<char*>(base) + 2 * i, &b, 2);
  } else if (is_fp8(type)) {
    static_cast<uint8_t*>(base)[i] = fp8_encode(v, type == CUDA_R_8F_E4M3);
  } else {
    std::memcpy(static_cast<char*>(base) + 4 * i, &v, 4);
  }
}

}  // namespace emu::blas
