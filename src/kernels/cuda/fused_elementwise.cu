// Element-wise kernels: SwiGLU, rotary embedding, token embedding (forward and the grouped,
// deterministic backward), addition, casts; and EmbeddingGrouping::build (host).
//
// Each is a grid-stride loop over "items" of V consecutive elements of one row: V = 8 (one 16-byte
// bf16 access) when the row length is a multiple of 8 and the buffers are 16-byte aligned, else
// V = 1. Consecutive threads take consecutive items, so a warp touches contiguous memory.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "kernels/dropout_mask.h"

namespace primus::cuda {

using namespace fused_detail;

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf_(float v) { return 1.0f / (1.0f + expf(-v)); }

// ---- SwiGLU: row i is [gate (f) | up (f)] ----
template <int V>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const bf16* __restrict__ gate_up, bf16* __restrict__ act, int64_t n, int64_t f,
                          GluArgs glu) {
  const int64_t fv = f / V, total = n * fv;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t i = idx / fv, j = (idx - i * fv) * V;
    const bf16* g = gate_up + i * 2 * f + j;
    float gv[V], uv[V], out[V];
    load_bf16<V>(g, gv);
    load_bf16<V>(g + f, uv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float g_c = glu.limit > 0.f ? fminf(gv[k], glu.limit) : gv[k];
      const float u_c = glu.limit > 0.f ? fminf(fmaxf(uv[k], -glu.limit), glu.limit) : uv[k];
      out[k] = g_c * sigmoidf_(glu.alpha * g_c) * (glu.offset == 0.f ? u_c : u_c + glu.offset);
    }
    store_bf16<V>(act + i * f + j, out);
  }
}

// silu'(g) = s * (1 + g * (1 - s)), s = sigmoid(g) (as the CPU kernel); with glu's alpha, s =
// sigmoid(alpha g) and the derivative s (1 + alpha g (1 - s)); a clamped value passes nothing.
template <int V>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const bf16* __restrict__ dact, const bf16* __restrict__ gate_up,
                           bf16* __restrict__ dgate_up, int64_t n, int64_t f, GluArgs glu) {
  const int64_t fv = f / V, total = n * fv;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t i = idx / fv, j = (idx - i * fv) * V;
    const bf16* g = gate_up + i * 2 * f + j;
    float gv[V], uv[V], dav[V], dg[V], du[V];
    load_bf16<V>(g, gv);
    load_bf16<V>(g + f, uv);
    load_bf16<V>(dact + i * f + j, dav);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const bool clamp = glu.limit > 0.f;
      const float g_c = clamp ? fminf(gv[k], glu.limit) : gv[k];
      const float u_c = clamp ? fminf(fmaxf(uv[k], -glu.limit), glu.limit) : uv[k];
      const float s = sigmoidf_(glu.alpha * g_c);
      const float silu = g_c * s;
      const float up = glu.offset == 0.f ? u_c : u_c + glu.offset;
      dg[k] = !clamp || gv[k] <= glu.limit ? dav[k] * up * s * (1.0f + glu.alpha * g_c * (1.0f - s)) : 0.f;
      du[k] = !clamp || (uv[k] >= -glu.limit && uv[k] <= glu.limit) ? dav[k] * silu : 0.f;
    }
    bf16* dgr = dgate_up + i * 2 * f + j;
    store_bf16<V>(dgr, dg);
    store_bf16<V>(dgr + f, du);
  }
}

// ---- RoPE: item = V pairs (i, i + half) of one head of one row ----
template <int V>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(bf16* __restrict__ x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim, int64_t seq,
                int64_t pos0, const float* __restrict__ cos, const float* __restrict__ sin, float sign) {
  const int64_t half = head_dim / 2, hv = half / V, total = rows * heads * hv;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t i = (idx % hv) * V;
    const int64_t rh = idx / hv;
    const int64_t h = rh % heads, r = rh / heads;
    const int64_t pos = pos0 + r % seq;
    bf16* v = x + r * stride + h * head_dim + i;
    float a[V], b[V], cv[V], sv[V], na[V], nb[V];
    load_bf16<V>(v, a);
    load_bf16<V>(v + half, b);
    load_f32<V>(cos + pos * half + i, cv);
    load_f32<V>(sin + pos * half + i, sv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float s = sign * sv[k];
      na[k] = a[k] * cv[k] - b[k] * s;
      nb[k] = b[k] * cv[k] + a[k] * s;
    }
    store_bf16<V>(v, na);
    store_bf16<V>(v + half, nb);
  }
}

// ---- Embedding ----
template <int V>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(const int32_t* __restrict__ tokens, const bf16* __restrict__ table,
                             bf16* __restrict__ out, int64_t n, int64_t c) {
  const int64_t cv = c / V, total = n * cv;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t i = idx / cv, j = (idx - i * cv) * V;
    const int64_t tok = tokens[i];
    bf16* dst = out + i * c + j;
    if (tok < 0) {  // a token of another vocabulary shard: a zero row
      const float zero[V] = {};
      store_bf16<V>(dst, zero);
      continue;
    }
    const bf16* src = table + tok * c + j;
    if constexpr (V == 8) {
      __stwb(reinterpret_cast<uint4*>(dst), *reinterpret_cast<const uint4*>(src));
    } else {
      *dst = *src;
    }
  }
}

// One block per unique token (blocks stride over the tokens); threads over columns. Each column's
// sum runs over the token's positions in ascending order, from 0, then is added into dtable: with
// a zero dtable the bits equal the CPU kernel's sequential accumulation.
constexpr int kEmbThreads = 128;

template <int V>
__global__ void __launch_bounds__(kEmbThreads)
    embedding_backward_kernel(const int32_t* __restrict__ unique_tokens, const int32_t* __restrict__ offsets,
                              const int32_t* __restrict__ positions, int64_t num_unique,
                              const bf16* __restrict__ dout, float* __restrict__ dtable, int64_t c) {
  for (int64_t u = blockIdx.x; u < num_unique; u += gridDim.x) {
    const int64_t tok = unique_tokens[u];
    const int32_t p0 = offsets[u], p1 = offsets[u + 1];
    for (int64_t j = int64_t(threadIdx.x) * V; j < c; j += int64_t(kEmbThreads) * V) {
      float acc[V];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = 0.f;
      for (int32_t p = p0; p < p1; ++p) {
        float d[V];
        load_bf16<V>(dout + int64_t(positions[p]) * c + j, d);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += d[k];
      }
      float* dst = dtable + tok * c + j;
      float cur[V];
      load_f32<V>(dst, cur);
#pragma unroll
      for (int k = 0; k < V; ++k) cur[k] += acc[k];
      store_f32<V>(dst, cur);
    }
  }
}

// ---- out = a + b (bf16, fp32 arithmetic, one rounding) ----
template <int V, typename T>
__global__ void __launch_bounds__(kThreads)
    add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* out, int64_t n) {
  const int64_t nv = n / V;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < nv; idx += int64_t(gridDim.x) * kThreads) {
    float x[V], y[V];
    load_vec<V>(a + idx * V, x);
    load_vec<V>(b + idx * V, y);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] += y[k];
    store_vec<V>(out + idx * V, x);
  }
}

// ---- Dropout: one element per thread and step (the mask is per element) ----
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dropout_kernel(const T* x, T* y, int64_t n, uint64_t seed, uint32_t threshold, float scale) {
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * kThreads) {
    float v[1];
    load_vec<1>(x + idx, v);
    v[0] = ops::dropout_hash(seed, uint64_t(idx)) >= threshold ? v[0] * scale : 0.0f;
    store_vec<1>(y + idx, v);
  }
}

// ---- Casts: vectors of 8 over the first n - n % 8 elements, block 0 takes the tail ----
template <int V, typename From, typename To>
__global__ void __launch_bounds__(kThreads) cast_kernel(const From* __restrict__ src, To* __restrict__ dst, int64_t n) {
  const int64_t nv = n / V;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < nv; idx += int64_t(gridDim.x) * kThreads) {
    float f[V];
    load_vec<V>(src + idx * V, f);
    store_vec<V>(dst + idx * V, f);
  }
  if (blockIdx.x == 0 && threadIdx.x < n - nv * V) {
    const int64_t e = nv * V + threadIdx.x;
    float f[1];
    load_vec<1>(src + e, f);
    store_vec<1>(dst + e, f);
  }
}

template <typename From, typename To>
void launch_cast(const From* src, To* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(src) && aligned16(dst))
    cast_kernel<8, From, To><<<blocks_for(std::max<int64_t>(n / 8, 1), kThreads), kThreads, 0, stream>>>(src, dst, n);
  else
    cast_kernel<1, From, To><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(src, dst, n);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_forward(const bf16* gate_up, bf16* act, int64_t n, int64_t f, cudaStream_t stream, const GluArgs& glu) {
  if (n <= 0 || f <= 0) return;
  if (f % 8 == 0 && aligned16(gate_up) && aligned16(act))
    swiglu_forward_kernel<8><<<blocks_for(n * (f / 8), kThreads), kThreads, 0, stream>>>(gate_up, act, n, f, glu);
  else
    swiglu_forward_kernel<1><<<blocks_for(n * f, kThreads), kThreads, 0, stream>>>(gate_up, act, n, f, glu);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const bf16* dact, const bf16* gate_up, bf16* dgate_up, int64_t n, int64_t f,
                     cudaStream_t stream, const GluArgs& glu) {
  if (n <= 0 || f <= 0) return;
  if (f % 8 == 0 && aligned16(dact) && aligned16(gate_up) && aligned16(dgate_up))
    swiglu_backward_kernel<8><<<blocks_for(n * (f / 8), kThreads), kThreads, 0, stream>>>(dact, gate_up, dgate_up,
                                                                                          n, f, glu);
  else
    swiglu_backward_kernel<1><<<blocks_for(n * f, kThreads), kThreads, 0, stream>>>(dact, gate_up, dgate_up, n, f,
                                                                                   glu);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void rope_apply(bf16* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0,
                const float* cos, const float* sin, bool inverse, cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  if (rows <= 0 || heads <= 0 || half <= 0) return;
  PRIMUS_CHECK(seq > 0, "rope_apply: seq must be positive, got {}", seq);
  const float sign = inverse ? -1.0f : 1.0f;
  // The vector path needs every pair start (row, head, i) 16-byte aligned in x, cos and sin.
  if (half % 8 == 0 && stride % 8 == 0 && aligned16(x) && aligned16(cos) && aligned16(sin))
    rope_kernel<8><<<blocks_for(rows * heads * (half / 8), kThreads), kThreads, 0, stream>>>(
        x, rows, stride, heads, head_dim, seq, pos0, cos, sin, sign);
  else
    rope_kernel<1><<<blocks_for(rows * heads * half, kThreads), kThreads, 0, stream>>>(x, rows, stride, heads,
                                                                                       head_dim, seq, pos0, cos,
                                                                                       sin, sign);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void embedding_forward(const int32_t* tokens, const bf16* table, bf16* out, int64_t n, int64_t c,
                       cudaStream_t stream) {
  if (n <= 0 || c <= 0) return;
  if (c % 8 == 0 && aligned16(table) && aligned16(out))
    embedding_forward_kernel<8><<<blocks_for(n * (c / 8), kThreads), kThreads, 0, stream>>>(tokens, table, out, n,
                                                                                            c);
  else
    embedding_forward_kernel<1><<<blocks_for(n * c, kThreads), kThreads, 0, stream>>>(tokens, table, out, n, c);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

EmbeddingGrouping EmbeddingGrouping::build(const int32_t* tokens, int64_t n) {
  if (n < 0) fail("EmbeddingGrouping::build: negative token count {}", n);
  if (n > INT32_MAX) fail("EmbeddingGrouping::build: {} positions exceed the int32 position index", n);
  EmbeddingGrouping g;
  // Sort keys (token, position): tokens ascending, positions ascending within a token.
  std::vector<int64_t> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    keys[size_t(i)] = int64_t(uint64_t(int64_t(tokens[i])) << 32) | int64_t(uint32_t(i));
  std::sort(keys.begin(), keys.end());
  g.positions.resize(size_t(n));
  g.offsets.reserve(size_t(n) + 1);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t key = keys[size_t(k)];
    const int32_t tok = int32_t(key >> 32);  // arithmetic shift: negative ids survive
    g.positions[size_t(k)] = int32_t(uint32_t(uint64_t(key) & 0xffffffffu));
    if (g.unique_tokens.empty() || g.unique_tokens.back() != tok) {
      g.unique_tokens.push_back(tok);
      g.offsets.push_back(int32_t(k));
    }
  }
  g.offsets.push_back(int32_t(n));
  return g;
}

void embedding_backward(const int32_t* unique_tokens, const int32_t* offsets, const int32_t* positions,
                        int64_t num_unique, const bf16* dout, float* dtable, int64_t c, cudaStream_t stream) {
  if (num_unique <= 0 || c <= 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(num_unique, kMaxBlocks));
  if (c % 8 == 0 && aligned16(dout) && aligned16(dtable))
    embedding_backward_kernel<8><<<grid, kEmbThreads, 0, stream>>>(unique_tokens, offsets, positions, num_unique,
                                                                   dout, dtable, c);
  else
    embedding_backward_kernel<1><<<grid, kEmbThreads, 0, stream>>>(unique_tokens, offsets, positions, num_unique,
                                                                   dout, dtable, c);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_add(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (n % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(out))
    add_kernel<8, T><<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(a, b, out, n);
  else
    add_kernel<1, T><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(a, b, out, n);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void add(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream) { launch_add(a, b, out, n, stream); }
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) { launch_add(a, b, out, n, stream); }

template <typename T>
void launch_dropout(const T* x, T* y, int64_t n, uint64_t seed, uint32_t threshold, float scale,
                    cudaStream_t stream) {
  if (n <= 0) return;
  dropout_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, y, n, seed, threshold, scale);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void dropout(const bf16* x, bf16* y, int64_t n, uint64_t seed, uint32_t threshold, float scale, cudaStream_t stream) {
  launch_dropout(x, y, n, seed, threshold, scale, stream);
}
void dropout(const float* x, float* y, int64_t n, uint64_t seed, uint32_t threshold, float scale,
             cudaStream_t stream) {
  launch_dropout(x, y, n, seed, threshold, scale, stream);
}

void cast_f32_to_bf16(const float* src, bf16* dst, int64_t n, cudaStream_t stream) {
  launch_cast(src, dst, n, stream);
}

void cast_bf16_to_f32(const bf16* src, float* dst, int64_t n, cudaStream_t stream) {
  launch_cast(src, dst, n, stream);
}

}  // namespace primus::cuda
