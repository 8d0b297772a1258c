// Inline helpers of this folder's AVX-512 kernels: bf16 <-> fp32, exp, masks, the packing of
// bf16 operands into pair-interleaved panels for vdpbf16ps, and a small register-blocked dot
// product. Include it only after PRIMUS_AVX512_BF16_BEGIN (target.h): all of
// it is in an anonymous namespace, so each file gets its own AVX-512 copy and none can be shared
// with code built for the baseline.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace primus::cpu::bf16k {
namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

inline int32_t load_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- prefetch ----
// On the machines measured (2-core Zen 5 VMs) the hardware prefetchers stay too close behind a
// stream that comes from memory: the row and element loops ran at 11-14 GB/s on tensors written
// long before (a copy runs at 65-77 GB/s there). Loops over such tensors ask for the line
// kStreamAhead bytes on, once per cache line they consume: SwiGLU's backward on 2048 x 768 went
// from 1.08 to 0.36 ms on tensors from memory.
constexpr int64_t kStreamAhead = 4096;
inline void prefetch_ahead(const void* p) { _mm_prefetch(static_cast<const char*>(p) + kStreamAhead, _MM_HINT_T0); }
// Every cache line of [p, p + bytes): a row that a loop reads rows later (into L1; kHint
// _MM_HINT_T1: into L2, for a whole block asked for a block ahead).
template <int kHint = _MM_HINT_T0>
inline void prefetch_span(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, static_cast<_mm_hint>(kHint));
  if (bytes > 0) _mm_prefetch(c + bytes - 1, static_cast<_mm_hint>(kHint));  // a row that starts mid-line
}

// ---- bf16 <-> fp32 ----
// core/dtype.h's bf16_bits_to_float and float_to_bf16_bits, repeated: inline functions shared with
// code compiled for the baseline could be linked in their AVX-512 form (target.h).

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN stays NaN: as bf16::from_float.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// float_to_bf16 on 16 lanes, bit for bit (denormals kept, NaN quieted): for results that must equal
// the host's bf16::from_float, where vcvtneps2bf16 (narrow_bf16) would flush denormal inputs.
inline __m256i float_to_bf16_exact(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
inline __m512 widen_bf16(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }
inline __m512 load_bf16(const uint16_t* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load_bf16(const uint16_t* p, __mmask16 m) { return widen_bf16(_mm256_maskz_loadu_epi16(m, p)); }
// vcvtneps2bf16 rounds to nearest even (denormal inputs count as zero; training flushes them anyway).
inline __m256i narrow_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
inline void store_bf16(uint16_t* p, __m512 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow_bf16(v)); }
inline void store_bf16(uint16_t* p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, narrow_bf16(v)); }

// exp(x) in fp32 to about 1 ulp: x = n ln2 + r, Cephes' polynomial for e^r, scaled by 2^n.
// Large negative x gives 0, NaN stays NaN.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// ---- packing ----
//
// Both operands are packed into the same pair-interleaved panels: for a logical matrix X[K, cols]
// (op(B) with cols = N, or op(A)^T with cols = M) and a panel width W,
//   P[panel][kp][w][e] = X(2 kp + e, panel * W + w),  zero outside X,
// so that one 32-bit word is one k-pair of one column. X is stored either k-major (X(k, c) at
// S[k ld + c]: B of an NN product, A of a TN one) or c-major (X(k, c) at S[c ld + k]: the weight
// of an NT product, a row-major A).

struct PackSource {
  const uint16_t* S;
  int64_t ld, K, cols;
  bool k_major;
  int64_t cols_padded = 0;  // more zero columns, up to this many (rounded up to panels)
  int64_t panels(int64_t W) const { return ceil_div(cols > cols_padded ? cols : cols_padded, W); }
};

// 16 dwords of columns c .. c + 16 of one k-pair go to their panel(s).
template <int64_t W>
inline void put16(uint16_t* dst, int64_t panels, int64_t Kp, int64_t kp, int64_t c, __m512i v) {
  const int64_t p = c / W, w = c % W;
  if constexpr (W % 16 == 0) {
    _mm512_storeu_si512(dst + (p * Kp + kp) * W * 2 + w * 2, v);
  } else {  // W = 8: two panels
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (p * Kp + kp) * W * 2), _mm512_castsi512_si256(v));
    if (p + 1 < panels)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + ((p + 1) * Kp + kp) * W * 2),
                          _mm512_extracti64x4_epi64(v, 1));
  }
}

// Interleaves rows 2 kp and 2 kp + 1 of a k-major X, 16 columns at a time. In sweeps of about 256
// columns, row pairs outside, columns inside: each row's piece is read once, in order, while the
// pair kAhead on is asked for (a run of many pairs per call lets that run ahead). Columns outside
// reread every row once per 16 columns, and where the rows lie a power of two apart (a layer's
// 4096 outputs) they share a cache set that cannot hold them all, so every read went to memory
// again. Each k-pair writes a word row to every panel of the sweep: callers keep the panels off a
// power-of-two stride (panel_kps) so that those rows do not share a set.
template <int64_t W>
void pack_k_major(const PackSource& x, int64_t Kp, int64_t kp0, int64_t kp1, uint16_t* dst) {
  const int64_t panels = x.panels(W), padded = panels * W;
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  constexpr int64_t kSweep = W * (256 / W > 0 ? 256 / W : 1), kAhead = 8;
  for (int64_t c0 = 0; c0 < padded; c0 += kSweep) {
    const int64_t c1 = min64(padded, c0 + kSweep), live = min64(x.cols, c1) - c0;
    for (int64_t kp = kp0; kp < kp1; ++kp) {
      const uint16_t* r0 = x.S + 2 * kp * x.ld;
      const bool has0 = 2 * kp < x.K, has1 = 2 * kp + 1 < x.K;
      if (live > 0 && 2 * (kp + kAhead) + 1 < x.K)
        prefetch_span(r0 + 2 * kAhead * x.ld + c0, live * 2),
            prefetch_span(r0 + (2 * kAhead + 1) * x.ld + c0, live * 2);
      for (int64_t c = c0; c < c1; c += 16) {
        if (c >= x.cols) {  // padding columns of the last panel
          put16<W>(dst, panels, Kp, kp, c, _mm512_setzero_si512());
          continue;
        }
        const __mmask16 m = x.cols - c >= 16 ? 0xffff : __mmask16((1u << (x.cols - c)) - 1);
        const __m256i lo = has0 ? _mm256_maskz_loadu_epi16(m, r0 + c) : _mm256_setzero_si256();
        const __m256i hi = has1 ? _mm256_maskz_loadu_epi16(m, r0 + x.ld + c) : _mm256_setzero_si256();
        put16<W>(dst, panels, Kp, kp, c,
                 _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)));
      }
    }
  }
}

// 16 x 16 dwords: out[j] holds element j of every in[i].
inline void transpose16(const __m512i in[16], __m512i out[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(in[i], in[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(in[i], in[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  // b[4 q + e] holds, in 128-bit lane L, rows 4q .. 4q + 3 of column 4 L + e.
  for (int e = 0; e < 4; ++e) {
    const __m512i c0 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x88), c1 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xdd);
    const __m512i c2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x88),
                  c3 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xdd);
    out[e] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    out[8 + e] = _mm512_shuffle_i32x4(c0, c2, 0xdd);
    out[4 + e] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    out[12 + e] = _mm512_shuffle_i32x4(c1, c3, 0xdd);
  }
}

// A c-major X: 16 columns x 16 k-pairs at a time through a dword transpose; edges one word at a time.
template <int64_t W>
void pack_c_major(const PackSource& x, int64_t Kp, int64_t kp0, int64_t kp1, uint16_t* dst) {
  const int64_t panels = x.panels(W), padded = panels * W;
  for (int64_t kb = kp0; kb < kp1; kb += 16) {
    const int64_t kn = min64(16, kp1 - kb);
    for (int64_t c0 = 0; c0 < padded; c0 += 16) {
      if (kn == 16 && 2 * (kb + 16) <= x.K && c0 + 16 <= x.cols) {
        __m512i in[16], out[16];
        for (int i = 0; i < 16; ++i) in[i] = _mm512_loadu_si512(x.S + (c0 + i) * x.ld + 2 * kb);
        transpose16(in, out);
        for (int j = 0; j < 16; ++j) put16<W>(dst, panels, Kp, kb + j, c0, out[j]);
        continue;
      }
      for (int64_t kp = kb; kp < kb + kn; ++kp) {
        alignas(64) uint16_t words[32];
        for (int i = 0; i < 16; ++i) {
          const int64_t c = c0 + i, k = 2 * kp;
          const bool in = c < x.cols;
          words[2 * i] = in && k < x.K ? x.S[c * x.ld + k] : 0;
          words[2 * i + 1] = in && k + 1 < x.K ? x.S[c * x.ld + k + 1] : 0;
        }
        put16<W>(dst, panels, Kp, kp, c0, _mm512_load_si512(words));
      }
    }
  }
}

// The k-pairs a panel of width W spans in memory, for Kp of them: one cache line more, so that
// panels of a power-of-two K do not all start in the same cache set (pack_k_major writes a word
// row to each of them in turn).
template <int64_t W>
constexpr int64_t panel_kps(int64_t Kp) {
  return Kp + (W * 4 >= 64 ? 1 : 64 / (W * 4));
}

template <int64_t W>
void pack(const PackSource& x, int64_t Kp, int64_t kp0, int64_t kp1, uint16_t* dst) {
  if (x.k_major)
    pack_k_major<W>(x, Kp, kp0, kp1, dst);
  else
    pack_c_major<W>(x, Kp, kp0, kp1, dst);
}

// ---- a register-blocked dot product ----

// A's rows for dot_tile and dot_block: row r's k-pair kp at
//   a + r * as + kp * akp                                      (panel = 0: rows, e.g. akp = 2)
//   a + (r / 16) * panel + (r % 16) * as + kp * akp            (packed panels of 16 rows)
struct Rows {
  const uint16_t* a;
  int64_t as, akp, panel = 0;
  const uint16_t* row(int64_t r) const { return panel ? a + (r / 16) * panel + (r % 16) * as : a + r * as; }
};
// B: k-pair kp of the 16 columns of vector v at b + kp * bs + v * bv.
struct Cols {
  const uint16_t* b;
  int64_t bs, bv;
};

// c[R][16 V] (row stride ldc) = (accumulate ? c : 0) + the sum over kps k-pairs of A's R rows from
// a (stride as within the group) times B.
template <int R, int V>
inline void dot_tile(const uint16_t* a, int64_t as, int64_t akp, const Cols& B, int64_t kps, float* c, int64_t ldc,
                     bool accumulate) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[i][v] = accumulate ? _mm512_loadu_ps(c + i * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kps; ++kp) {
    __m512bh bvec[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bvec[v] = (__m512bh)_mm512_loadu_si512(B.b + kp * B.bs + v * B.bv);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(load_pair(a + i * as + kp * akp));
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bvec[v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(c + i * ldc + 16 * v, acc[i][v]);
}

// c[rows][cols] (+)= A B for rows a multiple of 4 and cols a multiple of 16, in 4 x 64 blocks.
inline void dot_block(const Rows& A, int64_t rows, const Cols& B, int64_t cols, int64_t kps, float* c, int64_t ldc,
                      bool accumulate) {
  for (int64_t j = 0; j < cols; j += 64) {
    const int64_t nv = min64(4, (cols - j) / 16);
    const Cols bj{B.b + (j / 16) * B.bv, B.bs, B.bv};
    for (int64_t i = 0; i < rows; i += 4) {
      const uint16_t* ai = A.row(i);
      float* ci = c + i * ldc + j;
      switch (nv) {
        case 4: dot_tile<4, 4>(ai, A.as, A.akp, bj, kps, ci, ldc, accumulate); break;
        case 3: dot_tile<4, 3>(ai, A.as, A.akp, bj, kps, ci, ldc, accumulate); break;
        case 2: dot_tile<4, 2>(ai, A.as, A.akp, bj, kps, ci, ldc, accumulate); break;
        default: dot_tile<4, 1>(ai, A.as, A.akp, bj, kps, ci, ldc, accumulate); break;
      }
    }
  }
}

}  // namespace
}  // namespace primus::cpu::bf16k
