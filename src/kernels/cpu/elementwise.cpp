#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/fast_math.h"

// Loops over fewer elements than this run on one thread: a parallel region costs more than it
// saves on tiny work (decoding one token, the test models).
static constexpr int64_t kElementwiseParallelMin = 1 << 15;

namespace primus::cpu {

template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t c, double eps) {
#pragma omp parallel for schedule(static) if(n * c >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * c;
    T* yi = y + i * c;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) ss += xi[j] * xi[j];
    T r = T(1) / std::sqrt(ss / T(c) + T(eps));
    rstd[i] = r;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) yi[j] = xi[j] * r * w[j];
  }
}

// With g = dy * w and xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)).
template <typename T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, const T* rstd, T* dx, int64_t n, int64_t c,
                            bool accumulate) {
#pragma omp parallel for schedule(static) if(n * c >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * c;
    const T* dyi = dy + i * c;
    T* dxi = dx + i * c;
    const T r = rstd[i];
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < c; ++j) dot += dyi[j] * w[j] * xi[j];
    const T k = dot * r * r / T(c);
    if (accumulate) {
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dxi[j] += r * (dyi[j] * w[j] - xi[j] * k);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dxi[j] = r * (dyi[j] * w[j] - xi[j] * k);
    }
  }
}

// Columns are split over threads so that no two threads write the same dw entry.
template <typename T>
void rmsnorm_backward_weight(const T* dy, const T* x, const T* rstd, T* dw, int64_t n, int64_t c) {
  const int64_t block = 64;
#pragma omp parallel for schedule(static) if(n * c >= kElementwiseParallelMin)
  for (int64_t j0 = 0; j0 < c; j0 += block) {
    const int64_t j1 = std::min(c, j0 + block);
    T acc[64] = {};
    for (int64_t i = 0; i < n; ++i) {
      const T r = rstd[i];
      const T* dyi = dy + i * c;
      const T* xi = x + i * c;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += dyi[j] * xi[j] * r;
    }
    for (int64_t j = j0; j < j1; ++j) dw[j] += acc[j - j0];
  }
}

template <typename T>
static inline T sigmoid(T v) {
  return T(1) / (T(1) + fast_exp(-v));  // fast_exp vectorises; std::exp (float) would not
}

// Megatron's glu() with its options (elementwise.h): g = min(gate, limit), u = clamp(up, +-limit),
// a = g sigmoid(alpha g) (u + offset); the clamps pass no gradient where they cut.
template <typename T>
void glu_forward(const T* gate_up, T* a, int64_t n, int64_t f, const Glu& glu) {
  const T alpha = T(glu.alpha), offset = T(glu.offset), limit = T(glu.limit);
  const bool clamp = glu.limit > 0;
#pragma omp parallel for schedule(static) if(n * f >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* g = gate_up + i * 2 * f;
    const T* u = g + f;
    T* ai = a + i * f;
    for (int64_t j = 0; j < f; ++j) {
      const T gc = clamp ? std::min(g[j], limit) : g[j];
      const T uc = clamp ? std::min(std::max(u[j], -limit), limit) : u[j];
      ai[j] = gc * sigmoid(alpha * gc) * (uc + offset);
    }
  }
}

// d/dg [g s(alpha g)] = s (1 + alpha g (1 - s)), s = sigmoid(alpha g).
template <typename T>
void glu_backward(const T* da, const T* gate_up, T* dgate_up, int64_t n, int64_t f, const Glu& glu) {
  const T alpha = T(glu.alpha), offset = T(glu.offset), limit = T(glu.limit);
  const bool clamp = glu.limit > 0;
#pragma omp parallel for schedule(static) if(n * f >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* g = gate_up + i * 2 * f;
    const T* u = g + f;
    const T* dai = da + i * f;
    T* dg = dgate_up + i * 2 * f;
    T* du = dg + f;
    for (int64_t j = 0; j < f; ++j) {
      const T gc = clamp ? std::min(g[j], limit) : g[j];
      const T uc = clamp ? std::min(std::max(u[j], -limit), limit) : u[j];
      const T s = sigmoid(alpha * gc);
      const bool g_in = !clamp || g[j] <= limit, u_in = !clamp || (u[j] >= -limit && u[j] <= limit);
      dg[j] = g_in ? dai[j] * (uc + offset) * s * (T(1) + alpha * gc * (T(1) - s)) : T(0);
      du[j] = u_in ? dai[j] * gc * s : T(0);
    }
  }
}

template <typename T>
void swiglu_forward(const T* gate_up, T* a, int64_t n, int64_t f, const Glu& glu) {
  if (!glu.plain()) return glu_forward(gate_up, a, n, f, glu);
#pragma omp parallel for schedule(static) if(n * f >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* g = gate_up + i * 2 * f;
    const T* u = g + f;
    T* ai = a + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) ai[j] = g[j] * sigmoid(g[j]) * u[j];
  }
}

// silu'(g) = s * (1 + g * (1 - s)), s = sigmoid(g).
template <typename T>
void swiglu_backward(const T* da, const T* gate_up, T* dgate_up, int64_t n, int64_t f, const Glu& glu) {
  if (!glu.plain()) return glu_backward(da, gate_up, dgate_up, n, f, glu);
#pragma omp parallel for schedule(static) if(n * f >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* g = gate_up + i * 2 * f;
    const T* u = g + f;
    const T* dai = da + i * f;
    T* dg = dgate_up + i * 2 * f;
    T* du = dg + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const T s = sigmoid(g[j]);
      const T silu = g[j] * s;
      dg[j] = dai[j] * u[j] * s * (T(1) + g[j] * (T(1) - s));
      du[j] = dai[j] * silu;
    }
  }
}

template <typename T>
void rope_tables(T* cos, T* sin, int64_t positions, int64_t head_dim, double base, const RopeScaling& sc) {
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(base, double(2 * i) / double(head_dim));
    if (sc.factor > 0) {  // Llama 3.1: slow down low frequencies, keep high ones, blend between
      const double wavelen = 2 * M_PI / f;
      const double low_wavelen = double(sc.original_max_position) / sc.low_freq_factor;
      const double high_wavelen = double(sc.original_max_position) / sc.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= sc.factor;
      } else if (wavelen >= high_wavelen && sc.high_freq_factor > sc.low_freq_factor) {  // equal: no band
        const double smooth = (double(sc.original_max_position) / wavelen - sc.low_freq_factor) /
                              (sc.high_freq_factor - sc.low_freq_factor);
        f = (1 - smooth) * f / sc.factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * inv_freq[i];
      cos[p * half + i] = T(std::cos(angle));
      sin[p * half + i] = T(std::sin(angle));
    }
}

template <typename T>
void rope_apply(T* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0,
                const T* cos, const T* sin, bool inverse) {
  const int64_t half = head_dim / 2;
  const T sign = inverse ? T(-1) : T(1);
#pragma omp parallel for schedule(static) if(rows * stride >= kElementwiseParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = pos0 + r % seq;
    const T* cp = cos + pos * half;
    const T* sp = sin + pos * half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + r * stride + h * head_dim;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = v[i], b = v[i + half];
        const T s = sign * sp[i];
        v[i] = a * cp[i] - b * s;
        v[i + half] = b * cp[i] + a * s;
      }
    }
  }
}

template <typename T>
void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t n, int64_t vocab, int64_t c) {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] >= vocab)
      fail("token id {} at position {} is outside the vocabulary of {} entries", tokens[i], i, vocab);
#pragma omp parallel for schedule(static) if(n * c >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    T* dst = out + i * c;
    if (tokens[i] < 0) {
      std::fill(dst, dst + c, T(0));
      continue;
    }
    const T* src = table + int64_t(tokens[i]) * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) dst[j] = src[j];
  }
}

// Threads own column blocks, so repeated tokens never race.
template <typename T>
void embedding_backward_weight(const int32_t* tokens, const T* dout, T* dtable, int64_t n, int64_t vocab,
                               int64_t c) {
  const int64_t block = 64;
#pragma omp parallel for schedule(static) if(n * c >= kElementwiseParallelMin)
  for (int64_t j0 = 0; j0 < c; j0 += block) {
    const int64_t j1 = std::min(c, j0 + block);
    for (int64_t i = 0; i < n; ++i) {
      if (tokens[i] < 0) continue;
      T* dst = dtable + int64_t(tokens[i]) * c;
      const T* src = dout + i * c;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
    }
  }
}

// The cross-entropy's row passes. Each inner loop must vectorise (scalar, they cost 4 ns per
// logit): the max reduction is a ternary, and fast_exp's clamp needs the kernels' -fno-trapping-math
// (src/kernels/CMakeLists.txt). A NaN logit is skipped by the max but makes the sum, so the loss, NaN.
template <typename T>
void ce_chunk_forward(const T* logits, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, T cap, T* m, T* s,
                      T* zt) {
#pragma omp parallel for schedule(static) if(n * vc >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* zi = logits + i * vc;
    T mx = m[i], raw_max = -std::numeric_limits<T>::infinity();
    // A ternary, not std::max: GCC 12 does not vectorise a max reduction through std::max's reference.
#pragma omp simd reduction(max : raw_max)
    for (int64_t j = 0; j < vc; ++j) raw_max = zi[j] > raw_max ? zi[j] : raw_max;
    T sum = 0;
    if (cap > T(0)) {  // soft-capped logits (kernels/softcap.h); the cap is monotonic: the max's cap is the max
      const T inv = T(1) / cap, capped_max = cap * fast_tanh(raw_max * inv);
      mx = capped_max > mx ? capped_max : mx;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < vc; ++j) sum += fast_exp(cap * fast_tanh(zi[j] * inv) - mx);
      if (targets[i] >= c0 && targets[i] < c0 + vc) zt[i] = cap * fast_tanh(zi[targets[i] - c0] * inv);
    } else {
      mx = raw_max > mx ? raw_max : mx;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < vc; ++j) sum += fast_exp(zi[j] - mx);
      if (targets[i] >= c0 && targets[i] < c0 + vc) zt[i] = zi[targets[i] - c0];
    }
    s[i] = (s[i] == T(0) ? T(0) : s[i] * std::exp(m[i] - mx)) + sum;
    m[i] = mx;
  }
}

template <typename T>
void ce_chunk_backward(const T* logits, const T* lse, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, T cap,
                       T* dlogits) {
#pragma omp parallel for schedule(static) if(n * vc >= kElementwiseParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    T* di = dlogits + i * vc;
    if (targets[i] < 0) {
      std::fill(di, di + vc, T(0));
      continue;
    }
    const T* zi = logits + i * vc;  // may be di itself: each element is read before it is written
    const T li = lse[i];
    const bool hit = targets[i] >= c0 && targets[i] < c0 + vc;
    if (cap > T(0)) {  // (softmax - onehot) of the capped logit, times the cap's slope 1 - (z / cap)^2
      const int64_t tj = hit ? targets[i] - c0 : -1;
      const T inv = T(1) / cap;
#pragma omp simd
      for (int64_t j = 0; j < vc; ++j) {
        const T u = fast_tanh(zi[j] * inv);
        di[j] = (fast_exp(cap * u - li) - (j == tj ? T(1) : T(0))) * (T(1) - u * u);
      }
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < vc; ++j) di[j] = fast_exp(zi[j] - li);
    if (hit) di[targets[i] - c0] -= T(1);
  }
}

#define INSTANTIATE(T)                                                                                        \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);                     \
  template void rmsnorm_backward_input<T>(const T*, const T*, const T*, const T*, T*, int64_t, int64_t, bool); \
  template void rmsnorm_backward_weight<T>(const T*, const T*, const T*, T*, int64_t, int64_t);               \
  template void swiglu_forward<T>(const T*, T*, int64_t, int64_t, const Glu&);                               \
  template void swiglu_backward<T>(const T*, const T*, T*, int64_t, int64_t, const Glu&);                    \
  template void rope_tables<T>(T*, T*, int64_t, int64_t, double, const RopeScaling&);                        \
  template void rope_apply<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const T*, const T*,   \
                              bool);                                                                         \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t);               \
  template void embedding_backward_weight<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t);       \
  template void ce_chunk_forward<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, T, T*, T*, T*);      \
  template void ce_chunk_backward<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, T, T*);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace primus::cpu
