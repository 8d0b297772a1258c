// The bf16 backend's row and element kernels on AVX-512 (kernels.h): bf16 loads widened to fp32,
// fp32 arithmetic, one rounding per output. Reductions over columns (weight gradients of the
// norm, the embedding, bias sums) give each thread whole columns and add rows in order, so their
// fp32 results do not depend on the thread count.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/bf16/kernels.h"
#include "kernels/cross_entropy.h"
#include "kernels/cpu/bf16/target.h"

PRIMUS_AVX512_BF16_BEGIN
#include "kernels/cpu/bf16/avx512_common.h"

namespace primus::cpu::bf16k {
namespace {

// Loops over fewer elements than this run on one thread.
constexpr int64_t kParallelMin = 1 << 15;

inline __m512 sigmoid512(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

}  // namespace

void rmsnorm_forward(const uint16_t* x, const uint16_t* w, uint16_t* y, float* rstd, int64_t n, int64_t c, float eps) {
#pragma omp parallel for schedule(static) if(n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* xi = x + i * c;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t j = 0; j < c; j += 16) {
      if (j % 32 == 0) prefetch_ahead(xi + j);
      const __m512 v = load_bf16(xi + j, tail_mask(c - j));
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    const float r = 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / float(c) + eps);
    rstd[i] = r;
    const __m512 rv = _mm512_set1_ps(r);
    for (int64_t j = 0; j < c; j += 16) {
      const __mmask16 m = tail_mask(c - j);
      store_bf16(y + i * c + j, _mm512_mul_ps(_mm512_mul_ps(load_bf16(xi + j, m), rv), load_bf16(w + j, m)), m);
    }
  }
}

// With g = dy * w and xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)).
void rmsnorm_backward_input(const uint16_t* dy, const uint16_t* x, const uint16_t* w, const float* rstd,
                            const uint16_t* residual, uint16_t* dx, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if(n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t *xi = x + i * c, *dyi = dy + i * c;
    __m512 dot = _mm512_setzero_ps();
    for (int64_t j = 0; j < c; j += 16) {
      if (j % 32 == 0) prefetch_ahead(xi + j), prefetch_ahead(dyi + j);
      const __mmask16 m = tail_mask(c - j);
      dot = _mm512_fmadd_ps(_mm512_mul_ps(load_bf16(dyi + j, m), load_bf16(w + j, m)), load_bf16(xi + j, m), dot);
    }
    const float r = rstd[i];
    const __m512 rv = _mm512_set1_ps(r), k = _mm512_set1_ps(_mm512_reduce_add_ps(dot) * r * r / float(c));
    for (int64_t j = 0; j < c; j += 16) {
      const __mmask16 m = tail_mask(c - j);
      if (residual && j % 32 == 0) prefetch_ahead(residual + i * c + j);
      const __m512 t = _mm512_fnmadd_ps(load_bf16(xi + j, m), k,
                                        _mm512_mul_ps(load_bf16(dyi + j, m), load_bf16(w + j, m)));
      // With a residual, one fused multiply-add, written out (GCC had contracted the product and
      // the sum into one, and stops where a branch falls between them).
      store_bf16(dx + i * c + j,
                 residual ? _mm512_fmadd_ps(rv, t, load_bf16(residual + i * c + j, m)) : _mm512_mul_ps(rv, t), m);
    }
  }
}

void rmsnorm_backward_weight(const uint16_t* dy, const uint16_t* x, const float* rstd, float* dw, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if(n * c >= kParallelMin)
  for (int64_t j0 = 0; j0 < c; j0 += 64) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __mmask16 m[4];
    for (int v = 0; v < 4; ++v) m[v] = j0 + 16 * v < c ? tail_mask(c - j0 - 16 * v) : __mmask16(0);
    for (int64_t i = 0; i < n; ++i) {
      if (i + 8 < n)
        prefetch_span(dy + (i + 8) * c + j0, min64(64, c - j0) * 2),
            prefetch_span(x + (i + 8) * c + j0, min64(64, c - j0) * 2);
      const __m512 r = _mm512_set1_ps(rstd[i]);
      for (int v = 0; v < 4; ++v) {
        if (!m[v]) break;
        const int64_t e = i * c + j0 + 16 * v;
        acc[v] = _mm512_fmadd_ps(_mm512_mul_ps(load_bf16(dy + e, m[v]), load_bf16(x + e, m[v])), r, acc[v]);
      }
    }
    for (int v = 0; v < 4 && m[v]; ++v) {
      float* d = dw + j0 + 16 * v;
      _mm512_mask_storeu_ps(d, m[v], _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], d), acc[v]));
    }
  }
}

void swiglu_forward(const uint16_t* gate_up, uint16_t* act, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static) if(n * f >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* g = gate_up + i * 2 * f;
    for (int64_t j = 0; j < f; j += 16) {
      if (j % 32 == 0) prefetch_ahead(g + j), prefetch_ahead(g + f + j);
      const __mmask16 m = tail_mask(f - j);
      const __m512 gv = load_bf16(g + j, m);
      store_bf16(act + i * f + j, _mm512_mul_ps(_mm512_mul_ps(gv, sigmoid512(gv)), load_bf16(g + f + j, m)), m);
    }
  }
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
void swiglu_backward(const uint16_t* dact, const uint16_t* gate_up, uint16_t* dgate_up, int64_t n, int64_t f) {
  const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for schedule(static) if(n * f >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* g = gate_up + i * 2 * f;
    uint16_t* dg = dgate_up + i * 2 * f;
    for (int64_t j = 0; j < f; j += 16) {
      if (j % 32 == 0) prefetch_ahead(g + j), prefetch_ahead(g + f + j), prefetch_ahead(dact + i * f + j);
      const __mmask16 m = tail_mask(f - j);
      const __m512 gv = load_bf16(g + j, m), uv = load_bf16(g + f + j, m), da = load_bf16(dact + i * f + j, m);
      const __m512 s = sigmoid512(gv);
      const __m512 dsilu = _mm512_mul_ps(s, _mm512_fmadd_ps(gv, _mm512_sub_ps(one, s), one));
      store_bf16(dg + j, _mm512_mul_ps(_mm512_mul_ps(da, uv), dsilu), m);
      store_bf16(dg + f + j, _mm512_mul_ps(da, _mm512_mul_ps(gv, s)), m);
    }
  }
}

namespace {

// Pairs i .. i + 15 (mask m) of one head v, rotated from their values a (first half) and b.
inline void rope_pairs(uint16_t* v, int64_t half, int64_t i, __mmask16 m, __m512 a, __m512 b, const float* cp,
                       const float* sp, __m512 sign) {
  const __m512 c = _mm512_maskz_loadu_ps(m, cp + i), s = _mm512_mul_ps(sign, _mm512_maskz_loadu_ps(m, sp + i));
  store_bf16(v + i, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)), m);
  store_bf16(v + half + i, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)), m);
}

}  // namespace

void rope_apply(uint16_t* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0,
                const float* cos, const float* sin, bool inverse) {
  const int64_t half = head_dim / 2;
  const __m512 sign = _mm512_set1_ps(inverse ? -1.0f : 1.0f);
#pragma omp parallel for schedule(static) if(rows * stride >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = pos0 + r % seq;
    const float* cp = cos + pos * half;
    const float* sp = sin + pos * half;
    if (r + 2 < rows) prefetch_span(x + (r + 2) * stride, heads * head_dim * 2);
    for (int64_t h = 0; h < heads; ++h) {
      uint16_t* v = x + r * stride + h * head_dim;
      if (half % 16 == 0) {
        for (int64_t i = 0; i < half; i += 16)
          rope_pairs(v, half, i, 0xffff, load_bf16(v + i), load_bf16(v + half + i), cp, sp, sign);
        continue;
      }
      // A half that is not a multiple of 16 (llama2c_15M's head dim 48): up to 64 pairs loaded
      // before any is stored, or the load of the next 16 would overlap the store just made and
      // wait for it (a failed store forwarding): 0.23 -> 0.13 ms on 2048 rows of 12 such heads.
      for (int64_t i0 = 0; i0 < half; i0 += 64) {
        const int nv = int(min64(4, ceil_div(half - i0, 16)));
        __m512 a[4], b[4];
        for (int k = 0; k < nv; ++k) {
          const __mmask16 m = tail_mask(half - i0 - 16 * k);
          a[k] = load_bf16(v + i0 + 16 * k, m), b[k] = load_bf16(v + half + i0 + 16 * k, m);
        }
        for (int k = 0; k < nv; ++k)
          rope_pairs(v, half, i0 + 16 * k, tail_mask(half - i0 - 16 * k), a[k], b[k], cp, sp, sign);
      }
    }
  }
}

void embedding_forward(const int32_t* tokens, const uint16_t* table, uint16_t* out, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if(n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0)
      std::memset(out + i * c, 0, size_t(c) * 2);
    else
      std::memcpy(out + i * c, table + int64_t(tokens[i]) * c, size_t(c) * 2);
  }
}

// Threads own column blocks, so repeated tokens never race; rows are added in order.
void embedding_backward(const int32_t* tokens, const uint16_t* dout, float* dtable, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if(n * c >= kParallelMin)
  for (int64_t j0 = 0; j0 < c; j0 += 64) {
    for (int64_t i = 0; i < n; ++i) {
      if (tokens[i] < 0) continue;
      float* dst = dtable + int64_t(tokens[i]) * c;
      for (int64_t j = j0; j < j0 + 64 && j < c; j += 16) {
        const __mmask16 m = tail_mask(c - j);
        _mm512_mask_storeu_ps(dst + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + j), load_bf16(dout + i * c + j, m)));
      }
    }
  }
}

void column_sum_accumulate(const uint16_t* dy, float* out, int64_t n, int64_t m_cols) {
#pragma omp parallel for schedule(static) if(n * m_cols >= kParallelMin)
  for (int64_t j0 = 0; j0 < m_cols; j0 += 64) {
    // Onto the running sums row by row, as the reference adds.
    __m512 acc[4];
    __mmask16 m[4];
    for (int v = 0; v < 4; ++v) {
      m[v] = j0 + 16 * v < m_cols ? tail_mask(m_cols - j0 - 16 * v) : __mmask16(0);
      acc[v] = _mm512_maskz_loadu_ps(m[v], out + j0 + 16 * v);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (i + 8 < n) prefetch_span(dy + (i + 8) * m_cols + j0, min64(64, m_cols - j0) * 2);
      for (int v = 0; v < 4 && m[v]; ++v) acc[v] = _mm512_add_ps(acc[v], load_bf16(dy + i * m_cols + j0 + 16 * v, m[v]));
    }
    for (int v = 0; v < 4 && m[v]; ++v) _mm512_mask_storeu_ps(out + j0 + 16 * v, m[v], acc[v]);
  }
}

void add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* out, int64_t n) {
#pragma omp parallel for schedule(static) if(n >= kParallelMin)
  for (int64_t i = 0; i < n; i += 16) {
    if (i % 32 == 0) prefetch_ahead(a + i), prefetch_ahead(b + i);
    const __mmask16 m = tail_mask(n - i);
    store_bf16(out + i, _mm512_add_ps(load_bf16(a + i, m), load_bf16(b + i, m)), m);
  }
}

void add_f32(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for schedule(static) if(n >= kParallelMin)
  for (int64_t i = 0; i < n; i += 16) {
    prefetch_ahead(a + i), prefetch_ahead(b + i);
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

void cast_f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp parallel for schedule(static) if(n >= kParallelMin)
  for (int64_t i = 0; i < n; i += 16) {
    prefetch_ahead(src + i);
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, src + i);
    // vcvtneps2bf16 treats denormal inputs as zero; bf16::from_float rounds them. Keep the
    // reference's bits for the rare denormal (a master weight can hold one).
    const __mmask16 denormal = _mm512_mask_fpclass_ps_mask(m, v, 0x20);
    store_bf16(dst + i, v, m);
    if (denormal)
      for (int k = 0; k < 16; ++k)
        if (denormal >> k & 1) dst[i + k] = float_to_bf16(src[i + k]);
  }
}

void cast_bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
#pragma omp parallel for schedule(static) if(n >= kParallelMin)
  for (int64_t i = 0; i < n; i += 16) {
    if (i % 32 == 0) prefetch_ahead(src + i);
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, load_bf16(src + i, m));
  }
}

// Soft-capping (kernels/softcap.h): cap * tanh(x / cap), tanh as (e - 1) / (e + 1) with e = exp(2y)
// (exp512 saturates, so the cap saturates to +-cap). cap <= 0: x.
inline __m512 softcap512(__m512 x, float cap) {
  if (!(cap > 0.0f)) return x;
  const __m512 c = _mm512_set1_ps(cap), one = _mm512_set1_ps(1.0f);
  const __m512 e = exp512(_mm512_mul_ps(x, _mm512_set1_ps(2.0f / cap)));
  return _mm512_mul_ps(c, _mm512_div_ps(_mm512_sub_ps(e, one), _mm512_add_ps(e, one)));
}

// One row of a chunk: the max over the chunk's (soft-capped) logits from m0, and the sum of
// exp(z - max) re-based from the running (m0, s0).
struct CeRowStats {
  float max, sum;
};
inline CeRowStats ce_row_stats(const float* z, int64_t vc, float cap, float m0, float s0) {
  __m512 mx = _mm512_set1_ps(m0);
  for (int64_t j = 0; j < vc; j += 16) {
    prefetch_ahead(z + j);
    const __mmask16 m = tail_mask(vc - j);
    mx = _mm512_mask_max_ps(mx, m, mx, softcap512(_mm512_maskz_loadu_ps(m, z + j), cap));
  }
  const float M = _mm512_reduce_max_ps(mx);
  const __m512 Mv = _mm512_set1_ps(M);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < vc; j += 16) {
    const __mmask16 m = tail_mask(vc - j);
    const __m512 zc = softcap512(_mm512_maskz_loadu_ps(m, z + j), cap);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(zc, Mv))));
  }
  return {M, (s0 == 0.0f ? 0.0f : s0 * std::exp(m0 - M)) + _mm512_reduce_add_ps(sum)};
}

inline float ce_row_target(const float* z, int64_t t, float cap) {
  return _mm512_cvtss_f32(softcap512(_mm512_set1_ps(z[t]), cap));
}

// One row's softmax - onehot (t: the target's column in the chunk, or outside it; masked < 0 rows
// pass masked), times the cap's slope; into bf16 d16 or fp32 d32 (which may be z itself: each
// element is read before it is written).
inline void ce_row_grad(const float* z, int64_t vc, int64_t t, bool masked, float lse, float cap, uint16_t* d16,
                        float* d32) {
  const __m512 l = _mm512_set1_ps(lse);
  for (int64_t j = 0; j < vc; j += 16) {
    const __mmask16 m = tail_mask(vc - j);
    const __m512 zc = softcap512(_mm512_maskz_loadu_ps(m, z + j), cap);
    __m512 d = masked ? _mm512_setzero_ps() : exp512(_mm512_sub_ps(zc, l));
    if (t >= j && t < j + 16)  // the target's column: p - 1, rounded once
      d = _mm512_mask_sub_ps(d, __mmask16(1u << (t - j)), d, _mm512_set1_ps(1.0f));
    if (cap > 0.0f) {  // times the cap's slope 1 - (z / cap)^2
      const __m512 u = _mm512_mul_ps(zc, _mm512_set1_ps(1.0f / cap));
      d = _mm512_mul_ps(d, _mm512_fnmadd_ps(u, u, _mm512_set1_ps(1.0f)));
    }
    if (d16)
      store_bf16(d16 + j, d, m);
    else
      _mm512_mask_storeu_ps(d32 + j, m, d);
  }
}

void ce_chunk_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, float cap,
                      float* row_max, float* row_sum, float* target_logit) {
#pragma omp parallel for schedule(static) if(n * vc >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * vc;
    const CeRowStats r = ce_row_stats(z, vc, cap, row_max[i], row_sum[i]);
    row_sum[i] = r.sum;
    row_max[i] = r.max;
    if (targets[i] >= c0 && targets[i] < c0 + vc) target_logit[i] = ce_row_target(z, targets[i] - c0, cap);
  }
}

void ce_chunk_backward(const float* logits, const float* lse, const int32_t* targets, int64_t n, int64_t vc, int64_t c0,
                       float cap, uint16_t* dlogits_bf16, float* dlogits_f32) {
#pragma omp parallel for schedule(static) if(n * vc >= kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    ce_row_grad(logits + i * vc, vc, targets[i] - c0, targets[i] < 0, lse[i], cap,
                dlogits_bf16 ? dlogits_bf16 + i * vc : nullptr, dlogits_f32 ? dlogits_f32 + i * vc : nullptr);
}

void ce_forward_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, float cap,
                         float* lse, float* target_logit, uint16_t* dlogits_bf16, float* dlogits_f32) {
#pragma omp parallel for schedule(static) if(n * vc >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * vc;  // read from memory once: the later passes find the row in cache
    const int64_t t = targets[i] - c0;
    const CeRowStats r = ce_row_stats(z, vc, cap, -std::numeric_limits<float>::infinity(), 0.0f);
    target_logit[i] = t >= 0 && t < vc ? ce_row_target(z, t, cap) : 0.0f;
    lse[i] = ops::ce_log_sum_exp(r.max, r.sum);
    ce_row_grad(z, vc, t, targets[i] < 0, lse[i], cap, dlogits_bf16 ? dlogits_bf16 + i * vc : nullptr,
                dlogits_f32 ? dlogits_f32 + i * vc : nullptr);
  }
}

}  // namespace primus::cpu::bf16k

PRIMUS_AVX512_BF16_END
