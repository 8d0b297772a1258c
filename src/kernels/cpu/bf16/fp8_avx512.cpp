// The bf16 backend's FP8 quantization (kernels.h): fp8::amax and fp8::quantize on bf16 tensors in
// one pass from bf16 to bf16, 16 lanes at a time. The rounding is fp8_scalar.h's, operation for
// operation (integer exponent arithmetic, one fp32 add and subtract, saturation, NaN kept), so the
// bits equal the op set's default (tests/unit/fp8: Fp8Avx512.*). Block scales come from the same
// scalar rules (scalar::block_scale), one call per block.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16/kernels.h"
#include "kernels/cpu/bf16/target.h"
#include "kernels/fp8.h"
#include "kernels/fp8_scalar.h"

PRIMUS_AVX512_BF16_BEGIN
#include "kernels/cpu/bf16/avx512_common.h"

namespace primus::cpu::bf16k {
namespace {

namespace sc = fp8::scalar;

// A format as scalar::round sees it, on 16 lanes.
struct Fp8Lanes {
  __m512i emin, ecap, mant_shift;  // mant_shift: 23 - mantissa bits
  __m512 max;
  float fmax;
  explicit Fp8Lanes(fp8::Format f) {
    const sc::Format s = f == fp8::Format::E4M3 ? sc::e4m3() : sc::e5m2();
    emin = _mm512_set1_epi32(s.emin_biased);
    ecap = _mm512_set1_epi32(s.ecap);
    mant_shift = _mm512_set1_epi32(23 - s.mantissa);
    max = _mm512_set1_ps(s.max);
    fmax = s.max;
  }
};

// scalar::round on 16 lanes: |v| + c - c with c = 2^(e - mantissa) for v's binade e (clamped to
// [smallest normal, first saturating]), then min with the largest finite value, NaN kept, the sign
// put back.
inline __m512 round_fp8(__m512 v, const Fp8Lanes& f) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(b, _mm512_set1_epi32(int32_t(0x80000000u)));
  const __m512i ab = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512 a = _mm512_castsi512_ps(ab);
  __m512i e = _mm512_srli_epi32(ab, 23);
  e = _mm512_min_epi32(_mm512_max_epi32(e, f.emin), f.ecap);
  const __m512 c = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, f.mant_shift), 23));
  __m512 r = _mm512_sub_ps(_mm512_add_ps(a, c), c);
  r = _mm512_min_ps(r, f.max);  // a NaN r (only from a NaN a) is put back next
  r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), r, a);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
}

// fp32 to bf16 as the op set's default stores FP8 results: to nearest even by the bits (FP8
// values and their power-of-two rescalings are bf16 values, so this is exact for them).
inline void store_rounded(uint16_t* p, __m512 v, __mmask16 m) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(r));
}

inline __m512 abs512(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

// A running amax |x| over lanes, NaN sticky.
struct Amax {
  __m512 m;
  __mmask16 nan;
  Amax() : m(_mm512_setzero_ps()), nan(0) {}
  void add(__m512 v) {
    m = _mm512_max_ps(m, abs512(v));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  float value() const { return nan ? NAN : _mm512_reduce_max_ps(m); }
};

float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b); }

// out = round(x * mul) * post over n values (one scale for all); returns amax |x|.
float quantize_run(const uint16_t* x, int64_t n, const Fp8Lanes& f, float mul, float post, uint16_t* out) {
  const __m512 s = _mm512_set1_ps(mul), p = _mm512_set1_ps(post);
  Amax a;
  for (int64_t i = 0; i < n; i += 16) {
    if (i % 32 == 0) prefetch_ahead(x + i);
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = load_bf16(x + i, m);
    a.add(v);
    store_rounded(out + i, _mm512_mul_ps(round_fp8(_mm512_mul_ps(v, s), f), p), m);
  }
  return a.value();
}

// 1-D blocks of bc (32 or 128) values along each row.
float quantize_row_blocks(const uint16_t* x, int64_t rows, int64_t cols, int64_t bc, bool mx, const Fp8Lanes& f,
                          uint16_t* out) {
  float total = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t nc = min64(bc, cols - c0);
      const uint16_t* xb = x + r * cols + c0;
      Amax a;
      for (int64_t i = 0; i < nc; i += 16) {
        if (i % 32 == 0) prefetch_ahead(xb + i);
        a.add(load_bf16(xb + i, tail_mask(nc - i)));
      }
      const float amax = a.value();
      total = nan_max(total, amax);
      const float s = sc::block_scale(amax, mx, f.fmax);
      quantize_run(xb, nc, f, s, sc::inverse_pow2(s), out + r * cols + c0);
    }
  return total;
}

// Blocks down the columns: each column of a band of `rows` rows (1-D, bc = 1) or 128 x 128 blocks
// (bc = 128): the columns' amaxes over the rows, each block's scale spread over its columns, then
// every row rounded with its columns' scales.
float quantize_column_blocks(const uint16_t* x, int64_t rows, int64_t cols, int64_t bc, bool mx, const Fp8Lanes& f,
                             uint16_t* out) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(3 * cols)) buf.resize(size_t(3 * cols));
  float *colmax = buf.data(), *mul = colmax + cols, *post = mul + cols;
  for (int64_t c = 0; c < cols; c += 16) _mm512_mask_storeu_ps(colmax + c, tail_mask(cols - c), _mm512_setzero_ps());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) {
      if (c % 32 == 0) prefetch_ahead(x + r * cols + c);
      const __mmask16 m = tail_mask(cols - c);
      const __m512 a = abs512(load_bf16(x + r * cols + c, m)), old = _mm512_maskz_loadu_ps(m, colmax + c);
      const __mmask16 take = _mm512_cmp_ps_mask(a, old, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
      _mm512_mask_storeu_ps(colmax + c, m, _mm512_mask_blend_ps(take, old, a));
    }
  float total = 0.0f;
  for (int64_t c0 = 0; c0 < cols; c0 += bc) {
    const int64_t nc = min64(bc, cols - c0);
    float a = 0.0f;
    for (int64_t c = c0; c < c0 + nc; ++c) a = nan_max(a, colmax[c]);
    total = nan_max(total, a);
    const float s = sc::block_scale(a, mx, f.fmax), inv = sc::inverse_pow2(s);
    for (int64_t c = c0; c < c0 + nc; ++c) mul[c] = s, post[c] = inv;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = tail_mask(cols - c);
      const __m512 v = _mm512_mul_ps(load_bf16(x + r * cols + c, m), _mm512_maskz_loadu_ps(m, mul + c));
      store_rounded(out + r * cols + c, _mm512_mul_ps(round_fp8(v, f), _mm512_maskz_loadu_ps(m, post + c)), m);
    }
  return total;
}

}  // namespace

float fp8_amax(const uint16_t* x, int64_t n) {
  Amax a;
  for (int64_t i = 0; i < n; i += 16) {
    if (i % 32 == 0) prefetch_ahead(x + i);
    a.add(load_bf16(x + i, tail_mask(n - i)));
  }
  return a.value();
}

float fp8_quantize(const uint16_t* x, int64_t rows, int64_t cols, fp8::Format format, fp8::Granularity g,
                   bool reduce_cols, float scale, uint16_t* out) {
  const Fp8Lanes f(format);
  const bool mx = g == fp8::Granularity::Mx32;
  const int64_t bc = fp8::block_cols(g, reduce_cols);
  if (g == fp8::Granularity::Tensor) return quantize_run(x, rows * cols, f, scale, 1.0f, out);
  if (g != fp8::Granularity::Block128 && reduce_cols) return quantize_row_blocks(x, rows, cols, bc, mx, f, out);
  float total = 0.0f;
  const int64_t br = fp8::band_rows(g, reduce_cols);
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    total = nan_max(total, quantize_column_blocks(x + r0 * cols, min64(br, rows - r0), cols, bc, mx, f,
                                                  out + r0 * cols));
  return total;
}

}  // namespace primus::cpu::bf16k
PRIMUS_AVX512_BF16_END
