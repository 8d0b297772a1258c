// The AVX-512 loops of the instruction ceiling (kernels/cpu/ceiling.h): a grid of independent
// accumulator chains in registers, each row with its own multiplier register and each column
// with its own, as in the GEMM's micro-kernel. (On Zen 5, 12 chains that all read one register
// pair retire vdpbf16ps at half the rate this grid and the GEMM reach.) Called only where
// cpu_features.h finds the instructions.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/bf16/target.h"

PRIMUS_AVX512_BF16_BEGIN

namespace primus::cpu::bf16k {

namespace {

constexpr int kRows = 6, kCols = 3;  // 18 chains and 9 operand registers of the 32

float lane_sum(__m512 v) {
  float lanes[16];
  _mm512_storeu_ps(lanes, v);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}

template <class Op>
float grid_loop(long iters, __m512 (&a)[kRows], __m512 (&b)[kCols], Op op) {
  __m512 acc[kRows][kCols];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kCols; ++v) acc[i][v] = _mm512_setzero_ps();
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 3
      for (int v = 0; v < kCols; ++v) acc[i][v] = op(acc[i][v], a[i], b[v]);
  __m512 s = _mm512_setzero_ps();
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < kCols; ++v) s = _mm512_add_ps(s, acc[i][v]);
  return lane_sum(s);
}

}  // namespace

int ceiling_zmm_chains() { return kRows * kCols; }

float dpbf16_zmm_loop(long iters) {
  // bf16 pairs near 1.0 (rows) and near 2^-20 (columns): each step adds about 2^-19 to every lane.
  __m512 a[kRows], b[kCols];
  for (int i = 0; i < kRows; ++i) a[i] = _mm512_castsi512_ps(_mm512_set1_epi16(short(0x3f80 + i)));
  for (int v = 0; v < kCols; ++v) b[v] = _mm512_castsi512_ps(_mm512_set1_epi16(short(0x3580 + v)));
  return grid_loop(iters, a, b, [](__m512 c, __m512 x, __m512 y) {
    return _mm512_dpbf16_ps(c, (__m512bh)_mm512_castps_si512(x), (__m512bh)_mm512_castps_si512(y));
  });
}

float fma_zmm_loop(long iters) {
  __m512 a[kRows], b[kCols];
  for (int i = 0; i < kRows; ++i) a[i] = _mm512_set1_ps(0.999f - 1e-4f * float(i));
  for (int v = 0; v < kCols; ++v) b[v] = _mm512_set1_ps(1e-3f * float(v + 1));
  return grid_loop(iters, a, b, [](__m512 c, __m512 x, __m512 y) { return _mm512_fmadd_ps(c, x, y); });
}

}  // namespace primus::cpu::bf16k

PRIMUS_AVX512_BF16_END
