// quantize_fp8 on the GPU (fp8_quantize.h): the host's fp8::quantize (kernels/fp8.cpp) as kernels,
// with the same scalar rules (kernels/fp8_scalar.h), so the values are the same bits.
//
//   tensor scaling   amax_kernel (current scaling: the tensor's amax first, the scale on the
//                    host from it), then tensor_kernel: out = round(x * scale), the amax folded
//                    in as it goes (delayed scaling records it)
//   packing          pack_kernel: FP8 values (held in bf16 or fp32) as FP8 bytes, transposed or
//                    not, for cuBLASLt's FP8 GEMMs (cuda_backend.cpp, gemm_fp8)
//   blocks           block_scales_kernel (one thread block per quantization block: its amax, its
//                    power-of-two scale and inverse, and the inverse again where a block-scaled
//                    cuBLASLt GEMM reads it), then block_kernel: out = round(x * s) / s
//
// An amax is a maximum, which no order changes: the partial maxima meet through atomicMax on the
// bits of |x| (non-negative floats order as their bits), a NaN through a flag beside it.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include <algorithm>
#include <optional>

#include "kernels/cuda/fp8_quantize.h"
#include "kernels/fp8_scalar.h"

namespace primus::cuda {

using namespace fused_detail;
namespace scalar = fp8::scalar;

namespace {

constexpr int kThreads = 256;

// The value of element i as fp32 (bf16: exact, its bits widened), and back (bf16: to nearest
// even, as the host's store; FP8 values and their power-of-two rescalings are exact).
__device__ __forceinline__ float load(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float load(const uint16_t* x, int64_t i) { return scalar::from_bits(uint32_t(x[i]) << 16); }
__device__ __forceinline__ void store(float* out, int64_t i, float v) { out[i] = v; }
__device__ __forceinline__ void store(uint16_t* out, int64_t i, float v) {
  const uint32_t b = scalar::bits(v);
  out[i] = uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// acc[0]: the bits of the largest |x| that is not NaN; acc[1]: 1 when a NaN was seen.
__device__ __forceinline__ void fold(unsigned* acc, unsigned abs_bits, bool nan) {
  if (nan) atomicMax(acc + 1, 1u);
  atomicMax(acc, abs_bits);
}

// The warp's maximum of v and whether any lane saw a NaN, in every lane.
__device__ __forceinline__ void warp_max(unsigned& v, unsigned& nan) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned ov = __shfl_xor_sync(kFullMask, v, o), on = __shfl_xor_sync(kFullMask, nan, o);
    v = ov > v ? ov : v;
    nan = on > nan ? on : nan;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) amax_kernel(const T* __restrict__ x, int64_t n, unsigned* acc) {
  unsigned m = 0, nan = 0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const uint32_t a = scalar::bits(load(x, i)) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) nan = 1;
    else m = a > m ? a : m;
  }
  warp_max(m, nan);
  if ((threadIdx.x & 31) == 0) fold(acc, m, nan != 0);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    tensor_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n, float scale, scalar::Format f,
                  unsigned* acc) {
  unsigned m = 0, nan = 0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const float v = load(x, i);
    store(out, i, scalar::round(v * scale, f) * 1.0f);
    const uint32_t a = scalar::bits(v) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) nan = 1;
    else m = a > m ? a : m;
  }
  if (acc) {
    warp_max(m, nan);
    if ((threadIdx.x & 31) == 0) fold(acc, m, nan != 0);
  }
}

// *dst = fold_amax(*dst, the amax in acc): on the bits, as the amaxes meet above (a NaN's canonical
// bits exceed every other amax's, so one sticks).
__global__ void fold_amax_kernel(const unsigned* __restrict__ acc, float* __restrict__ dst) {
  unsigned* d = reinterpret_cast<unsigned*>(dst);
  const unsigned v = acc[1] ? 0x7FC00000u : acc[0];
  if (v > *d) *d = v;
}

// Where block (rb, cb) of x's blocks puts its dequantization scale for a GEMM (fp8_quantize.h,
// Fp8GemmScales): the block's index along k and along the outer dimension, then gemm.h's Vec128
// (1-D tiles: [k blocks, outer] with `outer` rows) or Blk128 layout ([outer blocks, ld]).
struct GemmScaleIndex {
  bool k_along_cols, vec;
  int64_t outer, ld;
  __device__ __forceinline__ int64_t operator()(int64_t rb, int64_t cb) const {
    const int64_t kb = k_along_cols ? cb : rb, ob = k_along_cols ? rb : cb;
    return vec ? kb * outer + ob : ob * ld + kb;
  }
};

// One thread block (of 32, 128 or 256 threads) per quantization block b = (rb, cb) of br x bc
// elements: its amax, then (thread 0) its scale and inverse, and the inverse into gemm_out.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    block_scales_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t br, int64_t bc, int64_t nbc,
                        bool mx, float fmax, float* __restrict__ mul, float* __restrict__ post, unsigned* acc,
                        float* __restrict__ gemm_out, GemmScaleIndex gemm_index) {
  __shared__ unsigned warp_m[kThreads / 32];
  __shared__ unsigned warp_nan[kThreads / 32];
  const int64_t b = blockIdx.x, r0 = (b / nbc) * br, c0 = (b % nbc) * bc;
  const int64_t nr = br < rows - r0 ? br : rows - r0, nc = bc < cols - c0 ? bc : cols - c0;
  unsigned m = 0, nan = 0;
  for (int64_t i = threadIdx.x; i < nr * nc; i += blockDim.x) {
    const uint32_t a = scalar::bits(load(x, (r0 + i / nc) * cols + c0 + i % nc)) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) nan = 1;
    else m = a > m ? a : m;
  }
  warp_max(m, nan);
  const int warp = int(threadIdx.x) >> 5, warps = int(blockDim.x) >> 5;
  if ((threadIdx.x & 31) == 0) warp_m[warp] = m, warp_nan[warp] = nan;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w) m = warp_m[w] > m ? warp_m[w] : m, nan = warp_nan[w] > nan ? warp_nan[w] : nan;
    const float amax = nan ? scalar::from_bits(0x7FC00000u) : scalar::from_bits(m);
    const float s = scalar::block_scale(amax, mx, fmax);
    mul[b] = s;
    post[b] = scalar::inverse_pow2(s);
    if (gemm_out) gemm_out[gemm_index(b / nbc, b % nbc)] = post[b];
    fold(acc, m, nan != 0);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    block_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                 int64_t nbc, const float* __restrict__ mul, const float* __restrict__ post, scalar::Format f) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / cols, c = i - r * cols, b = (r / br) * nbc + c / bc;
    store(out, i, scalar::round(load(x, i) * mul[b], f) * post[b]);
  }
}

// out[r * ld + c] = the byte of x's element (r, c) of the output's [R, C] (transposed: x's (c, r)),
// divided by its block's scale when `scales` (gemm.h's layouts, R the outer dimension and C k), 0
// for c >= C.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    pack_kernel(const T* __restrict__ x, uint8_t* __restrict__ out, int64_t cols, int64_t R, int64_t C, int64_t ld,
                bool transpose, scalar::Format f, const float* __restrict__ scales, GemmScaleIndex index) {
  const int64_t n = R * ld;
  for (int64_t o = int64_t(blockIdx.x) * kThreads + threadIdx.x; o < n; o += int64_t(gridDim.x) * kThreads) {
    const int64_t r = o / ld, c = o - r * ld;
    if (c >= C) {
      out[o] = 0;
      continue;
    }
    float v = load(x, transpose ? c * cols + r : r * cols + c);
    if (scales) v = v / scales[index(index.vec ? r : r / 128, c / 128)];  // FP8 value times a power of two: exact
    out[o] = scalar::encode(v, f);
  }
}

// The Vec128 / Blk128 index (gemm.h) of an operand of `outer` rows and inner dimension k.
GemmScaleIndex gemm_scale_index(bool k_along_cols, bool vec, int64_t outer, int64_t k) {
  const int64_t kb = (k + 127) / 128;
  return {k_along_cols, vec, outer, (kb + 3) / 4 * 4};
}

template <typename T>
Fp8Result run(const T* x, T* out, int64_t rows, int64_t cols, bool e4m3, int64_t br, int64_t bc, bool mx, float scale,
              cudaStream_t stream, const Fp8GemmScales& gs, const Fp8AmaxDest& dest) {
  const scalar::Format f = e4m3 ? scalar::e4m3() : scalar::e5m2();
  const int64_t n = rows * cols;
  Scratch acc_mem(2 * sizeof(unsigned));
  unsigned* acc = acc_mem.as<unsigned>();
  PRIMUS_CUDA_CHECK(cudaMemsetAsync(acc, 0, 2 * sizeof(unsigned), stream));
  unsigned host[2] = {0, 0};
  auto amax_of = [&] {
    PRIMUS_CUDA_CHECK(cudaMemcpyAsync(host, acc, sizeof host, cudaMemcpyDeviceToHost, stream));
    PRIMUS_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host[1] ? scalar::from_bits(0x7FC00000u) : scalar::from_bits(host[0]);
  };
  // The amax where `dest` asks for it; `known`: already read back (current scaling's).
  auto deliver = [&](std::optional<float> known) -> float {
    if (dest.fold) {
      fold_amax_kernel<<<1, 1, 0, stream>>>(acc, dest.fold);
      PRIMUS_CUDA_CHECK_LAUNCH();
      return 0.0f;
    }
    if (!dest.wanted) return 0.0f;
    return known ? *known : amax_of();
  };
  const unsigned grid = blocks_for(n, kThreads);
  if (br == 0) {  // tensor scaling
    const bool current = scale == 0.0f;
    if (current && n > 0) {
      amax_kernel<T><<<grid, kThreads, 0, stream>>>(x, n, acc);
      PRIMUS_CUDA_CHECK_LAUNCH();
    }
    std::optional<float> known;
    if (current) {
      known = n > 0 ? amax_of() : 0.0f;
      scale = scalar::scale_from_amax(*known, f.max, false);
    }
    if (n > 0) {
      tensor_kernel<T><<<grid, kThreads, 0, stream>>>(x, out, n, scale, f, current ? nullptr : acc);
      PRIMUS_CUDA_CHECK_LAUNCH();
    }
    return {deliver(n > 0 ? known : std::optional<float>(0.0f)), scale};
  }
  if (n == 0) return {deliver(0.0f), 1.0f};
  const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc, blocks = nbr * nbc;
  PRIMUS_CHECK(blocks < (int64_t(1) << 31), "quantize_fp8: {} blocks of {} x {}", blocks, br, bc);
  Scratch scales(size_t(2 * blocks) * sizeof(float));
  float* mul = scales.as<float>();
  float* post = mul + blocks;
  const int threads = br * bc >= kThreads ? kThreads : br * bc > 32 ? 128 : 32;
  GemmScaleIndex gi{};
  if (gs.out) {
    const bool tiles = br == 1 || bc == 1;
    PRIMUS_CHECK(!mx && (tiles ? br * bc == 128 : br == 128 && bc == 128),
                 "quantize_fp8: GEMM scales of {} x {} blocks (1 x 128 tiles and 128 x 128 blocks only)", br, bc);
    PRIMUS_CHECK(tiles ? (br == 1) == gs.k_along_cols : true,
                 "quantize_fp8: 1 x 128 tiles along {} for a GEMM reducing over the {}", br == 1 ? "rows" : "columns",
                 gs.k_along_cols ? "columns" : "rows");
    gi = gemm_scale_index(gs.k_along_cols, tiles, gs.k_along_cols ? rows : cols, gs.k_along_cols ? cols : rows);
    if (!tiles)  // the padding of each row of k blocks
      PRIMUS_CUDA_CHECK(cudaMemsetAsync(gs.out, 0, size_t((gi.outer + 127) / 128 * gi.ld) * sizeof(float), stream));
  }
  // One launch form for cuda_to_cpp.py: the kernel and its <<< on one line.
  // clang-format off
  block_scales_kernel<T><<<unsigned(blocks), threads, 0, stream>>>(x, rows, cols, br, bc, nbc, mx, f.max, mul, post,
                                                                   acc, gs.out, gi);
  // clang-format on
  PRIMUS_CUDA_CHECK_LAUNCH();
  block_kernel<T><<<grid, kThreads, 0, stream>>>(x, out, rows, cols, br, bc, nbc, mul, post, f);
  PRIMUS_CUDA_CHECK_LAUNCH();
  return {deliver(std::nullopt), 1.0f};
}

}  // namespace

Fp8Result fp8_quantize(const void* x, void* out, bool f32, int64_t rows, int64_t cols, bool e4m3, int64_t block_rows,
                       int64_t block_cols, bool mx, float scale, cudaStream_t stream, const Fp8GemmScales& gemm_scales,
                       const Fp8AmaxDest& amax) {
  if (f32)
    return run(static_cast<const float*>(x), static_cast<float*>(out), rows, cols, e4m3, block_rows, block_cols, mx,
               scale, stream, gemm_scales, amax);
  return run(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out), rows, cols, e4m3, block_rows, block_cols, mx,
             scale, stream, gemm_scales, amax);
}

void fp8_pack(const void* x, bool f32, int64_t rows, int64_t cols, bool e4m3, bool transpose, int64_t ld, uint8_t* out,
              cudaStream_t stream, const float* block_scales, bool vec128) {
  const int64_t R = transpose ? cols : rows, C = transpose ? rows : cols;
  PRIMUS_CHECK(ld >= C, "fp8_pack: ld {} below the row length {}", ld, C);
  if (R * ld == 0) return;
  const scalar::Format f = e4m3 ? scalar::e4m3() : scalar::e5m2();
  const unsigned grid = blocks_for(R * ld, kThreads);
  const GemmScaleIndex gi = gemm_scale_index(true, vec128, R, C);  // the output is [outer, k]
  // One launch form for cuda_to_cpp.py: the kernel and its <<< on one line.
  // clang-format off
  if (f32)
    pack_kernel<float><<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x), out, cols, R, C, ld, transpose, f,
                                                      block_scales, gi);
  else
    pack_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(x), out, cols, R, C, ld,
                                                         transpose, f, block_scales, gi);
  // clang-format on
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
