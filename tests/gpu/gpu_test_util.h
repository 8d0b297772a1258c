// Shared helpers of the GPU suite: skip without a GPU, host<->device copies of bf16/fp32 data,
// seeded random inputs, and comparisons that report the worst element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cuda/runtime.h"

namespace primus::gputest {

// Skips the calling test on a machine without a usable GPU; else initialises device 0.
#define PRIMUS_REQUIRE_GPU()                                                          \
  do {                                                                                \
    if (!::primus::cuda::available()) GTEST_SKIP() << ::primus::cuda::unavailable_reason(); \
    ::primus::cuda::init(0);                                                          \
  } while (0)

inline std::vector<float> random_floats(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  const Rng rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = float(scale * rng.normal_at(i));
  return v;
}

// Rounds every value to bf16 and back: inputs that both backends see exactly.
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16::from_float(x).to_float();
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16::from_float(v[i]).bits;
  return out;
}
inline std::vector<float> from_bf16_bits(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16{v[i]}.to_float();
  return out;
}

// A device buffer holding a copy of host data (or n zeroed elements), freed with the test. Its own
// cudaMalloc of exactly n elements (not a block of the caching allocator, which rounds sizes up),
// so that an access one element past the end is outside the allocation: compute-sanitizer on a
// GPU, and the emulation (tests/emulated), report it. Filled on the compute stream and waited for
// (so that work on any stream may use it), read on the compute stream.
template <typename T>
struct DeviceArray {
  size_t n = 0;
  void* mem = nullptr;
  explicit DeviceArray(size_t count) : n(count) {
    allocate();
    PRIMUS_CUDA_CHECK(cudaMemsetAsync(mem, 0, count * sizeof(T), cuda::stream()));
    cuda::synchronize();
  }
  explicit DeviceArray(const std::vector<T>& host) : n(host.size()) {
    allocate();
    cuda::copy_to_device(mem, host.data(), n * sizeof(T));
  }
  ~DeviceArray() {
    if (mem) cudaFree(mem);  // (waits for the device)
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return static_cast<T*>(mem); }
  std::vector<T> host() const {
    std::vector<T> out(n);
    cuda::copy_to_host(out.data(), mem, n * sizeof(T));
    return out;
  }

 private:
  void allocate() {
    if (n) PRIMUS_CUDA_CHECK(cudaMalloc(&mem, n * sizeof(T)));
  }
};
using DeviceBf16 = DeviceArray<uint16_t>;  // pass .get() through reinterpret_cast<__nv_bfloat16*>

// Expects |got - want| <= atol + rtol * |want| everywhere; reports the worst element.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0, bad = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(want[i]));
    const double tol = atol + rtol * std::abs(double(want[i]));
    if (!(err <= tol)) ++bad;  // NaN counts as bad
    const double excess = std::isnan(err) ? 1e300 : err - tol;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements out of tolerance; worst at " << worst
                     << ": got " << got[worst] << ", want " << want[worst] << " (atol " << atol << ", rtol " << rtol
                     << ")";
}

}  // namespace primus::gputest
