#include "kernels/fp8.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/fp8_scalar.h"

namespace primus::fp8 {
namespace {

struct Layout {
  int mantissa, bias, emin;  // mantissa bits, exponent bias, exponent of the smallest normal
};
Layout layout_of(Format f) { return f == Format::E4M3 ? Layout{3, 7, -6} : Layout{2, 15, -14}; }

scalar::Format scalar_format(Format f) { return f == Format::E4M3 ? scalar::e4m3() : scalar::e5m2(); }

}  // namespace

float fold_amax(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

const char* format_name(Format f) { return f == Format::E4M3 ? "e4m3" : "e5m2"; }
float max_finite(Format f) { return scalar_format(f).max; }

const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::Tensor: return "tensor";
    case Granularity::Tile1x128: return "1x128 tiles";
    case Granularity::Block128: return "128x128 blocks";
    case Granularity::Mx32: return "1x32 blocks (E8M0)";
  }
  return "?";
}

Granularity coarsest(Granularity a, Granularity b) {
  auto rank = [](Granularity g) { return g == Granularity::Mx32 ? 2 : g == Granularity::Tensor ? 0 : 1; };
  return rank(a) >= rank(b) ? a : b;
}

float round(float x, Format f) {
  if (std::isnan(x)) return x;
  const float m = max_finite(f), a = std::fabs(x);
  if (a >= m) return std::copysign(m, x);
  if (a == 0.0f) return x;
  const Layout l = layout_of(f);
  int e = 0;
  std::frexp(a, &e);                 // a = fr * 2^e, fr in [0.5, 1)
  e = std::max(e - 1, l.emin);       // the binade (subnormals share the smallest normal's quantum)
  const float q = std::ldexp(1.0f, e - l.mantissa);
  const float r = std::nearbyint(a / q) * q;  // a / q is exact; nearbyint rounds ties to even
  return std::copysign(std::min(r, m), x);
}

uint8_t encode(float x, Format f) { return scalar::encode(x, scalar_format(f)); }

float decode(uint8_t bits, Format f) { return scalar::decode(bits, scalar_format(f)); }

float scale_from_amax(float amax, float max, bool pow2) { return scalar::scale_from_amax(amax, max, pow2); }

uint8_t e8m0_of(float value) { return scalar::e8m0_of(value); }

float e8m0_value(uint8_t e) { return e == 0xFF ? NAN : std::ldexp(1.0f, int(e) - 127); }

// round() for arrays: scalar::round, which the compiler vectorizes (branch-free).
void round_array(const float* x, float mul, float post, int64_t n, Format f, float* out) {
  const scalar::Format sf = scalar_format(f);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = scalar::round(x[i] * mul, sf) * post;
}

float amax(const float* x, int64_t n) {
  float m = 0.0f;
  bool nan = false;
#pragma omp simd reduction(max : m) reduction(|| : nan)
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, std::fabs(x[i]));
    nan = nan || x[i] != x[i];
  }
  return nan ? NAN : m;
}

namespace {

// round_array with a multiplier and a factor per element (a band's per-column block scales).
void round_scaled(const float* x, const float* mul, const float* post, int64_t n, Format f, float* out) {
  const scalar::Format sf = scalar_format(f);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = scalar::round(x[i] * mul[i], sf) * post[i];
}

// colmax[c] = max(colmax[c], |x[c]|) with NaN sticky, for one row.
void column_max(const float* x, int64_t n, float* colmax) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]), m = colmax[i];
    colmax[i] = (a > m || a != a) ? a : m;
  }
}

// A block's power-of-two scale from its amax (scalar::block_scale: for MXFP8 2^(127 - e), a normal
// float for every e, where its reciprocal, the E8M0 value, is a denormal for e = 0 that
// flush-to-zero would turn into a division by zero).
float block_scale(float amax, Granularity g, float fmax) { return scalar::block_scale(amax, g == Granularity::Mx32, fmax); }

}  // namespace

int64_t band_rows(Granularity g, bool reduce_cols) {
  if (g == Granularity::Tensor || (g != Granularity::Block128 && reduce_cols)) return 1;
  return g == Granularity::Mx32 ? 32 : 128;
}

int64_t block_cols(Granularity g, bool reduce_cols) {
  if (g == Granularity::Tensor) return 0;
  return g == Granularity::Block128 ? 128 : reduce_cols ? (g == Granularity::Mx32 ? 32 : 128) : 1;
}

float quantize(const float* x, int64_t rows, int64_t cols, Format f, Granularity g, bool reduce_cols, float scale,
               float* out) {
  const int64_t n = rows * cols;
  const float fmax = max_finite(f);
  if (g == Granularity::Tensor) {
    round_array(x, scale, 1.0f, n, f, out);
    return amax(x, n);
  }
  // In bands of whole blocks: the amax of each column over the band's rows, then each block's
  // scale spread over its columns, then every row rounded with its columns' scales. Blocks run
  // along the reduction dimension: along a row (1-D, reduce_cols), down a column (1-D, not
  // reduce_cols), or over 128 x 128 (2-D).
  const int64_t br = band_rows(g, reduce_cols);
  const int64_t bc = block_cols(g, reduce_cols);
  std::vector<float> colmax(static_cast<size_t>(cols)), mul(static_cast<size_t>(cols)), post(static_cast<size_t>(cols));
  float total = 0.0f;
  for (int64_t r0 = 0; r0 < rows; r0 += br) {
    const int64_t nr = std::min(br, rows - r0);
    std::fill(colmax.begin(), colmax.end(), 0.0f);
    for (int64_t r = r0; r < r0 + nr; ++r) column_max(x + r * cols, cols, colmax.data());
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t nc = std::min(bc, cols - c0);
      float a = 0.0f;
      bool nan = false;
      const float* cm = colmax.data() + c0;
#pragma omp simd reduction(max : a) reduction(|| : nan)
      for (int64_t c = 0; c < nc; ++c) {
        a = std::max(a, cm[c]);
        nan = nan || cm[c] != cm[c];
      }
      if (nan) a = NAN;
      total = fold_amax(total, a);
      const float sc = block_scale(a, g, fmax), inv = scalar::inverse_pow2(sc);
      std::fill(mul.begin() + c0, mul.begin() + c0 + nc, sc);
      std::fill(post.begin() + c0, post.begin() + c0 + nc, inv);
    }
    for (int64_t r = r0; r < r0 + nr; ++r) round_scaled(x + r * cols, mul.data(), post.data(), cols, f, out + r * cols);
  }
  return total;
}

void DelayedScale::record(float a) { history[0] = fold_amax(history[0], a); }

void DelayedScale::update(AmaxAlgo algo, float scaled_max) {
  const float newest = history[0];
  float m = 0.0f;
  for (float a : history) m = std::fmax(m, a);  // a NaN entry is passed over, as in TE
  std::rotate(history.begin(), history.begin() + 1, history.end());  // newest to the back
  history[0] = 0.0f;
  const float a = algo == AmaxAlgo::MostRecent ? newest : m;
  if (std::isfinite(a) && a > 0.0f) scale = scaled_max / a;
  if (std::isinf(scale)) scale = FLT_MAX;
}

}  // namespace primus::fp8
