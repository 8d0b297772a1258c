// The MoE token-routing row ops of the bf16 backend (kernels.h) on AVX-512: the default
// implementation's arithmetic (kernels/row_ops.cpp: bf16 widened to double, products and fused
// multiply-adds in double, one rounding to fp32 and then to bf16 per result, in list order), so
// their bits are the default's, eight doubles at a time and shared out among the threads by
// output row.
#include <omp.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/bf16/kernels.h"
#include "kernels/cpu/bf16/target.h"

PRIMUS_AVX512_BF16_BEGIN
#include "kernels/cpu/bf16/avx512_common.h"

namespace primus::cpu::bf16k {
namespace {

// Loops over fewer elements than this run on one thread.
constexpr int64_t kParallelMin = 1 << 15;

// 16 bf16 values (masked) as two vectors of 8 doubles.
inline void load_bf16_pd(const uint16_t* p, __mmask16 m, __m512d& lo, __m512d& hi) {
  const __m512 f = load_bf16(p, m);
  lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
}

// Two vectors of 8 doubles rounded to fp32, then to bf16 as bf16::from_float does, stored masked.
inline void store_pd_bf16(uint16_t* p, __mmask16 m, __m512d lo, __m512d hi) {
  const __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
  _mm256_mask_storeu_epi16(p, m, float_to_bf16_exact(f));
}

}  // namespace

void gather_rows(const uint16_t* x, int64_t c, const int32_t* rows, const double* scale, int64_t n, uint16_t* out) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* src = x + int64_t(rows[i]) * c;
    uint16_t* dst = out + i * c;
    const __m512d s = _mm512_set1_pd(scale ? scale[i] : 1.0);
    for (int64_t j = 0; j < c; j += 16) {
      const __mmask16 m = tail_mask(c - j);
      __m512d lo, hi;
      load_bf16_pd(src + j, m, lo, hi);
      store_pd_bf16(dst + j, m, _mm512_mul_pd(s, lo), _mm512_mul_pd(s, hi));
    }
  }
}

void scatter_add_rows(const uint16_t* y, int64_t c, const int64_t* first, const int32_t* order, int64_t out_rows,
                      const double* scale, uint16_t* out) {
#pragma omp parallel for schedule(static) if (first[out_rows] * c >= kParallelMin)
  for (int64_t r = 0; r < out_rows; ++r) {
    if (first[r] == first[r + 1]) continue;  // no contribution: the row stays as it is
    uint16_t* dst = out + r * c;
    for (int64_t j = 0; j < c; j += 16) {
      const __mmask16 m = tail_mask(c - j);
      __m512d acc_lo, acc_hi;
      load_bf16_pd(dst + j, m, acc_lo, acc_hi);
      for (int64_t q = first[r]; q < first[r + 1]; ++q) {
        const int64_t i = order[q];
        const __m512d s = _mm512_set1_pd(scale ? scale[i] : 1.0);
        __m512d lo, hi;
        load_bf16_pd(y + i * c + j, m, lo, hi);
        acc_lo = _mm512_fmadd_pd(s, lo, acc_lo);
        acc_hi = _mm512_fmadd_pd(s, hi, acc_hi);
      }
      store_pd_bf16(dst + j, m, acc_lo, acc_hi);
    }
  }
}

// Each dot product is one chain of fused multiply-adds over the columns in order (the default's
// bits); eight rows' chains run side by side.
void row_dots(const uint16_t* a, int64_t c, const int32_t* rows, const uint16_t* b, int64_t n, double* out) {
  constexpr int64_t kRows = 8;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t i0 = 0; i0 < n; i0 += kRows) {
    const int64_t nr = min64(kRows, n - i0);
    const uint16_t* ar[kRows];
    const uint16_t* br[kRows];
    double s[kRows];
    for (int64_t q = 0; q < kRows; ++q) {
      const int64_t i = i0 + (q < nr ? q : 0);
      ar[q] = a + int64_t(rows[i]) * c;
      br[q] = b + i * c;
      s[q] = 0;
    }
    for (int64_t j = 0; j < c; ++j)
#pragma GCC unroll 8
      for (int64_t q = 0; q < kRows; ++q)
        s[q] = std::fma(double(bf16_to_float(ar[q][j])), double(bf16_to_float(br[q][j])), s[q]);
    for (int64_t q = 0; q < nr; ++q) out[i0 + q] = s[q];
  }
}

}  // namespace primus::cpu::bf16k

PRIMUS_AVX512_BF16_END
