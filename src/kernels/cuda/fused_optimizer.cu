// The multi-tensor AdamW step and the sum of squares (gradient clipping) over a device table of
// flat-buffer ranges.
//
// Work split: every range is cut into tiles of kTile elements (the last tile of a range may be
// shorter; a tile never crosses ranges). A one-block kernel turns the table into the exclusive
// prefix sum of tile counts (prefix[k] = first tile of range k, prefix[num] = all tiles) in
// scratch; the main kernel's blocks stride over the tiles and find a tile's range by binary search
// in the prefix (log2(num) cached loads per 4096 elements). Why this shape: the table lives on
// the device, so the host cannot size a (range, block-in-range) grid without a copy and a sync;
// tiles balance the load by elements rather than by ranges (one 500M-element embedding beside
// hundreds of 4096-element norms); and a whole tile shares one range, so the decay flag and the
// 16-byte alignment test are uniform per tile. Elements outside every range are never touched.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include <cmath>
#include <type_traits>

namespace primus::cuda {

using namespace fused_detail;

namespace {

constexpr int64_t kTile = 4096;
constexpr int kThreads = 256;
// Fixed grid of the tile loops: about one wave on an H100 (132 SMs x 8 blocks of 256), and fixed
// so that sum_squares' partials (one per block) never depend on the device.
constexpr int kTileBlocks = 1024;
constexpr int kPrefixThreads = 1024;

__device__ __forceinline__ int64_t tiles_of(const AdamWChunk& ch) {
  return ch.numel > 0 ? (ch.numel + kTile - 1) / kTile : 0;
}

// One block. Thread t owns ranges [t*per, (t+1)*per); block-wide scan of the owners' tile counts.
__global__ void __launch_bounds__(kPrefixThreads)
    tile_prefix_kernel(const AdamWChunk* __restrict__ chunks, int num, int64_t* __restrict__ prefix) {
  __shared__ int64_t warp_incl[kPrefixThreads / 32];
  const int per = (num + kPrefixThreads - 1) / kPrefixThreads;
  const int begin = min(num, int(threadIdx.x) * per), end = min(num, begin + per);
  int64_t local = 0;
  for (int k = begin; k < end; ++k) local += tiles_of(chunks[k]);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t incl = local;  // inclusive scan within the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t y = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_incl[warp] = incl;
  __syncthreads();
  if (warp == 0) {  // inclusive scan of the 32 warp totals
    int64_t w = warp_incl[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += y;
    }
    warp_incl[lane] = w;
  }
  __syncthreads();
  int64_t run = incl - local + (warp > 0 ? warp_incl[warp - 1] : 0);  // exclusive prefix of this thread
  for (int k = begin; k < end; ++k) {
    prefix[k] = run;
    run += tiles_of(chunks[k]);
  }
  if (threadIdx.x == kPrefixThreads - 1) prefix[num] = run;  // the last owner ends at the total
}

// The range k with prefix[k] <= t < prefix[k + 1] (so range k is not empty); needs 0 <= t < prefix[num].
__device__ __forceinline__ int find_range(const int64_t* __restrict__ prefix, int num, int64_t t) {
  int lo = 0, hi = num;  // invariant: prefix[lo] <= t < prefix[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

struct AdamWConsts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size, inv_sqrt_bc2, eps, decay, grad_scale;
  bool bf16_params;
};

// The update of optim/adamw.cpp, with explicit roundings so that nvcc cannot contract it any other
// way. The CPU loop, as GCC compiles it (-O3, x86-64-v3: C++ contracts a*b+c into FMA by default),
// computes m = fma(b1, m, (1-b1) g), v = fma(b2, v, ((1-b2) g) g),
// p = fma(p, decay, -(step_size m) / fma(sqrt(v), inv_sqrt_bc2, eps)): we do the same.
__device__ __forceinline__ void adamw_update(float& p, float& m, float& v, float grad, float decay,
                                             const AdamWConsts& c) {
  const float g = __fmul_rn(grad, c.grad_scale);
  m = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, g));
  v = __fmaf_rn(c.beta2, v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float den = __fmaf_rn(__fsqrt_rn(v), c.inv_sqrt_bc2, c.eps);
  const float upd = __fdiv_rn(__fmul_rn(c.step_size, m), den);
  p = __fmaf_rn(p, decay, -upd);
  if (c.bf16_params) p = __bfloat162float(__float2bfloat16(p));  // nearest even
}

// A moment's storage: fp32, or bf16 read as fp32 and rounded to nearest even on store.
__device__ __forceinline__ float load_moment(const float* x, int64_t e) { return x[e]; }
__device__ __forceinline__ float load_moment(const bf16* x, int64_t e) { return __bfloat162float(x[e]); }
__device__ __forceinline__ void store_moment(float* x, int64_t e, float v) { x[e] = v; }
__device__ __forceinline__ void store_moment(bf16* x, int64_t e, float v) { x[e] = __float2bfloat16(v); }

// M, V: the moments' storage (float or bf16). The float4 path is taken with fp32 moments only.
template <bool kBf16, class M, class V>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ params, const float* __restrict__ grads, M* __restrict__ exp_avg,
                 V* __restrict__ exp_avg_sq, bf16* __restrict__ params_bf16, const AdamWChunk* __restrict__ chunks,
                 int num, const int64_t* __restrict__ prefix, AdamWConsts c, bool bases_aligned) {
  const int64_t total = prefix[num];
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {  // uniform over the block
    const int k = find_range(prefix, num, t);
    const AdamWChunk ch = chunks[k];
    const int64_t begin = ch.offset + (t - prefix[k]) * kTile;
    const int64_t end = std::min(begin + kTile, ch.offset + ch.numel);
    const float decay = ch.decay ? c.decay : 1.0f;
    int64_t e0 = begin;
    constexpr bool kVector = std::is_same_v<M, float> && std::is_same_v<V, float>;
    if (kVector && bases_aligned && (begin & 3) == 0) {  // float4 of each buffer (and 4 bf16 = 8 bytes)
      const int64_t nv = (end - begin) / 4;
      for (int64_t q = threadIdx.x; q < nv; q += kThreads) {
        const int64_t e = begin + q * 4;
        float4 p = *reinterpret_cast<const float4*>(params + e);
        const float4 g = *reinterpret_cast<const float4*>(grads + e);
        float4 m = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(exp_avg) + e);
        float4 v = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(exp_avg_sq) + e);
        adamw_update(p.x, m.x, v.x, g.x, decay, c);
        adamw_update(p.y, m.y, v.y, g.y, decay, c);
        adamw_update(p.z, m.z, v.z, g.z, decay, c);
        adamw_update(p.w, m.w, v.w, g.w, decay, c);
        __stwb(reinterpret_cast<float4*>(params + e), p);
        __stwb(reinterpret_cast<float4*>(reinterpret_cast<float*>(exp_avg) + e), m);
        __stwb(reinterpret_cast<float4*>(reinterpret_cast<float*>(exp_avg_sq) + e), v);
        if constexpr (kBf16) {
          __stwb(reinterpret_cast<uint2*>(params_bf16 + e), make_uint2(pack_bf16x2(p.x, p.y), pack_bf16x2(p.z, p.w)));
        }
      }
      e0 = begin + nv * 4;  // the last 0-3 elements of the range, below
    }
    for (int64_t e = e0 + threadIdx.x; e < end; e += kThreads) {
      float p = params[e], m = load_moment(exp_avg, e), v = load_moment(exp_avg_sq, e);
      adamw_update(p, m, v, grads[e], decay, c);
      params[e] = p;
      store_moment(exp_avg, e, m);
      store_moment(exp_avg_sq, e, v);
      if constexpr (kBf16) params_bf16[e] = __float2bfloat16(p);
    }
  }
}

// Stage 1 of sum_squares: block b adds x^2 (fp64) over tiles b, b + kTileBlocks, ...; each thread
// in a fixed element order, then the block tree: partial[b]. Stage 2: one block adds the partials.
__global__ void __launch_bounds__(kThreads)
    sum_squares_partial_kernel(const float* __restrict__ x, const AdamWChunk* __restrict__ ranges, int num,
                               const int64_t* __restrict__ prefix, bool base_aligned, double* __restrict__ partial) {
  __shared__ double red[kThreads / 32];
  const int64_t total = prefix[num];
  double acc = 0;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int k = find_range(prefix, num, t);
    const AdamWChunk ch = ranges[k];
    const int64_t begin = ch.offset + (t - prefix[k]) * kTile;
    const int64_t end = std::min(begin + kTile, ch.offset + ch.numel);
    int64_t e0 = begin;
    if (base_aligned && (begin & 3) == 0) {
      const int64_t nv = (end - begin) / 4;
      for (int64_t q = threadIdx.x; q < nv; q += kThreads) {
        const float4 v = *reinterpret_cast<const float4*>(x + begin + q * 4);
        acc += double(v.x) * double(v.x);
        acc += double(v.y) * double(v.y);
        acc += double(v.z) * double(v.z);
        acc += double(v.w) * double(v.w);
      }
      e0 = begin + nv * 4;
    }
    for (int64_t e = e0 + threadIdx.x; e < end; e += kThreads) acc += double(x[e]) * double(x[e]);
  }
  const double s = block_sum<kThreads>(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads)
    sum_squares_total_kernel(const double* __restrict__ partial, int num_partials, double* __restrict__ out) {
  __shared__ double red[kThreads / 32];
  double acc = 0;
  for (int b = threadIdx.x; b < num_partials; b += kThreads) acc += partial[b];
  const double s = block_sum<kThreads>(acc, red);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

namespace {

template <bool kBf16, class M, class V>
void launch_adamw(float* params, const float* grads, void* exp_avg, void* exp_avg_sq, bf16* params_bf16,
                  const AdamWChunk* chunks, int num_chunks, const int64_t* prefix, const AdamWConsts& c, bool aligned,
                  cudaStream_t stream) {
  adamw_kernel<kBf16, M, V><<<kTileBlocks, kThreads, 0, stream>>>(params, grads, static_cast<M*>(exp_avg),
                                                                  static_cast<V*>(exp_avg_sq), params_bf16, chunks,
                                                                  num_chunks, prefix, c, aligned);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

// The kernel for the moments' dtypes.
template <bool kBf16>
void launch_adamw_for(const AdamWParams& p, float* params, const float* grads, void* exp_avg, void* exp_avg_sq,
                      bf16* params_bf16, const AdamWChunk* chunks, int num_chunks, const int64_t* prefix,
                      const AdamWConsts& c, bool aligned, cudaStream_t stream) {
  if (!p.exp_avg_bf16 && !p.exp_avg_sq_bf16)
    launch_adamw<kBf16, float, float>(params, grads, exp_avg, exp_avg_sq, params_bf16, chunks, num_chunks, prefix, c,
                                      aligned, stream);
  else if (!p.exp_avg_bf16)
    launch_adamw<kBf16, float, bf16>(params, grads, exp_avg, exp_avg_sq, params_bf16, chunks, num_chunks, prefix, c,
                                     aligned, stream);
  else if (!p.exp_avg_sq_bf16)
    launch_adamw<kBf16, bf16, float>(params, grads, exp_avg, exp_avg_sq, params_bf16, chunks, num_chunks, prefix, c,
                                     aligned, stream);
  else
    launch_adamw<kBf16, bf16, bf16>(params, grads, exp_avg, exp_avg_sq, params_bf16, chunks, num_chunks, prefix, c,
                                    aligned, stream);
}

}  // namespace

void adamw_step(float* params, const float* grads, void* exp_avg, void* exp_avg_sq, bf16* params_bf16,
                const AdamWChunk* chunks, int num_chunks, const AdamWParams& p, cudaStream_t stream) {
  if (num_chunks <= 0) return;
  PRIMUS_CHECK(p.step >= 1, "adamw_step: step must be >= 1 (counted after the increment), got {}", p.step);
  // Constants exactly as optim/adamw.cpp derives them: in double, then cast to float.
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(p.step));
  const double bc2 = 1.0 - std::pow(b2, double(p.step));
  AdamWConsts c{};
  c.beta1 = float(b1);
  c.beta2 = float(b2);
  c.one_minus_beta1 = float(1.0 - b1);
  c.one_minus_beta2 = float(1.0 - b2);
  c.step_size = float(lr / bc1);
  c.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  c.eps = float(p.eps);
  c.decay = float(1.0 - lr * p.weight_decay);
  c.grad_scale = float(p.grad_scale);
  c.bf16_params = p.bf16_params;

  Scratch prefix(size_t(num_chunks + 1) * sizeof(int64_t));  // stream-ordered reuse (see fused_norm.cu)
  tile_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(chunks, num_chunks, prefix.as<int64_t>());
  PRIMUS_CUDA_CHECK_LAUNCH();
  const bool aligned = aligned16(params) && aligned16(grads) && aligned16(exp_avg) && aligned16(exp_avg_sq) &&
                       (!params_bf16 || (reinterpret_cast<uintptr_t>(params_bf16) & 7u) == 0);
  if (params_bf16)
    launch_adamw_for<true>(p, params, grads, exp_avg, exp_avg_sq, params_bf16, chunks, num_chunks, prefix.as<int64_t>(),
                           c, aligned, stream);
  else
    launch_adamw_for<false>(p, params, grads, exp_avg, exp_avg_sq, nullptr, chunks, num_chunks, prefix.as<int64_t>(), c,
                            aligned, stream);
}

void sum_squares(const float* x, const AdamWChunk* ranges, int num_ranges, double* out, cudaStream_t stream) {
  if (num_ranges <= 0) {  // an empty sum: 0.0 (all-zero bits)
    PRIMUS_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  Scratch prefix(size_t(num_ranges + 1) * sizeof(int64_t));
  Scratch partial(size_t(kTileBlocks) * sizeof(double));
  tile_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(ranges, num_ranges, prefix.as<int64_t>());
  PRIMUS_CUDA_CHECK_LAUNCH();
  sum_squares_partial_kernel<<<kTileBlocks, kThreads, 0, stream>>>(x, ranges, num_ranges, prefix.as<int64_t>(),
                                                                   aligned16(x), partial.as<double>());
  PRIMUS_CUDA_CHECK_LAUNCH();
  sum_squares_total_kernel<<<1, kThreads, 0, stream>>>(partial.as<double>(), kTileBlocks, out);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
