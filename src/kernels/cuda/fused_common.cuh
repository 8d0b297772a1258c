// Internal helpers of the fused kernels (fused_*.cu): 16-byte bf16/fp32 vector loads and stores,
// deterministic warp and block reductions, grid sizing. Not part of the public interface.
#pragma once


#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/fused.h"
#include "kernels/cuda/runtime.h"

namespace primus::cuda::fused_detail {

constexpr unsigned kFullMask = 0xffffffffu;
// Upper bound of a grid-stride kernel's grid: enough blocks to fill any GPU several times over;
// each block loops over the rest. Independent of the device, so results never depend on it.
constexpr int64_t kMaxBlocks = 16384;

inline unsigned blocks_for(int64_t items, int64_t items_per_block) {
  const int64_t b = (items + items_per_block - 1) / items_per_block;
  return static_cast<unsigned>(std::min(std::max<int64_t>(b, 1), kMaxBlocks));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- 8 bf16 <-> 8 floats through one 16-byte access (the pointer must be 16-byte aligned) ----
// A bf16 pair in one 32-bit word: the lower address (the first element) in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // round to nearest even
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

__device__ __forceinline__ void load_bf16x8(const bf16* p, float (&f)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const float2 a = unpack_bf16x2(u.x), b = unpack_bf16x2(u.y), c = unpack_bf16x2(u.z), d = unpack_bf16x2(u.w);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

// Stores go through __stwb (st.global.wb, the default cache policy) so that they stay one 16-byte
// instruction: a plain `*(uint4*)p = v` gets split into four 4-byte stores in unrolled loops.
__device__ __forceinline__ void store_bf16x8(bf16* p, const float (&f)[8]) {
  __stwb(reinterpret_cast<uint4*>(p),
         make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7])));
}

// V consecutive bf16 at p (V = 8: one 16-byte access; V = 1: scalar). Global memory only.
template <int V>
__device__ __forceinline__ void load_bf16(const bf16* p, float (&f)[V]) {
  if constexpr (V == 8) {
    load_bf16x8(p, f);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = __bfloat162float(p[k]);
  }
}

template <int V>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&f)[V]) {
  if constexpr (V == 8) {
    store_bf16x8(p, f);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = __float2bfloat16(f[k]);
  }
}

// V consecutive floats at p (V = 8: two 16-byte accesses; V = 4: one). Global memory only (the
// stores are st.global).
template <int V>
__device__ __forceinline__ void load_f32(const float* p, float (&f)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 t = reinterpret_cast<const float4*>(p)[q];
      f[4 * q] = t.x;
      f[4 * q + 1] = t.y;
      f[4 * q + 2] = t.z;
      f[4 * q + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = p[k];
  }
}

template <int V>
__device__ __forceinline__ void store_f32(float* p, const float (&f)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int q = 0; q < V / 4; ++q)
      __stwb(reinterpret_cast<float4*>(p) + q, make_float4(f[4 * q], f[4 * q + 1], f[4 * q + 2], f[4 * q + 3]));
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = f[k];
  }
}

// The loads and stores above by element type, for code written once for both (the casts).
template <int V>
__device__ __forceinline__ void load_vec(const bf16* p, float (&f)[V]) { load_bf16<V>(p, f); }
template <int V>
__device__ __forceinline__ void load_vec(const float* p, float (&f)[V]) { load_f32<V>(p, f); }
template <int V>
__device__ __forceinline__ void store_vec(bf16* p, const float (&f)[V]) { store_bf16<V>(p, f); }
template <int V>
__device__ __forceinline__ void store_vec(float* p, const float (&f)[V]) { store_f32<V>(p, f); }

// Butterfly sums: every lane ends with the same bits (each step adds the same two operands, in
// either order), and the tree is fixed, so the result is deterministic.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Sum over a block of kThreads (a multiple of 32): warp butterflies, then warp 0 adds the warp
// sums in warp order. The result is valid in thread 0. Contains __syncthreads(): every thread of
// the block must call it. `shared` holds kThreads / 32 values.
template <int kThreads, typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block_sum: whole warps");
  constexpr int kWarps = kThreads / 32;
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  T total = T(0);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += shared[w];
  }
  __syncthreads();  // `shared` may be reused right after
  return total;
}

}  // namespace primus::cuda::fused_detail
