// The AVX-512 loops of the instruction ceiling (kernels/cpu/ceiling.h): 12 independent chains of
// vdpbf16ps or of zmm FMAs in registers. Called only where cpu_features.h finds the instructions.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/bf16/target.h"

PRIMUS_AVX512_BF16_BEGIN

namespace primus::cpu::bf16k {

namespace {
float lane_sum(__m512 v) {
  float lanes[16];
  _mm512_storeu_ps(lanes, v);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}
}  // namespace

float dpbf16_zmm_loop(long iters) {
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(float(k) * 1e-3f);
  // 1.0 and 2^-20 as bf16 pairs: each step adds 2 x 2^-20 to every lane.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3580);
  for (long i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  return lane_sum(s);
}

float fma_zmm_loop(long iters) {
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(float(k) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (long i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  return lane_sum(s);
}

}  // namespace primus::cpu::bf16k

PRIMUS_AVX512_BF16_END
