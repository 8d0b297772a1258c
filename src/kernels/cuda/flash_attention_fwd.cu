// Flash attention forward (FlashAttention-2's scheme). Fragment layouts and the shared-memory
// swizzle: flash_attention_common.cuh; the shape check: flash_attention.cpp.
//
// One CTA owns BM query rows of one (batch, head); each of its NWARPS warps owns 16*MT of those
// rows for the whole kernel, so the online-softmax statistics (row max m, row sum l) and the
// output accumulator O live in that warp's registers. KV tiles of BN keys stream through shared
// memory, highest first (for causal rows the tiles that need masking come first, then unmasked
// ones). Per KV tile n:
//
//     issue V_n (cp.async)                        K_n is already resident
//     S = Q K_n^T            (tensor cores, fp32)
//     mask (only tiles that cross the diagonal or the sequence end)
//     wait V_n; __syncthreads                     every warp is done reading K_n
//     issue K_{n-1} (cp.async) into K's buffer    overlaps the softmax and P V
//     online softmax on S -> P (bf16, kept in registers as the A operand)
//     O = O * alpha + P V_n
//     wait K_{n-1}; __syncthreads                 every warp is done reading V_n
//
// The scores are kept unscaled (x = q.k); p = 2^(x*c - m*c) with c = log2(e)/sqrt(D), so
// lse = m/sqrt(D) + ln(l) is the natural-log log-sum-exp of s = q.k/sqrt(D), as on the CPU.

#include "kernels/cuda/flash_attention.h"

#include <cmath>

#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/runtime.h"

namespace primus::cuda {

namespace fa {
namespace {

struct FwdParams {
  const bf16* qkv;     // queries: head h at column h * D of each row
  const bf16* kv;      // keys and values: group g at columns k_col + g * D and v_col + g * D
  bf16* out;
  float* lse;
  int seq, heads, groups, per_group;
  int stride;          // qkv row stride (elements)
  int kv_stride, k_col, v_col;
  int64_t out_stride;  // heads * D
  float scale;         // 1 / sqrt(D)
  float scale_log2;    // log2(e) / sqrt(D)
};
// The documents (flash_attention.h) travel as kernel arguments of their own beside FwdParams, as
// in the backward (flash_attention_bwd.cu).

template <int D_, int BM_, int BN_, int NWARPS_, bool Q_IN_REGS_>
struct FwdConfig {
  static constexpr int D = D_, BM = BM_, BN = BN_, NWARPS = NWARPS_, NTHREADS = 32 * NWARPS_;
  static constexpr bool Q_IN_REGS = Q_IN_REGS_;
  static constexpr int MT = BM / (16 * NWARPS);  // 16-row m-tiles per warp
  static constexpr int SMEM = (BM + 2 * BN) * D * int(sizeof(bf16));
  static_assert(MT * 16 * NWARPS == BM && BN % 16 == 0 && D % 16 == 0, "tile shape");
};

// Both head dims: 128 query rows per CTA, 4 warps of 32 rows (two m16 tiles per warp, so each
// K / V fragment read from shared memory feeds two tensor-core ops).
// D=64:  64 keys per tile, Q fragments held in registers (O 64 + S 64 + Q 32 registers).
//        Shared memory 32 KB.
// D=128: 32 keys per tile, Q re-read from shared memory every k-step: O alone is 128 registers,
//        and with 64 keys (S 64 more) ptxas spills. Shared memory 48 KB.
template <int D> struct FwdTraits;
template <> struct FwdTraits<64> { using Cfg = FwdConfig<64, 128, 64, 4, true>; };
template <> struct FwdTraits<128> { using Cfg = FwdConfig<128, 128, 32, 4, false>; };

// LIMIT: each row sees keys from a lower bound on, its document's start (doc_start, or none) and
// row - window (window >= 0, or none); a separate instantiation, so that plain attention carries
// none of its registers. sinks: null, or one logit per head (flash_attention.h).
template <typename Cfg, bool CAUSAL, bool LIMIT>
__global__ void __launch_bounds__(Cfg::NTHREADS) fa_fwd_kernel(const FwdParams p, const int* doc_start, int key_pos0,
                                                               int window, const float* sinks) {
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, MT = Cfg::MT, NTHREADS = Cfg::NTHREADS;
  constexpr int KT = D / 16;   // k-steps of Q K^T
  constexpr int NB = BN / 8;   // n-blocks of S
  constexpr int OB = D / 8;    // n-blocks of O
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + BM * D * 2;
  const uint32_t sV = sK + BN * D * 2;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int h = blockIdx.x, b = blockIdx.y;
  const int m_block = gridDim.z - 1 - blockIdx.z;  // the longest (causal) rows start first
  const int S = p.seq;
  const int m0 = m_block * BM;
  const int kvg = h / p.per_group;
  const int wrow = warp * MT * 16;  // first row of this warp within the tile

  const bf16* q_src = p.qkv + (int64_t(b) * S + m0) * p.stride + int64_t(h) * D;
  const bf16* k_src = p.kv + int64_t(b) * S * p.kv_stride + p.k_col + int64_t(kvg) * D;
  const bf16* v_src = p.kv + int64_t(b) * S * p.kv_stride + p.v_col + int64_t(kvg) * D;

  const int n_end = CAUSAL ? min(S, m0 + BM) : S;  // keys [0, n_end) are visible to some row
  const int n_blocks = (n_end + BN - 1) / BN;
  // Documents: a row sees the keys from its document's start on (re-read from global memory where
  // a tile is masked: held in registers they spill); the tile's first row has the lowest start,
  // as starts do not decrease, so the key tiles below n_lo hold no visible key.
  // A window's first key (row - window) grows with the row too.
  const int* doc_row = LIMIT && doc_start ? doc_start + int64_t(b) * S : nullptr;
  auto first_key = [&](int row) {
    const int doc = doc_row ? doc_row[row] - key_pos0 : 0;
    return window >= 0 ? max(doc, row - window) : doc;
  };
  const int n_lo = LIMIT ? max(0, first_key(m0)) / BN : 0;

  load_tile<BM, D, NTHREADS>(sQ, q_src, p.stride, min(BM, S - m0), p.qkv, tid);
  {
    const int n0 = (n_blocks - 1) * BN;
    load_tile<BN, D, NTHREADS>(sK, k_src + int64_t(n0) * p.kv_stride, p.kv_stride, min(BN, S - n0), p.kv, tid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const Frag fq = frag_a_mk<D>(lane), fk = frag_b_nk<D>(lane), fv = frag_b_kn<D>(lane);
  uint32_t qf[Cfg::Q_IN_REGS ? MT : 1][Cfg::Q_IN_REGS ? KT : 1][4];  // unused (and removed) otherwise
  if constexpr (Cfg::Q_IN_REGS) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) load_a_mk<D>(qf[mt][kt], sQ, fq, wrow + 16 * mt, 16 * kt);
  }

  float acc_o[MT][OB][4];
  zero(acc_o);
  float row_max[MT][2], row_sum[MT][2];  // [mt][0]: row g, [mt][1]: row g + 8 (this thread's part of l)
  // A sink is a key of score sinks[h] (scaled: unscaled sinks[h] / scale) and value 0: the softmax
  // starts from it, its 1 counted once per quad (lane t = 0).
  const float m_start = sinks ? sinks[h] / p.scale : -INFINITY;
  const float l_start = sinks && t == 0 ? 1.f : 0.f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = m_start;
      row_sum[mt][r] = l_start;
    }

  for (int n_block = n_blocks - 1; n_block >= n_lo; --n_block) {
    const int n0 = n_block * BN;
    load_tile<BN, D, NTHREADS>(sV, v_src + int64_t(n0) * p.kv_stride, p.kv_stride, min(BN, S - n0), p.kv, tid);
    cp_async_commit();

    // S = Q K^T over this warp's rows and all BN keys.
    float acc_s[MT][NB][4];
    zero(acc_s);
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (Cfg::Q_IN_REGS) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kt][e];
        } else {
          load_a_mk<D>(a[mt], sQ, fq, wrow + 16 * mt, 16 * kt);
        }
      }
#pragma unroll
      for (int np = 0; np < NB / 2; ++np) {
        uint32_t bk[4];
        load_b_nk<D>(bk, sK, fk, 16 * np, 16 * kt);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(acc_s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_bf16(acc_s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // Mask keys past the sequence end, causal, keys after the query, and keys before the query's
    // document. Element e of n-block nb in m-tile mt is row wrow + 16*mt + g + 8*(e >> 1), key
    // n0 + 8*nb + 2*t + (e & 1).
    if ((CAUSAL && n0 + BN - 1 > m0) || n0 + BN > S || LIMIT) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = m0 + wrow + 16 * mt + g + 8 * (e >> 1);
            const int key = n0 + 8 * nb + 2 * t + (e & 1);
            if (key >= S || (CAUSAL && key > row) || (LIMIT && row < S && key < first_key(row))) acc_s[mt][nb][e] = -INFINITY;
          }
    }

    cp_async_wait<0>();  // V_n has landed (this thread's part) ...
    __syncthreads();     // ... everyone's part, and every warp is done with K_n
    if (n_block > n_lo) {
      const int nk = n0 - BN;
      load_tile<BN, D, NTHREADS>(sK, k_src + int64_t(nk) * p.kv_stride, p.kv_stride, min(BN, S - nk), p.kv, tid);
      cp_async_commit();
    }

    // Online softmax. A row's BN scores are spread over a quad (the 4 lanes with the same g), 2*NB
    // per lane: each lane reduces its own, then two xor-shuffles combine the quad. row_sum stays
    // per lane (all four share alpha) and is combined once, at the end.
    uint32_t pf[MT][BN / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) mx = fmaxf(mx, fmaxf(acc_s[mt][nb][2 * r], acc_s[mt][nb][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with every key so far masked has max -inf; subtract 0 instead so that
        // exp(-inf - -inf) never makes a NaN (its p and alpha are then exactly 0).
        const float m_use = mx == -INFINITY ? 0.f : mx;
        const float m_scaled = m_use * p.scale_log2;
        const float alpha = ex2(row_max[mt][r] * p.scale_log2 - m_scaled);
        row_max[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = ex2(fmaf(acc_s[mt][nb][2 * r + e], p.scale_log2, -m_scaled));
            acc_s[mt][nb][2 * r + e] = pv;
            sum += pv;
          }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
        for (int ob = 0; ob < OB; ++ob) {
          acc_o[mt][ob][2 * r] *= alpha;
          acc_o[mt][ob][2 * r + 1] *= alpha;
        }
      }
      // P as the A operand of P V: keys 16*kk .. 16*kk+15 are n-blocks 2kk and 2kk+1.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pf[mt][kk][0] = pack_bf16(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        pf[mt][kk][1] = pack_bf16(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        pf[mt][kk][2] = pack_bf16(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        pf[mt][kk][3] = pack_bf16(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
    }

    // O += P V_n: k = keys, n = head dim; V is stored [key][d] = [k][n].
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t bv[4];
        load_b_kn<D>(bv, sV, fv, 16 * np, 16 * kk);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(acc_o[mt][2 * np], pf[mt][kk], bv[0], bv[1]);
          mma_bf16(acc_o[mt][2 * np + 1], pf[mt][kk], bv[2], bv[3]);
        }
      }
    }

    cp_async_wait<0>();  // K_{n-1} has landed ...
    __syncthreads();     // ... for everyone, and every warp is done with V_n
  }

  // Epilogue: O / l in bf16, lse = m/sqrt(D) + ln(l). Lane (g, t) holds columns 8*ob + 2t, +1
  // of rows g and g + 8 of each m-tile.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = m0 + wrow + 16 * mt + g + 8 * r;
      if (row < S) {
        const float inv = l > 0.f ? 1.f / l : 0.f;
        bf16* dst = p.out + (int64_t(b) * S + row) * p.out_stride + int64_t(h) * D + 2 * t;
#pragma unroll
        for (int ob = 0; ob < OB; ++ob)
          *reinterpret_cast<uint32_t*>(dst + 8 * ob) =
              pack_bf16(acc_o[mt][ob][2 * r] * inv, acc_o[mt][ob][2 * r + 1] * inv);
        if (t == 0) p.lse[(int64_t(b) * p.heads + h) * S + row] = row_max[mt][r] * p.scale + logf(l);
      }
    }
  }
}

template <int D, bool CAUSAL, bool LIMIT>
void launch_fwd(const FwdParams& p, const AttentionDims& d, cudaStream_t stream) {
  const int batch = int(d.batch);
  using Cfg = typename FwdTraits<D>::Cfg;
  auto kernel = fa_fwd_kernel<Cfg, CAUSAL, LIMIT>;
  // Once per instantiation (thread-safe static initialisation); one process drives one GPU.
  static const cudaError_t attr = [&] {
    if constexpr (Cfg::SMEM > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM);
      if (e != cudaSuccess) return e;
    }
    // Shared memory over L1 (the kernel reads global memory through cp.async.cg, which skips L1).
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  }();
  PRIMUS_CUDA_CHECK(attr);
  const dim3 grid(unsigned(p.heads), unsigned(batch), unsigned((p.seq + Cfg::BM - 1) / Cfg::BM));
  kernel<<<grid, Cfg::NTHREADS, Cfg::SMEM, stream>>>(p, d.doc_start, int(d.key_pos0), int(d.window), d.sinks);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace fa

namespace {

void forward(const __nv_bfloat16* qkv, const __nv_bfloat16* kv, int kv_stride, int k_col, int v_col,
             __nv_bfloat16* out, float* lse, const AttentionDims& d, bool causal, cudaStream_t stream) {
  const std::string why = flash_attention_unsupported(d);
  if (!why.empty()) throw Error(why);
  if (reinterpret_cast<uintptr_t>(qkv) % 16 != 0 || reinterpret_cast<uintptr_t>(kv) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 4 != 0)
    throw Error("flash attention needs 16-byte aligned qkv and kv and 4-byte aligned out");
  fa::FwdParams p{};
  p.qkv = qkv;
  p.kv = kv;
  p.out = out;
  p.lse = lse;
  p.seq = int(d.seq);
  p.heads = int(d.heads);
  p.groups = int(d.groups);
  p.per_group = int(d.heads / d.groups);
  p.stride = d.qkv_stride();
  p.kv_stride = kv_stride;
  p.k_col = k_col;
  p.v_col = v_col;
  p.out_stride = d.heads * d.head_dim;
  p.scale = float(1.0 / std::sqrt(double(d.head_dim)));
  p.scale_log2 = float(1.4426950408889634 / std::sqrt(double(d.head_dim)));
  const bool docs = d.doc_start != nullptr || d.window >= 0;
  if (d.head_dim == 64) {
    if (docs)
      causal ? fa::launch_fwd<64, true, true>(p, d, stream) : fa::launch_fwd<64, false, true>(p, d, stream);
    else
      causal ? fa::launch_fwd<64, true, false>(p, d, stream) : fa::launch_fwd<64, false, false>(p, d, stream);
  } else {
    if (docs)
      causal ? fa::launch_fwd<128, true, true>(p, d, stream) : fa::launch_fwd<128, false, true>(p, d, stream);
    else
      causal ? fa::launch_fwd<128, true, false>(p, d, stream) : fa::launch_fwd<128, false, false>(p, d, stream);
  }
}

}  // namespace

void flash_attention_forward(const __nv_bfloat16* qkv, __nv_bfloat16* out, float* lse, const AttentionDims& d,
                             bool causal, cudaStream_t stream) {
  const int hd = int(d.heads * d.head_dim), gd = int(d.groups * d.head_dim);
  forward(qkv, qkv, int(d.qkv_stride()), hd, hd + gd, out, lse, d, causal, stream);
}

void flash_attention_block_forward(const __nv_bfloat16* qkv, const __nv_bfloat16* kv, __nv_bfloat16* out,
                                   float* lse, const AttentionDims& d, bool causal, cudaStream_t stream) {
  const int gd = int(d.groups * d.head_dim);
  forward(qkv, kv, 2 * gd, 0, gd, out, lse, d, causal, stream);
}

}  // namespace primus::cuda
