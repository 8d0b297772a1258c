#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/fast_math.h"

namespace primus::cpu {

namespace {
constexpr int64_t kTile = 64;  // query and key tile; a K tile of 64 x 128 floats fits in L1/L2
// Below this much work (multiply-adds of the score matrix) one thread does it all.
constexpr int64_t kParallelMin = 1 << 16;
}

template <typename T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s) {
  const int64_t S = s.seq, D = s.head_dim, stride = s.qkv_stride();
  const int64_t q_size = s.heads * D, kv_size = s.groups * D, per_group = s.heads / s.groups;
  const int64_t tiles = (S + kTile - 1) / kTile;
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t tasks = s.batch * s.heads * tiles;
  const bool parallel = s.batch * s.heads * S * S * D / 2 >= kParallelMin;

#pragma omp parallel if(parallel)
  {
    std::vector<T> kt(D * kTile), srow(kTile), acc(kTile * D), m(kTile), l(kTile), qs(D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      // Largest tiles first would balance better; causal work grows with the tile index.
      const int64_t qt = tiles - 1 - task % tiles;
      const int64_t h = (task / tiles) % s.heads, b = task / (tiles * s.heads);
      const int64_t g = h / per_group;
      const int64_t t0 = qt * kTile, t1 = std::min(S, t0 + kTile), rows = t1 - t0;
      const T* base = qkv + b * S * stride;
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));

      for (int64_t s0 = 0; s0 < t1; s0 += kTile) {
        const int64_t s1 = std::min(S, s0 + kTile), cols = s1 - s0;
        for (int64_t c = 0; c < cols; ++c) {  // K tile, transposed so rows of S vectorise
          const T* kr = base + (s0 + c) * stride + q_size + g * D;
          for (int64_t d = 0; d < D; ++d) kt[d * kTile + c] = kr[d];
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r;
          const int64_t visible = std::min(cols, t - s0 + 1);  // causal: keys s <= t
          if (visible <= 0) continue;
          const T* qr = base + t * stride + h * D;
          for (int64_t d = 0; d < D; ++d) qs[d] = qr[d] * scale;
          T* sr = srow.data();
          std::fill(sr, sr + visible, T(0));
          for (int64_t d = 0; d < D; ++d) {
            const T qd = qs[d];
            const T* kd = &kt[d * kTile];
#pragma omp simd
            for (int64_t c = 0; c < visible; ++c) sr[c] += qd * kd[c];
          }
          T mx = m[r];
          for (int64_t c = 0; c < visible; ++c) mx = std::max(mx, sr[c]);
          const T alpha = fast_exp(m[r] - mx);
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < visible; ++c) {
            sr[c] = fast_exp(sr[c] - mx);
            sum += sr[c];
          }
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
          T* ar = &acc[r * D];
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
          for (int64_t c = 0; c < visible; ++c) {
            const T p = sr[c];
            const T* vr = base + (s0 + c) * stride + q_size + kv_size + g * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ar[d] += p * vr[d];
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = t0 + r;
        T* orow = out + (b * S + t) * q_size + h * D;
        const T inv = T(1) / l[r];
        for (int64_t d = 0; d < D; ++d) orow[d] = acc[r * D + d] * inv;
        lse[(b * s.heads + h) * S + t] = m[r] + std::log(l[r]);
      }
    }
  }
}

// One task per (batch, kv group): it owns dK and dV of its group and dQ of its heads, so the
// tasks never write the same memory.
template <typename T>
void attention_backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv, const AttentionShape& s) {
  const int64_t S = s.seq, D = s.head_dim, stride = s.qkv_stride();
  const int64_t q_size = s.heads * D, kv_size = s.groups * D, per_group = s.heads / s.groups;
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t tasks = s.batch * s.groups;
  const bool parallel = s.batch * s.heads * S * S * D / 2 >= kParallelMin;

#pragma omp parallel if(parallel)
  {
    std::vector<T> kt(D * kTile), vt(D * kTile), p(kTile), dp(kTile), dq(D), qs(D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / s.groups, g = task % s.groups;
      const T* base = qkv + b * S * stride;
      T* dbase = dqkv + b * S * stride;
      for (int64_t t = 0; t < S; ++t) {
        std::fill(dbase + t * stride + q_size + g * D, dbase + t * stride + q_size + g * D + D, T(0));
        std::fill(dbase + t * stride + q_size + kv_size + g * D,
                  dbase + t * stride + q_size + kv_size + g * D + D, T(0));
      }
      for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
        for (int64_t s0 = 0; s0 < S; s0 += kTile) {
          const int64_t s1 = std::min(S, s0 + kTile), cols = s1 - s0;
          for (int64_t c = 0; c < cols; ++c) {
            const T* kr = base + (s0 + c) * stride + q_size + g * D;
            const T* vr = kr + kv_size;
            for (int64_t d = 0; d < D; ++d) {
              kt[d * kTile + c] = kr[d];
              vt[d * kTile + c] = vr[d];
            }
          }
          for (int64_t t = s0; t < S; ++t) {  // query rows that see this key tile
            const int64_t visible = std::min(cols, t - s0 + 1);
            const T* qr = base + t * stride + h * D;
            const T* dor = dout + (b * S + t) * q_size + h * D;
            const T* orow = out + (b * S + t) * q_size + h * D;
            const T L = lse[(b * s.heads + h) * S + t];
            T Di = 0;
#pragma omp simd reduction(+ : Di)
            for (int64_t d = 0; d < D; ++d) Di += dor[d] * orow[d];
            for (int64_t d = 0; d < D; ++d) qs[d] = qr[d] * scale;
            std::fill(p.begin(), p.begin() + visible, T(0));
            std::fill(dp.begin(), dp.begin() + visible, T(0));
            for (int64_t d = 0; d < D; ++d) {
              const T qd = qs[d], gd = dor[d];
              const T* kd = &kt[d * kTile];
              const T* vd = &vt[d * kTile];
#pragma omp simd
              for (int64_t c = 0; c < visible; ++c) {
                p[c] += qd * kd[c];
                dp[c] += gd * vd[c];
              }
            }
#pragma omp simd
            for (int64_t c = 0; c < visible; ++c) {
              p[c] = fast_exp(p[c] - L);
              dp[c] = p[c] * (dp[c] - Di);  // dS, the gradient of the scaled score
            }
            // dV_c += p_c dO;  dK_c += dS_c q * scale;  dQ += dS_c k_c * scale
            std::fill(dq.begin(), dq.end(), T(0));
            for (int64_t c = 0; c < visible; ++c) {
              T* dkr = dbase + (s0 + c) * stride + q_size + g * D;
              T* dvr = dkr + kv_size;
              const T* kr = base + (s0 + c) * stride + q_size + g * D;
              const T pc = p[c], dsc = dp[c];
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) {
                dvr[d] += pc * dor[d];
                dkr[d] += dsc * qs[d];
                dq[d] += dsc * kr[d];
              }
            }
            T* dqr = dbase + t * stride + h * D;
            if (s0 == 0) {
              for (int64_t d = 0; d < D; ++d) dqr[d] = dq[d] * scale;
            } else {
              for (int64_t d = 0; d < D; ++d) dqr[d] += dq[d] * scale;
            }
          }
        }
      }
    }
  }
}

template void attention_forward<float>(const float*, float*, float*, const AttentionShape&);
template void attention_forward<double>(const double*, double*, double*, const AttentionShape&);
template void attention_backward<float>(const float*, const float*, const float*, const float*, float*,
                                        const AttentionShape&);
template void attention_backward<double>(const double*, const double*, const double*, const double*, double*,
                                         const AttentionShape&);

}  // namespace primus::cpu
