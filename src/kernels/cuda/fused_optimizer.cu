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
//
// Scaled states (fp16 / E4M3 moments, an fp16 master; kernels/adam_state.h): a chunk's scale
// depends on the amax of the whole chunk, which many blocks update. So a first pass over the same
// tiles computes the updated moments without storing them (and reads the parameters), folding each
// warp's amaxes into per-chunk words with atomicMax (a maximum, which no order changes);
// state_scales_kernel then turns them into each chunk's scalings; the update pass reads and stores
// with those.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include <cmath>
#include <type_traits>

#include "kernels/adam_state.h"

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

// Tile t of the chunks' tiles (prefix: the chunks' first tiles, prefix[num] the total): its chunk
// and its elements [begin, end).
struct TileSpan {
  int k;
  int64_t begin, end;
};
__device__ __forceinline__ TileSpan tile_span(int64_t t, const int64_t* prefix, int num, const AdamWChunk* chunks) {
  const int k = find_range(prefix, num, t);
  const AdamWChunk ch = chunks[k];
  const int64_t begin = ch.offset + (t - prefix[k]) * kTile;
  return {k, begin, std::min(begin + kTile, ch.offset + ch.numel)};
}

struct AdamWConsts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size, inv_sqrt_bc2, eps, decay, grad_scale;
  ParamStorage params;
};

// The moments' update of one element (optim/adamw.cpp's next_moments, the same fused multiply-adds).
__device__ __forceinline__ void adamw_moments(float& m, float& v, float grad, const AdamWConsts& c) {
  const float g = __fmul_rn(grad, c.grad_scale);
  m = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, g));
  v = __fmaf_rn(c.beta2, v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
}

// The update of optim/adamw.cpp, with explicit roundings so that nvcc cannot contract it any other
// way. The CPU loop writes its fused multiply-adds out: m = fma(b1, m, (1-b1) g),
// v = fma(b2, v, ((1-b2) g) g), p = fma(p, decay, -(step_size m) / fma(sqrt(v), inv_sqrt_bc2, eps)):
// we do the same. master: an fp16 master's scaling (the parameter read through it first).
__device__ __forceinline__ void adamw_update(float& p, float& m, float& v, float grad, float decay,
                                             const AdamWConsts& c, const adam_state::Scaling& master) {
  adamw_moments(m, v, grad, c);
  const float den = __fmaf_rn(__fsqrt_rn(v), c.inv_sqrt_bc2, c.eps);
  const float upd = __fdiv_rn(__fmul_rn(c.step_size, m), den);
  if (c.params == ParamStorage::F16Master) p = adam_state::f16_round_trip(p, master);
  p = __fmaf_rn(p, decay, -upd);
  if (c.params == ParamStorage::BF16) p = __bfloat162float(__float2bfloat16(p));  // nearest even
}

// A moment's storage: fp32, bf16 read as fp32 and rounded to nearest even on store, or fp16 / E4M3
// codes with the chunk's scalings (kernels/adam_state.h).
struct F32State {
  float* x;
  __device__ __forceinline__ float load(int64_t e) const { return x[e]; }
  __device__ __forceinline__ void store(int64_t e, float v) const { x[e] = v; }
};
struct Bf16State {
  bf16* x;
  __device__ __forceinline__ float load(int64_t e) const { return __bfloat162float(x[e]); }
  __device__ __forceinline__ void store(int64_t e, float v) const { x[e] = __float2bfloat16(v); }
};
template <class R>
__device__ __forceinline__ R state_at(void* base, float dequant, float quant) {
  if constexpr (std::is_same_v<R, F32State>)
    return R{static_cast<float*>(base)};
  else if constexpr (std::is_same_v<R, Bf16State>)
    return R{static_cast<bf16*>(base)};
  else if constexpr (std::is_same_v<R, adam_state::F16Ref>)
    return R{static_cast<uint16_t*>(base), dequant, quant};
  else
    return R{static_cast<uint8_t*>(base), dequant, quant};
}

// A chunk's scalings for one step: the moments' codes are read with `*_dequant` (those they were
// stored with) and stored with `*_quant` (this step's); the master's scaling.
struct ChunkScales {
  float m_dequant, m_quant, v_dequant, v_quant;
  adam_state::Scaling master;
};

// acc: per chunk 6 words, the bits of the largest |x| that is not NaN and a NaN flag, for the
// updated exp_avg, the updated exp_avg_sq and the parameters.
constexpr int kAmaxWords = 6;

// The warp's maximum of v and whether any lane saw a NaN (lane 0 folds them into acc).
__device__ __forceinline__ void fold_state_amax(unsigned* acc, unsigned v, unsigned nan) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned ov = __shfl_xor_sync(kFullMask, v, o), on = __shfl_xor_sync(kFullMask, nan, o);
    v = ov > v ? ov : v;
    nan = on > nan ? on : nan;
  }
  if ((threadIdx.x & 31) == 0) {
    if (nan) atomicMax(acc + 1, 1u);
    atomicMax(acc, v);
  }
}

__device__ __forceinline__ void track_amax(float x, unsigned& m, unsigned& nan) {
  const unsigned a = adam_state::abs_bits(x);
  if (adam_state::is_nan_bits(a))
    nan = 1;
  else
    m = a > m ? a : m;
}

// The first pass: per chunk the amaxes of the updated moments (computed as the update computes
// them, not stored) when `moments`, and of the parameters the step starts from when `params`.
template <class M, class V>
__global__ void __launch_bounds__(kThreads)
    state_amax_kernel(const float* __restrict__ params, const float* __restrict__ grads, void* exp_avg,
                      void* exp_avg_sq, const float* __restrict__ state_scales, const AdamWChunk* __restrict__ chunks,
                      int num, const int64_t* __restrict__ prefix, AdamWConsts c, bool moments, bool with_params,
                      unsigned* __restrict__ acc) {
  const int64_t total = prefix[num];
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {  // uniform over the block
    const TileSpan ts = tile_span(t, prefix, num, chunks);
    const int k = ts.k;
    const int64_t begin = ts.begin, end = ts.end;
    const M m = state_at<M>(exp_avg, state_scales ? state_scales[2 * k] : 1.0f, 0.0f);
    const V v = state_at<V>(exp_avg_sq, state_scales ? state_scales[2 * k + 1] : 1.0f, 0.0f);
    unsigned am = 0, nm = 0, av = 0, nv = 0, ap = 0, np = 0;
    for (int64_t e = begin + threadIdx.x; e < end; e += kThreads) {
      if (moments) {
        float mi = m.load(e), vi = v.load(e);
        adamw_moments(mi, vi, grads[e], c);
        track_amax(mi, am, nm);
        track_amax(vi, av, nv);
      }
      if (with_params) track_amax(params[e], ap, np);
    }
    unsigned* a = acc + int64_t(k) * kAmaxWords;
    if (moments) {
      fold_state_amax(a, am, nm);
      fold_state_amax(a + 2, av, nv);
    }
    if (with_params) fold_state_amax(a + 4, ap, np);
  }
}

__device__ __forceinline__ adam_state::Scaling chunk_scaling(StateStorage s, const unsigned* acc) {
  const float amax = adam_state::amax_value(acc[0], acc[1] != 0);
  return s == StateStorage::F16 ? adam_state::f16_scaling(amax) : adam_state::e4m3_scaling(amax);
}

// One thread per chunk: this step's scalings from the amaxes, and the moments' new dequantizing
// factors into state_scales (the update reads the old ones from `out`).
__global__ void __launch_bounds__(kThreads)
    state_scales_kernel(const unsigned* __restrict__ acc, float* __restrict__ state_scales, int num, StateStorage ms,
                        StateStorage vs, bool master, ChunkScales* __restrict__ out) {
  const int k = int(blockIdx.x) * kThreads + int(threadIdx.x);
  if (k >= num) return;
  const unsigned* a = acc + int64_t(k) * kAmaxWords;
  ChunkScales cs{1.0f, 1.0f, 1.0f, 1.0f, {}};
  const bool m_scaled = ms == StateStorage::F16 || ms == StateStorage::E4M3;
  const bool v_scaled = vs == StateStorage::F16 || vs == StateStorage::E4M3;
  if (m_scaled) {
    const adam_state::Scaling s = chunk_scaling(ms, a);
    cs.m_dequant = state_scales[2 * k];
    cs.m_quant = s.quant;
    state_scales[2 * k] = s.dequant;
  }
  if (v_scaled) {
    const adam_state::Scaling s = chunk_scaling(vs, a + 2);
    cs.v_dequant = state_scales[2 * k + 1];
    cs.v_quant = s.quant;
    state_scales[2 * k + 1] = s.dequant;
  }
  if (master) cs.master = adam_state::f16_scaling(adam_state::amax_value(a[4], a[5] != 0));
  out[k] = cs;
}

// M, V: the moments' storage (the structs above). The float4 path is taken with fp32 moments only.
// scales: each chunk's scalings (null when nothing is scaled).
template <bool kBf16, class M, class V>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ params, const float* __restrict__ grads, void* exp_avg, void* exp_avg_sq,
                 bf16* __restrict__ params_bf16, const AdamWChunk* __restrict__ chunks, int num,
                 const int64_t* __restrict__ prefix, AdamWConsts c, bool bases_aligned,
                 const ChunkScales* __restrict__ scales) {
  const int64_t total = prefix[num];
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {  // uniform over the block
    const TileSpan ts = tile_span(t, prefix, num, chunks);
    const int k = ts.k;
    const int64_t begin = ts.begin, end = ts.end;
    const float decay = chunks[k].decay ? c.decay : 1.0f;
    const ChunkScales cs = scales ? scales[k] : ChunkScales{1.0f, 1.0f, 1.0f, 1.0f, {}};
    const M ms = state_at<M>(exp_avg, cs.m_dequant, cs.m_quant);
    const V vs = state_at<V>(exp_avg_sq, cs.v_dequant, cs.v_quant);
    int64_t e0 = begin;
    constexpr bool kVector = std::is_same_v<M, F32State> && std::is_same_v<V, F32State>;
    if (kVector && bases_aligned && (begin & 3) == 0) {  // float4 of each buffer (and 4 bf16 = 8 bytes)
      const int64_t nv = (end - begin) / 4;
      for (int64_t q = threadIdx.x; q < nv; q += kThreads) {
        const int64_t e = begin + q * 4;
        float4 p = *reinterpret_cast<const float4*>(params + e);
        const float4 g = *reinterpret_cast<const float4*>(grads + e);
        float4 m = *reinterpret_cast<const float4*>(static_cast<const float*>(exp_avg) + e);
        float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(exp_avg_sq) + e);
        adamw_update(p.x, m.x, v.x, g.x, decay, c, cs.master);
        adamw_update(p.y, m.y, v.y, g.y, decay, c, cs.master);
        adamw_update(p.z, m.z, v.z, g.z, decay, c, cs.master);
        adamw_update(p.w, m.w, v.w, g.w, decay, c, cs.master);
        __stwb(reinterpret_cast<float4*>(params + e), p);
        __stwb(reinterpret_cast<float4*>(static_cast<float*>(exp_avg) + e), m);
        __stwb(reinterpret_cast<float4*>(static_cast<float*>(exp_avg_sq) + e), v);
        if constexpr (kBf16) {
          __stwb(reinterpret_cast<uint2*>(params_bf16 + e), make_uint2(pack_bf16x2(p.x, p.y), pack_bf16x2(p.z, p.w)));
        }
      }
      e0 = begin + nv * 4;  // the last 0-3 elements of the range, below
    }
    for (int64_t e = e0 + threadIdx.x; e < end; e += kThreads) {
      float p = params[e], m = ms.load(e), v = vs.load(e);
      adamw_update(p, m, v, grads[e], decay, c, cs.master);
      params[e] = p;
      ms.store(e, m);
      vs.store(e, v);
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
    const TileSpan ts = tile_span(t, prefix, num, ranges);
    const int k = ts.k;
    const int64_t begin = ts.begin, end = ts.end;
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

bool scaled_storage(StateStorage s) { return s == StateStorage::F16 || s == StateStorage::E4M3; }

// One step for the moments' storage M, V: the amax pass and the scales when something is scaled,
// then the update.
template <class M, class V>
void launch_adamw(float* params, const float* grads, void* exp_avg, void* exp_avg_sq, bf16* params_bf16,
                  const AdamWChunk* chunks, int num, const int64_t* prefix, const AdamWParams& p, const AdamWConsts& c,
                  bool aligned, cudaStream_t stream) {
  const bool moments = scaled_storage(p.exp_avg) || scaled_storage(p.exp_avg_sq),
             master = p.params == ParamStorage::F16Master;
  PRIMUS_CHECK(!moments || p.state_scales, "adamw_step: fp16 / E4M3 moments need state_scales");
  Scratch acc(moments || master ? size_t(num) * kAmaxWords * sizeof(unsigned) : 0);
  Scratch scales(moments || master ? size_t(num) * sizeof(ChunkScales) : 0);
  if (moments || master) {
    PRIMUS_CUDA_CHECK(cudaMemsetAsync(acc.get(), 0, acc.bytes(), stream));
    state_amax_kernel<M, V><<<kTileBlocks, kThreads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, p.state_scales,
                                                                  chunks, num, prefix, c, moments, master,
                                                                  acc.as<unsigned>());
    PRIMUS_CUDA_CHECK_LAUNCH();
    state_scales_kernel<<<unsigned((num + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        acc.as<unsigned>(), p.state_scales, num, p.exp_avg, p.exp_avg_sq, master, scales.as<ChunkScales>());
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
  const ChunkScales* cs = moments || master ? scales.as<ChunkScales>() : nullptr;
  if (params_bf16)
    adamw_kernel<true, M, V><<<kTileBlocks, kThreads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, params_bf16,
                                                                   chunks, num, prefix, c, aligned, cs);
  else
    adamw_kernel<false, M, V><<<kTileBlocks, kThreads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, nullptr, chunks,
                                                                    num, prefix, c, aligned, cs);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

// f called with a value of the storage struct of s (its type is all that matters).
template <class F>
void with_storage(StateStorage s, F&& f) {
  switch (s) {
    case StateStorage::BF16: return f(Bf16State{});
    case StateStorage::F16: return f(adam_state::F16Ref{});
    case StateStorage::E4M3: return f(adam_state::E4m3Ref{});
    default: return f(F32State{});
  }
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
  c.params = p.params;

  Scratch prefix(size_t(num_chunks + 1) * sizeof(int64_t));  // stream-ordered reuse (see fused_norm.cu)
  tile_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(chunks, num_chunks, prefix.as<int64_t>());
  PRIMUS_CUDA_CHECK_LAUNCH();
  const bool aligned = aligned16(params) && aligned16(grads) && aligned16(exp_avg) && aligned16(exp_avg_sq) &&
                       (!params_bf16 || (reinterpret_cast<uintptr_t>(params_bf16) & 7u) == 0);
  with_storage(p.exp_avg, [&](auto m) {
    with_storage(p.exp_avg_sq, [&](auto v) {
      launch_adamw<decltype(m), decltype(v)>(params, grads, exp_avg, exp_avg_sq, params_bf16, chunks, num_chunks,
                                             prefix.as<int64_t>(), p, c, aligned, stream);
    });
  });
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
