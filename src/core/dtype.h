// Element types and devices. fp32 is what the CPU backend computes in; fp64 serves the
// finite-difference tests; bf16/fp16 are the activation types of mixed precision; i32 holds
// token ids that a device kernel reads. Meta is the shape-only device (core/meta_device.h):
// tensors with shapes and dtypes whose storage holds no bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace primus {

enum class DType : uint8_t { F32, F64, BF16, F16, I32 };
enum class Device : uint8_t { CPU, CUDA, Meta };
inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : d == Device::CUDA ? "cuda" : "meta"; }

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
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
  }
  return "?";
}

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };

// bf16 as storage: the upper half of an fp32, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  static bf16 from_float(float f);
  float to_float() const;
};
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };

}  // namespace primus
