// Flash attention backward (FlashAttention-2's scheme). Fragment layouts and the shared-memory
// swizzle: flash_attention_common.cuh. Three kernels on the caller's stream:
//
//  1. preprocess: delta[b,h,i] = sum_d dO[i,d] * O[i,d] and lse2 = lse * log2(e), both fp32 in a
//     scratch buffer whose rows are padded to whole 64-row tiles (padding: delta 0, lse2 +inf, so
//     padded query rows get probability exactly 0 with no extra test).
//  2. dK/dV: one CTA per (kv group, batch, 64-key tile). It keeps its K and V tile in shared
//     memory and dK, dV in registers, and loops over every query head of the group and every
//     64-row query tile that can see its keys (causal: tiles at or below the diagonal). Per step,
//     with P = exp(s - lse) and dS = P * (dP - delta):
//         S = Q K^T -> P (bf16, to shared memory and kept packed in registers)
//         dP = dO V^T -> dS = P (dP - delta)     (64 x 64, fp32; dS to shared memory as bf16)
//         dV += P^T dO,  dK += dS^T Q            (registers, deterministic)
//         dQ += dS K                             (fp32 atomics into a scratch [b*s, h*d] buffer)
//     Q, dO, lse2 and delta of the next step are prefetched (cp.async, double-buffered) while
//     this one computes. dK = scale * dS^T Q and dV are written once, in bf16, at the end.
//  3. convert: dq = scale * dq_acc in bf16 into the q columns of dqkv.
// Every element of dqkv is written: q columns by 3, k and v columns of every key by 2.
//
// dS uses the bf16-rounded P (the P that dV sees too) rather than the fp32 one: the packed P is
// 16 registers where fp32 S and fp32 dP together would be 64 beside the 128 of dK and dV (D=128),
// which spilled; the extra relative error is 2^-9 per element, the size of dS's own rounding.
//
// Tiles: 64 queries x 64 keys, 4 warps as a 2 x 2 grid. For S and dP warp (wm, wn) owns
// queries 32wm.. and keys 32wn.. (2 m16 tiles x 4 n8 blocks); for dK and dV keys 32wm.. and
// head-dim columns (D/2)wn.. ; for dQ queries 32wm.. and columns (D/2)wn.. .
#include "kernels/cuda/flash_attention.h"

#include <cmath>

#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/runtime.h"

namespace primus::cuda {
namespace fa {
namespace {

constexpr int kBwdTile = 64;  // queries and keys per tile (BM = BN)
constexpr int kBwdThreads = 128;

struct BwdParams {
  const bf16* qkv;  // queries: head h at column h * D of each row
  const bf16* kv;   // keys and values: group g at columns k_col + g * D and v_col + g * D
  const bf16* dout;
  bf16* dqkv;       // fused output (dq by the convert kernel), or null:
  float* dkv_acc;   // ... block mode: [dk | dv] rows of 2 * groups * D floats, added to
  const float* lse2;   // [batch, heads, s_pad], lse * log2(e); +inf on padded rows
  const float* delta;  // [batch, heads, s_pad]; 0 on padded rows
  float* dq_acc;       // [batch * seq, heads * D]: zeroed before, or the caller's accumulator
  float dq_scale;      // applied to dQ before its atomics: 1 (the convert kernel scales), or the scale
  int seq, s_pad, heads, groups, per_group;
  int stride;    // qkv / dqkv row stride (elements)
  int kv_stride, k_col, v_col;
  int o_stride;  // dout row stride = heads * D
  float scale;       // 1 / sqrt(D)
  float scale_log2;  // log2(e) / sqrt(D)
};
// The documents (flash_attention.h) travel as kernel arguments of their own beside BwdParams: two
// more fields in it cost the plain kernels 12-40 bytes of spills (ptxas, CUDA 13, sm_90).

// ---- 1. delta and lse2 ----
// D/8 consecutive threads share one (row, head): each loads 8 bf16 of dO and of O (16 bytes),
// then a butterfly over those lanes sums the products. Items are ordered (b, i, h) so a warp reads
// contiguous memory.
template <int D>
__global__ void __launch_bounds__(256) fa_bwd_preprocess_kernel(const bf16* out, const bf16* dout, const float* lse,
                                                                float* lse2, float* delta, int batch, int seq,
                                                                int s_pad, int heads) {
  constexpr int kLanes = D / 8;
  const int64_t item = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int sub = threadIdx.x % kLanes;
  const int64_t items = int64_t(batch) * s_pad * heads;
  const bool live = item < items;
  const int h = int(item % heads);
  const int i = int((item / heads) % s_pad);
  const int b = int(item / (int64_t(heads) * s_pad));
  float acc = 0.f;
  if (live && i < seq) {
    const int64_t off = (int64_t(b) * seq + i) * int64_t(heads) * D + int64_t(h) * D + sub * 8;
    const uint4 o4 = *reinterpret_cast<const uint4*>(out + off);
    const uint4 d4 = *reinterpret_cast<const uint4*>(dout + off);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o4);
    const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&d4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 of = __bfloat1622float2(o2[j]), df = __bfloat1622float2(d2[j]);
      acc = fmaf(of.x, df.x, fmaf(of.y, df.y, acc));
    }
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (live && sub == 0) {
    const int64_t idx = (int64_t(b) * heads + h) * s_pad + i;
    if (i < seq) {
      delta[idx] = acc;
      lse2[idx] = lse[(int64_t(b) * heads + h) * seq + i] * kLog2e;
    } else {
      delta[idx] = 0.f;
      lse2[idx] = INFINITY;
    }
  }
}

// ---- 2. dK, dV (and dQ by atomics) ----

// The rows [0, S) of a sequence whose document starts at or before position `last` (starts
// non-decreasing: a prefix).
__device__ __forceinline__ int rows_seeing(const int* start, int S, int last) {
  int lo = 0, hi = S;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (start[mid] <= last) lo = mid + 1; else hi = mid;
  }
  return lo;
}
template <int D>
struct BwdSmem {
  static constexpr int kTileBytes = kBwdTile * D * 2;  // a 64 x D bf16 tile
  static constexpr int kPBytes = kBwdTile * kBwdTile * 2;
  static constexpr int K = 0;
  static constexpr int V = K + kTileBytes;
  static constexpr int Q = V + kTileBytes;        // two buffers
  static constexpr int DO = Q + 2 * kTileBytes;   // two buffers
  static constexpr int P = DO + 2 * kTileBytes;
  static constexpr int DS = P + kPBytes;
  static constexpr int LSE = DS + kPBytes;        // two buffers of 64 floats
  static constexpr int DELTA = LSE + 2 * kBwdTile * 4;
  static constexpr int kBytes = DELTA + 2 * kBwdTile * 4;
};

// D=64 fits in 168 registers, so three CTAs (12 warps, 3 x 66 KB of shared memory) share an SM;
// D=128 needs the full 255 (two CTAs, 2 x 114 KB).
template <int D> constexpr int kBwdMinBlocks = D == 64 ? 3 : 2;

// LIMIT: each row sees keys from a lower bound on, its document's start (doc_start, or none) and
// row - window (window >= 0, or none); a separate instantiation, so that plain attention carries
// none of its registers.
template <int D, bool CAUSAL, bool LIMIT>
__global__ void __launch_bounds__(kBwdThreads, kBwdMinBlocks<D>) fa_bwd_dkdv_kernel(const BwdParams p, const int* doc_start,
                                                                                  int key_pos0, int window) {
  constexpr int BM = kBwdTile, BN = kBwdTile, NTHREADS = kBwdThreads;
  constexpr int NTD = D / 16;  // n8 blocks of a warp's D/2 head-dim columns
  using L = BwdSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = smem_u32(smem);
  const uint32_t sK = base + L::K, sV = base + L::V, sP = base + L::P, sDS = base + L::DS;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp >> 1, wn = warp & 1;
  const int kvg = blockIdx.x, b = blockIdx.y, n_block = blockIdx.z;
  const int S = p.seq, H = p.heads;
  const int n0 = n_block * BN;

  const int* doc_row = LIMIT && doc_start ? doc_start + int64_t(b) * S : nullptr;
  // Documents: rows whose document starts after this tile's last key see none of it (their
  // starts do not decrease: the rows before the first such row); a window: rows past the tile's
  // last key + window see none of it.
  int rows_end = doc_row ? rows_seeing(doc_row, S, n0 + BN - 1 + key_pos0) : S;
  if (LIMIT && window >= 0) rows_end = min(rows_end, n0 + BN + window);
  const int n_q_blocks = (rows_end + BM - 1) / BM;
  const int m_begin = CAUSAL ? n0 / BM : 0;  // causal: query tiles below this one see no key here
  const int per_head = n_q_blocks - m_begin;  // documents: may be negative (no steps)
  const int steps = p.per_group * per_head;

  // K and V of this tile; rows past the sequence end are zero.
  {
    const bf16* kv_rows = p.kv + (int64_t(b) * S + n0) * p.kv_stride;
    load_tile<BN, D, NTHREADS>(sK, kv_rows + p.k_col + int64_t(kvg) * D, p.kv_stride, min(BN, S - n0), p.kv, tid);
    load_tile<BN, D, NTHREADS>(sV, kv_rows + p.v_col + int64_t(kvg) * D, p.kv_stride, min(BN, S - n0), p.kv, tid);
  }
  // Step `it` is query head kvg*per_group + it / per_head, query tile m_begin + it % per_head.
  auto issue = [&](int it, int buf) {
    const int h = kvg * p.per_group + it / per_head;
    const int m0 = (m_begin + it % per_head) * BM;
    const int rows = min(BM, S - m0);
    const int64_t row0 = int64_t(b) * S + m0;
    load_tile<BM, D, NTHREADS>(base + L::Q + buf * L::kTileBytes, p.qkv + row0 * p.stride + int64_t(h) * D,
                               p.stride, rows, p.qkv, tid);
    load_tile<BM, D, NTHREADS>(base + L::DO + buf * L::kTileBytes, p.dout + row0 * p.o_stride + int64_t(h) * D,
                               p.o_stride, rows, p.dout, tid);
    const int64_t stat = (int64_t(b) * H + h) * p.s_pad + m0;  // 64 floats = 16 chunks each
    if (tid < 16)
      cp_async16(base + L::LSE + buf * BM * 4 + tid * 16, p.lse2 + stat + tid * 4, 16);
    else if (tid < 32)
      cp_async16(base + L::DELTA + buf * BM * 4 + (tid - 16) * 16, p.delta + stat + (tid - 16) * 4, 16);
  };
  if (steps > 0) issue(0, 0);
  cp_async_commit();  // group: K, V and step 0

  float acc_dk[2][NTD][4], acc_dv[2][NTD][4];
  zero(acc_dk);
  zero(acc_dv);

  for (int it = 0; it < steps; ++it) {
    const int buf = it & 1;
    const int h = kvg * p.per_group + it / per_head;
    const int m0 = (m_begin + it % per_head) * BM;
    const uint32_t sQ = base + L::Q + buf * L::kTileBytes, sDO = base + L::DO + buf * L::kTileBytes;
    const float* sLse = reinterpret_cast<const float*>(smem + L::LSE + buf * BM * 4);
    const float* sDelta = reinterpret_cast<const float*>(smem + L::DELTA + buf * BM * 4);

    // Prefetch the next step into the other buffers (last read in step it-1, before its final
    // barrier), then wait for this step's group only.
    if (it + 1 < steps) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // (A) this step's Q, dO, lse2, delta (and at it = 0, K and V) are visible

    // S = Q K^T for queries 32wm.., keys 32wn.. -> P = 2^(x * log2(e)/sqrt(D) - lse2), stored to
    // shared memory and kept packed in bf16; then dP = dO V^T -> dS = P (dP - delta). Masked
    // entries get P = dS = 0. Element e of (mt, nb) is query 32wm + 16mt + g + 8(e >> 1), key
    // 32wn + 8nb + 2t + (e & 1). (P is packed before dP is accumulated so that 32 fp32 scores
    // and 32 fp32 dP are never live together beside dK and dV.)
    {
      const bool need_mask = (CAUSAL && n0 + BN - 1 > m0) || n0 + BN > S || LIMIT;
      uint32_t pk[2][2][4];  // [mt][r][nb]: bf16x2 of P
      {
        float acc_s[2][4][4];
        zero(acc_s);
        warp_gemm<2, 4, D, false, false, D, D>(acc_s, sQ, 32 * wm, sK, 32 * wn, lane);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int q = 32 * wm + 16 * mt + g + 8 * r;  // row within the query tile
            const float l2 = sLse[q];
            // documents, window: the query's first visible key, relative to this tile (rows past the
            // end: any)
            int first = doc_row && m0 + q < S ? doc_row[m0 + q] - key_pos0 - n0 : -BN;
            if (LIMIT && window >= 0 && m0 + q < S) first = max(first, m0 + q - window - n0);
#pragma unroll
            for (int nb = 0; nb < 4; ++nb) {
              const int k = 32 * wn + 8 * nb + 2 * t;  // column within the key tile (and k + 1)
              float pv[2];
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                pv[e] = ex2(fmaf(acc_s[mt][nb][2 * r + e], p.scale_log2, -l2));
                if (need_mask && (n0 + k + e >= S || (CAUSAL && n0 + k + e > m0 + q) || (LIMIT && k + e < first))) pv[e] = 0.f;
              }
              pk[mt][r][nb] = pack_bf16(pv[0], pv[1]);
              *reinterpret_cast<uint32_t*>(smem + L::P + swz<BN>(q, k)) = pk[mt][r][nb];
            }
          }
      }
      float acc_dp[2][4][4];
      zero(acc_dp);
      warp_gemm<2, 4, D, false, false, D, D>(acc_dp, sDO, 32 * wm, sV, 32 * wn, lane);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int q = 32 * wm + 16 * mt + g + 8 * r;
          const float dl = sDelta[q];
#pragma unroll
          for (int nb = 0; nb < 4; ++nb) {
            const int k = 32 * wn + 8 * nb + 2 * t;
            const float2 pv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pk[mt][r][nb]));
            *reinterpret_cast<uint32_t*>(smem + L::DS + swz<BN>(q, k)) =
                pack_bf16(pv.x * (acc_dp[mt][nb][2 * r] - dl), pv.y * (acc_dp[mt][nb][2 * r + 1] - dl));
          }
        }
    }
    __syncthreads();  // (B) P and dS are visible

    // dV += P^T dO and dK += dS^T Q: rows = keys 32wm.., k = queries (P, dS stored [q][key], so
    // the A operand is read transposed), columns (D/2)wn.. of dO / Q (stored [q][d] = [k][n]).
    warp_gemm<2, NTD, BM, true, true, BN, D>(acc_dv, sP, 32 * wm, sDO, (D / 2) * wn, lane);
    warp_gemm<2, NTD, BM, true, true, BN, D>(acc_dk, sDS, 32 * wm, sQ, (D / 2) * wn, lane);

    // dQ += dS K for queries 32wm.., columns (D/2)wn.. (unscaled; the convert kernel scales).
    {
      float acc_dq[2][NTD][4];
      zero(acc_dq);
      warp_gemm<2, NTD, BN, false, true, BN, D>(acc_dq, sDS, 32 * wm, sK, (D / 2) * wn, lane);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int q = m0 + 32 * wm + 16 * mt + g + 8 * r;
          if (q < S) {
            float* dst = p.dq_acc + (int64_t(b) * S + q) * int64_t(H) * D + int64_t(h) * D + (D / 2) * wn + 2 * t;
#pragma unroll
            for (int nb = 0; nb < NTD; ++nb) {
              const float d0 = acc_dq[mt][nb][2 * r] * p.dq_scale, d1 = acc_dq[mt][nb][2 * r + 1] * p.dq_scale;
#if __CUDA_ARCH__ >= 900
              atomicAdd(reinterpret_cast<float2*>(dst + 8 * nb), make_float2(d0, d1));
#else
              atomicAdd(dst + 8 * nb, d0);
              atomicAdd(dst + 8 * nb + 1, d1);
#endif
            }
          }
        }
    }
    __syncthreads();  // (C) everyone is done with this step's buffers, P and dS
  }
  cp_async_wait<0>();  // (only matters when there were no steps: K and V still in flight)

  // dK (scaled) and dV of keys n0 + 32wm + 16mt + g + 8r, columns (D/2)wn + 8nb + 2t.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = n0 + 32 * wm + 16 * mt + g + 8 * r;
      if (key < S && p.dkv_acc) {  // block mode: added to the fp32 accumulator (this CTA owns the rows)
        float* row = p.dkv_acc + (int64_t(b) * S + key) * int64_t(2 * p.groups) * D + (D / 2) * wn + 2 * t;
        float* dk = row + int64_t(kvg) * D;
        float* dv = row + int64_t(p.groups + kvg) * D;
#pragma unroll
        for (int nb = 0; nb < NTD; ++nb) {
          float2* k2 = reinterpret_cast<float2*>(dk + 8 * nb);
          float2* v2 = reinterpret_cast<float2*>(dv + 8 * nb);
          const float2 ko = *k2, vo = *v2;
          *k2 = make_float2(ko.x + acc_dk[mt][nb][2 * r] * p.scale, ko.y + acc_dk[mt][nb][2 * r + 1] * p.scale);
          *v2 = make_float2(vo.x + acc_dv[mt][nb][2 * r], vo.y + acc_dv[mt][nb][2 * r + 1]);
        }
      } else if (key < S) {
        bf16* row = p.dqkv + (int64_t(b) * S + key) * p.stride + (D / 2) * wn + 2 * t;
        bf16* dk = row + int64_t(H + kvg) * D;
        bf16* dv = row + int64_t(H + p.groups + kvg) * D;
#pragma unroll
        for (int nb = 0; nb < NTD; ++nb) {
          *reinterpret_cast<uint32_t*>(dk + 8 * nb) =
              pack_bf16(acc_dk[mt][nb][2 * r] * p.scale, acc_dk[mt][nb][2 * r + 1] * p.scale);
          *reinterpret_cast<uint32_t*>(dv + 8 * nb) = pack_bf16(acc_dv[mt][nb][2 * r], acc_dv[mt][nb][2 * r + 1]);
        }
      }
    }
}

// ---- 3. dQ to bf16 ----
// 8 values per thread: two float4 loads, one 16-byte store.
__global__ void __launch_bounds__(256) fa_bwd_convert_dq_kernel(const float* dq_acc, bf16* dqkv, int64_t rows,
                                                                 int row_len, int stride, float scale) {
  const int per_row = row_len / 8;
  const int64_t n = rows * per_row;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = v / per_row;
    const int c = int(v % per_row) * 8;
    const float4 a = *reinterpret_cast<const float4*>(dq_acc + row * row_len + c);
    const float4 b = *reinterpret_cast<const float4*>(dq_acc + row * row_len + c + 4);
    uint4 o;
    o.x = pack_bf16(a.x * scale, a.y * scale);
    o.y = pack_bf16(a.z * scale, a.w * scale);
    o.z = pack_bf16(b.x * scale, b.y * scale);
    o.w = pack_bf16(b.z * scale, b.w * scale);
    *reinterpret_cast<uint4*>(dqkv + row * stride + c) = o;
  }
}

template <int D, bool CAUSAL, bool LIMIT>
void launch_dkdv(const BwdParams& p, const AttentionDims& d, cudaStream_t stream) {
  const int batch = int(d.batch);
  auto kernel = fa_bwd_dkdv_kernel<D, CAUSAL, LIMIT>;
  constexpr int smem = BwdSmem<D>::kBytes;
  static_assert(smem > 48 * 1024, "raise the limit below only when needed");
  // Once per instantiation (thread-safe static initialisation); one process drives one GPU.
  static const cudaError_t attr = [&] {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    // All of the unified L1 / shared memory as shared, so that kBwdMinBlocks CTAs fit.
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  }();
  PRIMUS_CUDA_CHECK(attr);
  const dim3 grid(unsigned(p.groups), unsigned(batch), unsigned((p.seq + kBwdTile - 1) / kBwdTile));
  kernel<<<grid, kBwdThreads, smem, stream>>>(p, d.doc_start, int(d.key_pos0), int(d.window));
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace fa

namespace {

// dqkv (fused, overwritten) or, block mode, dq_acc and dkv_acc (fp32, added to).
void backward(const __nv_bfloat16* qkv, const __nv_bfloat16* kv, int kv_stride, int k_col, int v_col,
              const __nv_bfloat16* out, const float* lse, const __nv_bfloat16* dout, __nv_bfloat16* dqkv,
              float* dq_acc_out, float* dkv_acc, const AttentionDims& d, bool causal, cudaStream_t stream) {
  const std::string why = flash_attention_unsupported(d);
  if (!why.empty()) throw Error(why);
  // (dqkv, or dq_acc_out and dkv_acc, are null in the other mode: aligned.)
  for (const void* ptr : {static_cast<const void*>(qkv), static_cast<const void*>(kv), static_cast<const void*>(out),
                          static_cast<const void*>(dout), static_cast<const void*>(dqkv),
                          static_cast<const void*>(dq_acc_out), static_cast<const void*>(dkv_acc)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw Error("flash attention backward needs 16-byte aligned qkv, kv, out, dout and gradients");

  const bool block = dkv_acc != nullptr;
  const int64_t B = d.batch, S = d.seq, H = d.heads, D = d.head_dim;
  const int64_t s_pad = (S + fa::kBwdTile - 1) / fa::kBwdTile * fa::kBwdTile;
  const int64_t dq_elems = block ? 0 : B * S * H * D, stat_elems = B * H * s_pad;
  // One scratch block: dq_acc (fused mode) | lse2 | delta (each part a multiple of 256 bytes: D >= 64
  // and s_pad a multiple of 64).
  Scratch scratch(size_t(dq_elems + 2 * stat_elems) * sizeof(float));
  float* dq_acc = block ? dq_acc_out : scratch.as<float>();
  float* lse2 = scratch.as<float>() + dq_elems;
  float* delta = lse2 + stat_elems;

  if (!block) PRIMUS_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(B * S * H * D) * sizeof(float), stream));
  {
    const int64_t threads = stat_elems * (D / 8);
    const unsigned blocks = unsigned((threads + 255) / 256);
    if (D == 64)
      fa::fa_bwd_preprocess_kernel<64><<<blocks, 256, 0, stream>>>(out, dout, lse, lse2, delta, int(B), int(S),
                                                                   int(s_pad), int(H));
    else
      fa::fa_bwd_preprocess_kernel<128><<<blocks, 256, 0, stream>>>(out, dout, lse, lse2, delta, int(B), int(S),
                                                                    int(s_pad), int(H));
    PRIMUS_CUDA_CHECK_LAUNCH();
  }

  fa::BwdParams p{};
  p.qkv = qkv;
  p.kv = kv;
  p.dout = dout;
  p.dqkv = dqkv;
  p.dkv_acc = dkv_acc;
  p.lse2 = lse2;
  p.delta = delta;
  p.dq_acc = dq_acc;
  p.seq = int(S);
  p.s_pad = int(s_pad);
  p.heads = int(H);
  p.groups = int(d.groups);
  p.per_group = int(H / d.groups);
  p.stride = int(d.qkv_stride());
  p.kv_stride = kv_stride;
  p.k_col = k_col;
  p.v_col = v_col;
  p.o_stride = int(H * D);
  p.scale = float(1.0 / std::sqrt(double(D)));
  p.scale_log2 = float(1.4426950408889634 / std::sqrt(double(D)));
  p.dq_scale = block ? p.scale : 1.0f;
  const bool docs = d.doc_start != nullptr || d.window >= 0;
  if (D == 64) {
    if (docs)
      causal ? fa::launch_dkdv<64, true, true>(p, d, stream) : fa::launch_dkdv<64, false, true>(p, d, stream);
    else
      causal ? fa::launch_dkdv<64, true, false>(p, d, stream) : fa::launch_dkdv<64, false, false>(p, d, stream);
  } else {
    if (docs)
      causal ? fa::launch_dkdv<128, true, true>(p, d, stream) : fa::launch_dkdv<128, false, true>(p, d, stream);
    else
      causal ? fa::launch_dkdv<128, true, false>(p, d, stream)
             : fa::launch_dkdv<128, false, false>(p, d, stream);
  }
  if (block) return;

  {
    const int64_t vecs = B * S * H * D / 8;
    const int64_t want = (vecs + 255) / 256;
    const unsigned blocks = unsigned(want < 65536 ? want : 65536);  // grid-stride beyond that
    fa::fa_bwd_convert_dq_kernel<<<blocks, 256, 0, stream>>>(dq_acc, dqkv, B * S, int(H * D), int(d.qkv_stride()),
                                                             p.scale);
    PRIMUS_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void flash_attention_backward(const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              const __nv_bfloat16* dout, __nv_bfloat16* dqkv, const AttentionDims& d, bool causal,
                              cudaStream_t stream) {
  const int hd = int(d.heads * d.head_dim), gd = int(d.groups * d.head_dim);
  backward(qkv, qkv, int(d.qkv_stride()), hd, hd + gd, out, lse, dout, dqkv, nullptr, nullptr, d, causal, stream);
}

void flash_attention_block_backward(const __nv_bfloat16* qkv, const __nv_bfloat16* kv, const __nv_bfloat16* out,
                                    const float* lse, const __nv_bfloat16* dout, float* dq_acc, float* dkv_acc,
                                    const AttentionDims& d, bool causal, cudaStream_t stream) {
  if (!dq_acc || !dkv_acc) throw Error("flash attention block backward needs its dq and dkv accumulators");
  const int gd = int(d.groups * d.head_dim);
  backward(qkv, kv, 2 * gd, 0, gd, out, lse, dout, nullptr, dq_acc, dkv_acc, d, causal, stream);
}

}  // namespace primus::cuda
