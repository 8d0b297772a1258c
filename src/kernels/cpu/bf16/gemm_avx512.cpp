// This project's bf16 GEMM on AVX512-BF16 (gemm.h). One vdpbf16ps multiplies 16 x 2 bf16 pairs and
// adds them into 16 fp32 sums, so op(B) is packed in panels of kNr columns where each k-pair of a
// column is one 32-bit word ("VNNI" order), and op(A) supplies one 32-bit k-pair per row,
// broadcast. The micro-kernel keeps a kMr x kNr block of fp32 sums in 24 of the 32 zmm registers.
// Blocking: a B micro-panel of kKc rows (kKc x kNr x 2 bytes = 24 KiB) stays in L1 while the
// micro-kernel walks down the rows of an output tile; the tile's fp32 sums live in a per-thread
// buffer across K blocks, and the last K block applies alpha, beta C and bias and rounds, from
// the registers.
//
// Compiled for AVX-512 from PRIMUS_AVX512_BF16_BEGIN on, after every header: the standard
// library's inline functions stay compiled for the project's baseline (no AVX-512 code can leak
// into a shared inline function the linker might pick for the whole program), and everything here
// is in an anonymous namespace except the entry point, which the backend calls only on CPUs that
// have AVX512-BF16.
#include <omp.h>

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/bf16/scratch.h"
#include "kernels/cpu/bf16/target.h"

PRIMUS_AVX512_BF16_BEGIN
#include "kernels/cpu/bf16/avx512_common.h"

namespace primus::cpu::bf16k {
namespace {

constexpr int kMr = 8;            // rows of the micro-kernel
constexpr int kNv = 3;            // zmm vectors of 16 columns
constexpr int kNr = 16 * kNv;     // columns of the micro-kernel
constexpr int64_t kKc = 256;      // K block (even); a K of up to 1.25 kKc is one block
constexpr int64_t kMc = 96;       // output tile rows (a multiple of kMr)
constexpr int64_t kNc = 4 * kNr;  // output tile columns (a multiple of kNr)
constexpr int64_t kNcWide = 16 * kNr;  // a tile's columns when it packs its own rows of A (below)
constexpr int64_t kMinRowTilesPerTileA = 4;  // and the row tiles it takes for that
// An fp32 product whose re-read operand is larger than this runs as K slabs of about this size
// (gemm_avx512_slabs): a quarter of a 32 MB last-level cache.
constexpr double kSlabBytes = 8e6;
// Below this many multiply-adds one thread does the whole product.
constexpr double kParallelMin = 1 << 21;

// ---- the micro-kernel ----

// Where a micro-kernel's block of sums goes after its last K block: D rows [m, m + rows),
// columns [n, n + cols), through alpha, beta C and bias.
struct Final {
  int64_t m = 0, n = 0, rows = 0, cols = 0;
  bool stream = false;  // an fp32 D larger than the last-level cache (the logits): written around it
};

inline void store_final(const GemmArgs& g, const Final& f, int i, int v, __m512 acc) {
  const int64_t j = 16 * v;
  if (i >= f.rows || j >= f.cols) return;
  const __mmask16 mask = f.cols - j >= 16 ? 0xffff : __mmask16((1u << (f.cols - j)) - 1);
  const int64_t e = (f.m + i) * g.N + f.n + j;
  __m512 x = _mm512_mul_ps(_mm512_set1_ps(g.alpha), acc);
  if (g.beta != 0.0f) {
    const __m512 c = g.f32_out ? _mm512_maskz_loadu_ps(mask, static_cast<const float*>(g.C) + e)
                               : widen_bf16(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(g.C) + e));
    x = _mm512_fmadd_ps(_mm512_set1_ps(g.beta), c, x);
  }
  if (g.bias) x = _mm512_add_ps(x, widen_bf16(_mm256_maskz_loadu_epi16(mask, g.bias + f.n + j)));
  if (g.f32_out) {
    float* d = static_cast<float*>(g.D) + e;
    if (f.stream && mask == 0xffff && (reinterpret_cast<uintptr_t>(d) & 63) == 0)
      _mm512_stream_ps(d, x);
    else
      _mm512_mask_storeu_ps(d, mask, x);
  }
  else
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(g.D) + e, mask, (__m256i)_mm512_cvtneps_pbh(x));
}

// The sums of kps k-pairs of an A panel and a B panel, kMr x kNr. A's pairs come either packed
// (a_row = 2, a_kp = 2 kMr) or straight from row-major A (a_row = lda, a_kp = 2). They start
// from 0 (zero) or from the tile c (row stride ldt), and go back to c, or to D when fin is given.
inline void micro_kernel(const GemmArgs& g, const uint16_t* a, int64_t a_row, int64_t a_kp, const uint16_t* b,
                         int64_t kps, float* c, int64_t ldt, bool zero, const Final* fin) {
  __m512 acc[kMr][kNv];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < kNv; ++v) acc[i][v] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldt + 16 * v);
  if (fin && !fin->stream) {  // D's lines (and C's) arrive while the sums are computed: the stores do not wait
    const int64_t es = g.f32_out ? 4 : 2;
    for (int64_t i = 0; i < fin->rows; ++i) {
      const int64_t e = (fin->m + i) * g.N + fin->n;
      for (int64_t j = 0; j < fin->cols * es; j += 64) {
        _mm_prefetch(static_cast<const char*>(g.D) + e * es + j, _MM_HINT_T0);
        if (g.beta != 0.0f && g.C != g.D) _mm_prefetch(static_cast<const char*>(g.C) + e * es + j, _MM_HINT_T0);
      }
    }
  }
  const uint16_t* ar[kMr];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) ar[i] = a + i * a_row;
  for (int64_t kp = 0; kp < kps; ++kp) {
    __m512bh bv[kNv];
#pragma GCC unroll 3
    for (int v = 0; v < kNv; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + 32 * v);
    const int64_t off = kp * a_kp;
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(load_pair(ar[i] + off));
#pragma GCC unroll 3
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
    b += kNr * 2;
  }
  if (fin) {
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i)
#pragma GCC unroll 3
      for (int v = 0; v < kNv; ++v) store_final(g, *fin, i, v, acc[i][v]);
    return;
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < kNv; ++v) _mm512_storeu_ps(c + i * ldt + 16 * v, acc[i][v]);
}

// One problem of a grouped call: its packed operands and its tiles.
struct Plan {
  const GemmArgs* g;
  int64_t Kp, bkps, akps, kstep, nc, mtiles, ntiles, kblocks;  // bkps, akps: panel_kps of B's and A's panels
  bool direct_a, a_per_tile, n_outer, stream;
  uint16_t *bp, *ap;
};

// Slice `part` of `parts` of the rows [k0, k0 + n) of a transposed A, columns [m0, m0 + cols), into
// the L2 while the tile computes its current K block with slice `part` of its columns, for the
// next block's packing. Those rows lie a row of the weight gradient's dy apart (64 KB in the
// logits' gradient), where the hardware prefetchers do not follow, so the packing waited on
// memory row by row: 25% of the 32000 x 288 x 2048 logits weight gradient's time alone; 0.785 ->
// 0.855 TFLOP/s with this (4096 x 768 x 2048: 0.836 -> 0.88; huge pages, core/memory.h). In the
// training step, where the packing took 6% of the GEMMs' time, no change showed past the drift.
void prefetch_a_rows(const GemmArgs& g, int64_t m0, int64_t cols, int64_t k0, int64_t n, int64_t part, int64_t parts) {
  const int64_t r0 = k0 + n * part / parts, r1 = k0 + n * (part + 1) / parts;
  for (int64_t r = r0; r < r1; ++r) prefetch_span<_MM_HINT_T1>(g.A + r * g.lda + m0, cols * 2);
}

// Output tile t of p (row-major over its mtiles x ntiles, in p's walking order).
void run_tile(const Plan& p, int64_t t, const uint16_t* zeros, float* tile) {
  const GemmArgs& g = *p.g;
  const int64_t Kp = p.Kp, mtiles = p.mtiles, ntiles = p.ntiles;
  const int64_t mt = p.n_outer ? t % mtiles : t / ntiles, nt = p.n_outer ? t / mtiles : t % ntiles;
  const int64_t m0 = mt * kMc, rows = min64(kMc, g.M - m0);
  const int64_t n0 = nt * p.nc, cols = min64(p.nc, g.N - n0);
  const int64_t ips = ceil_div(rows, kMr), jps = ceil_div(cols, kNr);
  if (Kp == 0) {  // D = beta C + bias
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < rows; i += kMr)
      for (int64_t j = 0; j < cols; j += kNr) {
        const Final f{m0 + i, n0 + j, min64(kMr, rows - i), min64(kNr, cols - j)};
        for (int ii = 0; ii < kMr; ++ii)
          for (int v = 0; v < kNv; ++v) store_final(g, f, ii, v, zero);
      }
    return;
  }
  for (int64_t k0 = 0; k0 < Kp; k0 += p.kstep) {
    const int64_t kps = min64(p.kstep, Kp - k0);
    const bool last = k0 + kps == Kp;
    const int64_t tkps = panel_kps<kMr>(kps);
    uint16_t* a_tile = nullptr;  // this tile's rows of A for this K block, packed now
    if (p.a_per_tile) {
      a_tile = static_cast<uint16_t*>(thread_scratch(kGemmPanel, size_t(ips) * size_t(tkps) * kMr * 2 * 2));
      const PackSource src{g.A + 2 * k0 * g.lda + m0, g.lda, g.K - 2 * k0, rows, true};
      pack<kMr>(src, tkps, 0, kps, a_tile);
    }
    for (int64_t jr = 0; jr < jps; ++jr) {
      if (p.a_per_tile && !last)
        prefetch_a_rows(g, m0, rows, 2 * (k0 + kps), min64(2 * p.kstep, g.K - 2 * (k0 + kps)), jr, jps);
      const uint16_t* b = p.bp + (n0 / kNr + jr) * p.bkps * kNr * 2 + k0 * kNr * 2;
      for (int64_t ir = 0; ir < ips; ++ir) {
        float* c = tile + ir * kMr * p.nc + jr * kNr;
        const int64_t m = m0 + ir * kMr;
        const Final f{m, n0 + jr * kNr, min64(kMr, g.M - m), min64(kNr, cols - jr * kNr), p.stream};
        const Final* fin = last ? &f : nullptr;
        if (p.direct_a) {
          if (m + kMr <= g.M) {
            micro_kernel(g, g.A + m * g.lda + 2 * k0, g.lda, 2, b, kps, c, p.nc, k0 == 0, fin);
          } else {  // the last rows: a panel of row pointers, zeros past M
            auto* panel = static_cast<uint16_t*>(thread_scratch(kGemmPanel, size_t(kps) * kMr * 2 * 2));
            for (int i = 0; i < kMr; ++i) {
              const uint16_t* src = m + i < g.M ? g.A + (m + i) * g.lda + 2 * k0 : zeros;
              for (int64_t kp = 0; kp < kps; ++kp) std::memcpy(panel + kp * kMr * 2 + i * 2, src + 2 * kp, 4);
            }
            micro_kernel(g, panel, 2, 2 * kMr, b, kps, c, p.nc, k0 == 0, fin);
          }
        } else if (a_tile) {
          micro_kernel(g, a_tile + ir * tkps * kMr * 2, 2, 2 * kMr, b, kps, c, p.nc, k0 == 0, fin);
        } else {
          micro_kernel(g, p.ap + (m / kMr) * p.akps * kMr * 2 + k0 * kMr * 2, 2, 2 * kMr, b, kps, c, p.nc, k0 == 0,
                       fin);
        }
      }
    }
  }
}

inline size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

void gemm_avx512_grouped(const GemmArgs* gs, int64_t count) {
  // Plan every problem: one scratch buffer for all the packed B panels (and A panels), so that
  // the packing of every problem, then the tiles of every problem, are shared out among the
  // threads in one parallel region (a small problem alone would leave a thread idle).
  auto* plans = static_cast<Plan*>(thread_scratch(kGemmPlan, sizeof(Plan) * size_t(count > 0 ? count : 1)));
  size_t bbytes = 0, abytes = 0;
  int64_t zeros_k = -1;
  double macs = 0;
  bool any_stream = false;
  int64_t tile_cols = kNc;
  for (int64_t i = 0; i < count; ++i) {
    const GemmArgs& g = gs[i];
    Plan& p = plans[i];
    p = Plan{&g, 0, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, nullptr, nullptr};
    if (g.M <= 0 || g.N <= 0) continue;
    p.Kp = ceil_div(g.K, 2);
    p.bkps = panel_kps<kNr>(p.Kp), p.akps = panel_kps<kMr>(p.Kp);
    // K blocks of equal size, at most kKc (a K a little past kKc, such as a 288-wide model's,
    // stays one block: a second, short block would reload and store every sum for a few k-pairs).
    const int64_t kmax = kKc / 2, nkb = p.Kp <= kmax + kmax / 4 ? 1 : ceil_div(p.Kp, kmax);
    p.kstep = ceil_div(p.Kp, nkb);
    // Row-major A with an even K is read in place; otherwise it is packed.
    p.direct_a = !g.trans_a && g.K % 2 == 0;
    // A transposed (a weight gradient: A is dy, K the tokens, M the layer's outputs; llama2c_15M's
    // logits' gradient has 32000): each tile packs its rows of A for each K block as it needs
    // them, in cache, while the other thread computes, rather than all of A first (a write and a
    // second read of all of it, 131 MB there, with both threads waiting on memory at once); the
    // tile spans up to kNcWide columns, so that few tiles pack the same rows. With fewer than
    // kMinRowTilesPerTileA row tiles, wide tiles would leave a thread idle: A is packed first.
    // (Cold operands, 2-core Zen 5: 864 x 288 x 2048 1.45 -> 1.33 ms, 768 x 768 x 2048 3.00 ->
    // 2.76 ms with per-tile packing from 4 row tiles on, not 16; 288 x 768 x 2048 was level.)
    p.mtiles = ceil_div(g.M, kMc);
    p.a_per_tile = g.trans_a && p.mtiles >= kMinRowTilesPerTileA;
    // Tiles of equal width, at most kNc (kNcWide): N = 288 runs as two tiles of 144 columns, not
    // 192 and 96 (a thread with the narrow tiles would wait for the other).
    const int64_t widest = p.a_per_tile ? kNcWide : kNc, col_tiles = ceil_div(g.N, widest);
    p.nc = ceil_div(ceil_div(g.N, col_tiles), kNr) * kNr;
    p.ntiles = ceil_div(g.N, p.nc), p.kblocks = ceil_div(p.Kp, 16);
    // The tile loop walks along the smaller operand, so that the larger one streams from memory
    // once: with N-tiles outer, a panel of B stays in cache while every row tile of A passes.
    p.n_outer = g.N > g.M;
    // An fp32 D of more than the last-level cache (the logits): non-temporal stores.
    p.stream = g.f32_out && g.beta == 0.0f && double(g.M) * double(g.N) * 4 > 64e6;
    any_stream = any_stream || p.stream;
    bbytes += round64(size_t(ceil_div(g.N, kNr)) * size_t(p.bkps) * kNr * 2 * 2);
    if (!p.direct_a && !p.a_per_tile) abytes += round64(size_t(ceil_div(g.M, kMr)) * size_t(p.akps) * kMr * 2 * 2);
    tile_cols = p.nc > tile_cols ? p.nc : tile_cols;
    if (p.direct_a && g.M % kMr) zeros_k = g.K > zeros_k ? g.K : zeros_k;  // rows past M read a zero row
    macs += double(g.M) * double(g.N) * double(g.K);
  }
  auto* bbase = static_cast<char*>(thread_scratch(kGemmB, bbytes ? bbytes : 64));
  auto* abase = abytes ? static_cast<char*>(thread_scratch(kGemmA, abytes)) : nullptr;
  for (int64_t i = 0; i < count; ++i) {
    Plan& p = plans[i];
    const GemmArgs& g = gs[i];
    if (p.mtiles == 0) continue;
    p.bp = reinterpret_cast<uint16_t*>(bbase);
    bbase += round64(size_t(ceil_div(g.N, kNr)) * size_t(p.bkps) * kNr * 2 * 2);
    if (!p.direct_a && !p.a_per_tile) {
      p.ap = reinterpret_cast<uint16_t*>(abase);
      abase += round64(size_t(ceil_div(g.M, kMr)) * size_t(p.akps) * kMr * 2 * 2);
    }
  }
  uint16_t* zeros = nullptr;
  if (zeros_k >= 0) {
    zeros = static_cast<uint16_t*>(thread_scratch(kGemmZeros, (size_t(zeros_k) + 2) * 2));
    std::memset(zeros, 0, (size_t(zeros_k) + 2) * 2);
  }
  const bool parallel = macs >= kParallelMin && omp_get_max_threads() > 1;

#pragma omp parallel if(parallel)
  {
    // Packing: each thread packs one run of whole 16-k-pair blocks of each problem, in one call,
    // so that pack_k_major's prefetch runs ahead across the run (a thread goes on to the next
    // problem's run without waiting).
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    for (int64_t i = 0; i < count; ++i) {
      const Plan& p = plans[i];
      const GemmArgs& g = *p.g;
      const PackSource bsrc{g.B, g.ldb, g.K, g.N, !g.trans_b}, asrc{g.A, g.lda, g.K, g.M, g.trans_a};
      const int64_t kp0 = p.kblocks * me / threads * 16, kp1 = min64(p.Kp, p.kblocks * (me + 1) / threads * 16);
      if (kp0 >= kp1) continue;
      pack<kNr>(bsrc, p.bkps, kp0, kp1, p.bp);
      if (p.ap) pack<kMr>(asrc, p.akps, kp0, kp1, p.ap);
    }
#pragma omp barrier
    float* tile = static_cast<float*>(thread_scratch(kGemmTile, sizeof(float) * size_t(kMc * tile_cols)));
    for (int64_t i = 0; i < count; ++i) {
      const Plan& p = plans[i];
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t t = 0; t < p.mtiles * p.ntiles; ++t) run_tile(p, t, zeros, tile);
    }
    if (any_stream) _mm_sfence();  // non-temporal stores are weakly ordered: done before anyone reads D
  }
}

void gemm_avx512_slabs(const GemmArgs& g, double slab_bytes) {
  // The operand every outer tile reads again: B when the row tiles are outer, A when the column
  // tiles are (run_tile's n_outer).
  const double reread = double(g.K) * double(g.N > g.M ? g.M : g.N) * 2;
  const int64_t slabs = g.f32_out ? int64_t(reread / slab_bytes) : 1;
  if (slabs < 2 || g.K < 2 * slabs * kKc) {
    gemm_avx512_grouped(&g, 1);
    return;
  }
  // Equal slabs of an even K (k-pairs stay whole, and row-major A stays readable in place).
  const int64_t kslab = (ceil_div(g.K, slabs) + 1) / 2 * 2;
  GemmArgs s = g;
  for (int64_t k0 = 0; k0 < g.K; k0 += kslab) {
    s.K = min64(kslab, g.K - k0);
    s.A = g.trans_a ? g.A + k0 * g.lda : g.A + k0;
    s.B = g.trans_b ? g.B + k0 : g.B + k0 * g.ldb;
    if (k0 > 0) s.beta = 1.0f, s.C = g.D, s.bias = nullptr;  // alpha A B + beta C + bias, a slab at a time
    gemm_avx512_grouped(&s, 1);
  }
}

void gemm_avx512(const GemmArgs& g) { gemm_avx512_slabs(g, kSlabBytes); }

}  // namespace primus::cpu::bf16k

PRIMUS_AVX512_BF16_END
