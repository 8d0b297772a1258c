// Element types and devices. fp32 is what the CPU backend computes in; fp64 serves the
// finite-difference tests; bf16/fp16 are the activation types of mixed precision; i32 holds
// token ids that a device kernel reads; F8E4M3 is storage only, FP8 E4M3 bytes (AdamW's fp8
// moments, optim/adamw.h), which no op computes on. Meta is the shape-only device (core/meta_device.h):
// tensors with shapes and dtypes whose storage holds no bytes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace primus {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, F8E4M3 };
enum class Device : uint8_t { CPU, CUDA, Meta };
inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : d == Device::CUDA ? "cuda" : "meta"; }

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::F8E4M3: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
    case DType::F8E4M3: return "fp8_e4m3";
  }
  return "?";
}

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };

// bf16 <-> fp32 on the bits, inline so that loops over them vectorize: a bf16 is the upper half
// of an fp32, rounded to nearest even; a NaN stays a NaN. (The AVX-512 kernels keep their own
// copy in kernels/cpu/bf16/avx512_common.h: code compiled for AVX-512 must not share inline
// functions with the rest of the program.)
inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// bf16 as storage.
struct bf16 {
  uint16_t bits = 0;
  static bf16 from_float(float f) { return bf16{float_to_bf16_bits(f)}; }
  float to_float() const { return bf16_bits_to_float(bits); }
};
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };

}  // namespace primus
