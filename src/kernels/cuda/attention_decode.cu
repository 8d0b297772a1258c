// Causal attention of a few query rows against a key/value cache, for decoding (flash_attention.h).
// One CTA per (query row, head), kWarps warps: warp w takes keys w, w + kWarps, ...; its 32 lanes
// split the head dimension (D / 32 values each), compute each score with a butterfly sum, and keep
// an online softmax (running max m, sum l, and the lane's slice of the weighted value sum). The
// warps' states are merged through shared memory at the end. Work per token is O(position), the
// point of the cache; there is nothing to tile for one query row.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/runtime.h"

namespace primus::cuda {

using namespace fused_detail;

namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

template <int P>  // values of the head dimension per lane: head_dim / 32
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(const bf16* __restrict__ cache, int64_t first, bf16* __restrict__ out, int64_t stride,
                            int heads, int groups, int64_t window, const float* __restrict__ sinks) {
  constexpr int D = P * 32;
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = first + blockIdx.y;
  const int g = h / (heads / groups);
  const bf16* q = cache + row * stride + int64_t(h) * D;
  const int64_t k_off = int64_t(heads) * D + int64_t(g) * D, v_off = int64_t(heads + groups) * D + int64_t(g) * D;
  const float scale = 1.0f / sqrtf(float(D));
  float qv[P], acc[P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    qv[k] = __bfloat162float(q[lane + 32 * k]) * scale;
    acc[k] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int64_t t_lo = window >= 0 && row > window ? row - window : 0;  // the sliding window's first key
  for (int64_t t = t_lo + warp; t <= row; t += kWarps) {
    const bf16* kr = cache + t * stride + k_off;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < P; ++k) s += qv[k] * __bfloat162float(kr[lane + 32 * k]);
    s = warp_sum(s);  // every lane holds the score
    const float mn = fmaxf(m, s);
    const float c = expf(m - mn), p = expf(s - mn);  // m = -inf on the first key: c = 0
    const bf16* vr = cache + t * stride + v_off;
#pragma unroll
    for (int k = 0; k < P; ++k) acc[k] = acc[k] * c + p * __bfloat162float(vr[lane + 32 * k]);
    l = l * c + p;
    m = mn;
  }
  __shared__ float sm[kWarps];
  __shared__ float sl[kWarps];
  __shared__ float sacc[kWarps][kMaxPerLane * 32];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int k = 0; k < P; ++k) sacc[warp][lane + 32 * k] = acc[k];
  __syncthreads();
  if (warp != 0) return;
  // A sink (a key of score sinks[h], value 0) joins the denominator alone.
  float mx = sinks ? sinks[h] : -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w]);  // warp 0 saw key t_lo, so mx is finite
  float total = sinks ? expf(sinks[h] - mx) : 0.f, o[P];
#pragma unroll
  for (int k = 0; k < P; ++k) o[k] = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    const float f = sm[w] == -INFINITY ? 0.f : expf(sm[w] - mx);  // a warp with no key adds nothing
    total += sl[w] * f;
#pragma unroll
    for (int k = 0; k < P; ++k) o[k] += sacc[w][lane + 32 * k] * f;
  }
  bf16* dst = out + int64_t(blockIdx.y) * heads * D + int64_t(h) * D;
#pragma unroll
  for (int k = 0; k < P; ++k) dst[lane + 32 * k] = __float2bfloat16(o[k] / total);
}

}  // namespace

void attention_decode(const bf16* cache, int64_t first, bf16* out, const AttentionDims& d, cudaStream_t stream) {
  const std::string why = attention_decode_unsupported(d);
  if (!why.empty()) fail("attention_decode: {}", why);
  if (first < 0 || first >= d.seq) fail("attention_decode: first row {} outside 0..{}", first, d.seq - 1);
  const dim3 grid(unsigned(d.heads), unsigned(d.seq - first));
  const int64_t stride = d.qkv_stride();
  const int heads = int(d.heads), groups = int(d.groups);
  const int64_t window = d.window;
  const float* sinks = d.sinks;
  switch (d.head_dim / 32) {
    case 1: attention_decode_kernel<1><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
    case 2: attention_decode_kernel<2><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
    case 3: attention_decode_kernel<3><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
    case 4: attention_decode_kernel<4><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
    case 5: attention_decode_kernel<5><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
    case 6: attention_decode_kernel<6><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
    case 7: attention_decode_kernel<7><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
    default: attention_decode_kernel<8><<<grid, kWarps * 32, 0, stream>>>(cache, first, out, stride, heads, groups, window, sinks); break;
  }
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
