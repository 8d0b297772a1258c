// Element access for the emulated BLAS libraries (cublaslt_api.cpp, cublas_api.cpp): the i-th
// element of a bf16 or fp32 matrix in device memory (the emulated device's memory is host
// memory), read as float and written rounded once to its type.
#pragma once

#include <library_types.h>

#include <cstdint>
#include <cstring>

#include "emu/emulator.h"

namespace emu::blas {

inline size_t elem_size(uint32_t type) { return type == CUDA_R_16BF ? 2 : 4; }

inline float load(const void* base, uint32_t type, size_t i) {
  if (type == CUDA_R_16BF) {
    uint16_t b;
    std::memcpy(&b, static_cast<const char*>(base) + 2 * i, 2);
    return detail::bf16_to_float(b);
  }
  float f;
  std::memcpy(&f, static_cast<const char*>(base) + 4 * i, 4);
  return f;
}

inline void store(void* base, uint32_t type, size_t i, float v) {
  if (type == CUDA_R_16BF) {
    const uint16_t b = detail::float_to_bf16(v);
    std::memcpy(static_cast<char*>(base) + 2 * i, &b, 2);
  } else {
    std::memcpy(static_cast<char*>(base) + 4 * i, &v, 4);
  }
}

}  // namespace emu::blas
