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
constexpr int64_t kAttentionParallelMin = 1 << 16;
}

// Query rows are processed kRows at a time: each K tile value and V row loaded from cache feeds
// kRows rows' multiply-adds, with the partial sums in registers (blocks of kCols columns).
constexpr int64_t kRows = 4, kCols = 16;

namespace {

// Queries and keys/values as separate row-major matrices: row b*seq + t of q holds head h at
// column h*D; row b*seq + s of k (and v) holds group g at column g*D. The fused layout is the case
// q = qkv, k = qkv + heads*D, v = k + groups*D, all with the qkv stride.
template <typename T> struct Operands {
  const T* q;
  int64_t q_stride;
  const T* k;
  const T* v;
  int64_t kv_stride;
};

template <typename T> Operands<T> fused(const T* qkv, const AttentionShape& s) {
  const int64_t stride = s.qkv_stride();
  return {qkv, stride, qkv + s.heads * s.head_dim, qkv + (s.heads + s.groups) * s.head_dim, stride};
}

template <typename T> Operands<T> block(const T* qkv, const T* kv, const AttentionShape& s) {
  return {qkv, s.qkv_stride(), kv, kv + s.groups * s.head_dim, 2 * s.groups * s.head_dim};
}

// The first key (a row index of the key block) that query row `row` (b*seq + t) may see: its
// document's start in key rows (negative: before the block; 0 without documents), and, with a
// sliding window (causal self-attention: queries and keys at the same positions), t - window.
inline int64_t first_key(const Documents& docs, const AttentionShape& s, int64_t row) {
  const int64_t doc = docs.start ? int64_t(docs.start[row]) - docs.key_pos0 : 0;
  return std::max(doc, s.window_start(row % s.seq));
}

// Query rows [0, S) of sequence b that see some key before `key_end` (a key row): all of them
// without documents; with documents (start non-decreasing) those before the first row whose
// document starts at or after key_end; with a window, none past key_end - 1 + window.
inline int64_t rows_seeing(const Documents& docs, const AttentionShape& s, int64_t b, int64_t key_end) {
  const int64_t S = s.seq;
  const int64_t window_end = s.window < 0 ? S : std::min(S, key_end + s.window);
  if (!docs.start) return window_end;
  const int32_t* st = docs.start + b * S;
  const int64_t limit = key_end - 1 + docs.key_pos0;  // rows whose document starts at or before it
  return std::min(window_end,
                  int64_t(std::upper_bound(st, st + S, limit, [](int64_t v, int32_t x) { return v < int64_t(x); }) - st));
}

// causal: query t sees keys s <= t; else every key. sinks: attention_forward's (null: none).
template <typename T>
void forward(const Operands<T>& x, T* out, T* lse, const AttentionShape& s, bool causal, const Documents& docs,
             const T* sinks) {
  const int64_t S = s.seq, D = s.head_dim;
  const int64_t q_size = s.heads * D, per_group = s.heads / s.groups;
  const int64_t tiles = (S + kTile - 1) / kTile;
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t tasks = s.batch * s.heads * tiles;
  const bool parallel = s.batch * s.heads * S * S * D / (causal ? 2 : 1) >= kAttentionParallelMin;
  const int64_t Dp = (D + kCols - 1) / kCols * kCols;  // head dim padded to whole column blocks

#pragma omp parallel if(parallel)
  {
    // K tile transposed [Dp][kTile] and V tile [kTile][Dp], zero-padded so blocks need no tails.
    std::vector<T> kt(Dp * kTile, T(0)), vt(kTile * Dp, T(0)), qs(kRows * Dp, T(0)), p(kRows * kTile),
        acc(kTile * Dp), m(kTile), l(kTile);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      // Largest tiles first would balance better; causal work grows with the tile index.
      const int64_t qt = tiles - 1 - task % tiles;
      const int64_t h = (task / tiles) % s.heads, b = task / (tiles * s.heads);
      const int64_t g = h / per_group;
      const int64_t t0 = qt * kTile, t1 = std::min(S, t0 + kTile), rows = t1 - t0;
      const T* qbase = x.q + b * S * x.q_stride;
      const int64_t kv_row0 = b * S;
      // A sink is a key of score sinks[h] and value 0: the softmax starts from it.
      std::fill(m.begin(), m.end(), sinks ? sinks[h] : -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), sinks ? T(1) : T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      // Key tiles before every row's document hold no visible key: start at the tile's lowest.
      int64_t lo = S;
      for (int64_t t = t0; t < t1; ++t) lo = std::min(lo, first_key(docs, s, b * S + t));
      const int64_t s_begin = std::max<int64_t>(lo, 0) / kTile * kTile;

      for (int64_t s0 = s_begin; s0 < (causal ? t1 : S); s0 += kTile) {
        const int64_t s1 = std::min(S, s0 + kTile), cols = s1 - s0;
        for (int64_t c = 0; c < cols; ++c) {
          const T* kr = x.k + (kv_row0 + s0 + c) * x.kv_stride + g * D;
          const T* vr = x.v + (kv_row0 + s0 + c) * x.kv_stride + g * D;
          for (int64_t d = 0; d < D; ++d) kt[d * kTile + c] = kr[d];
          std::copy(vr, vr + D, &vt[c * Dp]);
        }
        for (int64_t c = cols; c < kTile; ++c)
          for (int64_t d = 0; d < D; ++d) kt[d * kTile + c] = T(0);
        for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
          const int64_t nr = std::min(kRows, rows - r0);
          // Columns visible to the block's last row (causal: keys s <= t).
          const int64_t cmax = causal ? std::min(cols, t0 + r0 + nr - 1 - s0 + 1) : cols;
          if (cmax <= 0) continue;
          for (int64_t i = 0; i < kRows; ++i) {
            const T* qr = qbase + (t0 + r0 + std::min(i, nr - 1)) * x.q_stride + h * D;
            for (int64_t d = 0; d < D; ++d) qs[i * Dp + d] = qr[d] * scale;
          }
          // Scores for kRows rows x cmax columns.
          for (int64_t c0 = 0; c0 < cmax; c0 += kCols) {
            T sc[kRows][kCols] = {};
            for (int64_t d = 0; d < D; ++d) {
              const T* kd = &kt[d * kTile + c0];
              for (int64_t i = 0; i < kRows; ++i) {
                const T qd = qs[i * Dp + d];
#pragma omp simd
                for (int64_t j = 0; j < kCols; ++j) sc[i][j] += qd * kd[j];
              }
            }
            for (int64_t i = 0; i < kRows; ++i)
              for (int64_t j = 0; j < kCols && c0 + j < kTile; ++j) p[i * kTile + c0 + j] = sc[i][j];
          }
          // Online softmax per row over its visible columns [c_lo, visible); the others get
          // probability 0 (a row that sees none of the tile keeps its statistics).
          for (int64_t i = 0; i < nr; ++i) {
            const int64_t r = r0 + i, visible = causal ? std::min(cols, t0 + r - s0 + 1) : cols;
            const int64_t c_lo = std::max<int64_t>(first_key(docs, s, b * S + t0 + r) - s0, 0);
            T* pr = &p[i * kTile];
            if (c_lo >= visible) {
              std::fill(pr, pr + cmax, T(0));
              continue;
            }
            std::fill(pr, pr + c_lo, T(0));
            T mx = m[r];
#pragma omp simd reduction(max : mx)
            for (int64_t c = c_lo; c < visible; ++c) mx = pr[c] > mx ? pr[c] : mx;  // vectorises; std::max does not
            const T alpha = fast_exp(m[r] - mx);
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t c = c_lo; c < visible; ++c) {
              pr[c] = fast_exp(pr[c] - mx);
              sum += pr[c];
            }
            for (int64_t c = std::max<int64_t>(visible, 0); c < cmax; ++c) pr[c] = T(0);
            l[r] = l[r] * alpha + sum;
            m[r] = mx;
            T* ar = &acc[r * Dp];
#pragma omp simd
            for (int64_t d = 0; d < Dp; ++d) ar[d] *= alpha;
          }
          for (int64_t i = nr; i < kRows; ++i) std::fill(&p[i * kTile], &p[i * kTile] + cmax, T(0));
          // acc += P V for the block's rows, kCols output columns at a time in registers.
          for (int64_t d0 = 0; d0 < Dp; d0 += kCols) {
            T o[kRows][kCols];
            for (int64_t i = 0; i < kRows; ++i)
              for (int64_t j = 0; j < kCols; ++j) o[i][j] = i < nr ? acc[(r0 + i) * Dp + d0 + j] : T(0);
            for (int64_t c = 0; c < cmax; ++c) {
              const T* vr = &vt[c * Dp + d0];
              for (int64_t i = 0; i < kRows; ++i) {
                const T pc = p[i * kTile + c];
#pragma omp simd
                for (int64_t j = 0; j < kCols; ++j) o[i][j] += pc * vr[j];
              }
            }
            for (int64_t i = 0; i < nr; ++i)
              for (int64_t j = 0; j < kCols; ++j) acc[(r0 + i) * Dp + d0 + j] = o[i][j];
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = t0 + r;
        T* orow = out + (b * S + t) * q_size + h * D;
        const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);  // 0: a row that saw no key (documents)
        for (int64_t d = 0; d < D; ++d) orow[d] = acc[r * Dp + d] * inv;
        lse[(b * s.heads + h) * S + t] = l[r] > T(0) ? m[r] + std::log(l[r]) : -std::numeric_limits<T>::infinity();
      }
    }
  }
}

// Where the backward writes: dq rows like q's, dk and dv rows like k's. accumulate: add to what
// they hold; else overwrite.
template <typename T> struct Gradients {
  T* dq;
  int64_t dq_stride;
  T* dk;
  T* dv;
  int64_t dkv_stride;
  bool accumulate;
};

// One task per (batch, kv group): it owns dK and dV of its group and dQ of its heads, so the
// tasks never write the same memory. Query rows go kRows at a time, as in the forward.
template <typename T>
void backward(const Operands<T>& x, const T* out, const T* lse, const T* dout, const Gradients<T>& y,
              const AttentionShape& s, bool causal, const Documents& docs) {
  const int64_t S = s.seq, D = s.head_dim;
  const int64_t q_size = s.heads * D, per_group = s.heads / s.groups;
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t tasks = s.batch * s.groups;
  const bool parallel = s.batch * s.heads * S * S * D / (causal ? 2 : 1) >= kAttentionParallelMin;
  const int64_t Dp = (D + kCols - 1) / kCols * kCols;

#pragma omp parallel if(parallel)
  {
    // Tiles: K and V transposed [Dp][kTile] for the score rows, K row-major [kTile][Dp] for dQ;
    // dK and dV of the tile accumulate in [kTile][Dp] and are added to dqkv when it is done.
    std::vector<T> kt(Dp * kTile, T(0)), vtt(Dp * kTile, T(0)), kn(kTile * Dp, T(0)), dk(kTile * Dp), dv(kTile * Dp),
        qs(kRows * Dp, T(0)), go(kRows * Dp, T(0)), p(kRows * kTile), ds(kRows * kTile), Di(kRows), L(kRows);
    std::vector<int64_t> c_lo(kRows);  // each row's first visible column of the key tile
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / s.groups, g = task % s.groups;
      const T* qbase = x.q + b * S * x.q_stride;
      T* dqbase = y.dq + b * S * y.dq_stride;
      const int64_t kv_row0 = b * S;
      auto dk_row = [&](int64_t t) { return y.dk + (kv_row0 + t) * y.dkv_stride + g * D; };
      auto dv_row = [&](int64_t t) { return y.dv + (kv_row0 + t) * y.dkv_stride + g * D; };
      if (!y.accumulate)
        for (int64_t t = 0; t < S; ++t) {
          std::fill(dk_row(t), dk_row(t) + D, T(0));
          std::fill(dv_row(t), dv_row(t) + D, T(0));
        }
      for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
        if (!y.accumulate)  // with documents a row may skip key tile 0
          for (int64_t t = 0; t < S; ++t) std::fill(dqbase + t * y.dq_stride + h * D, dqbase + t * y.dq_stride + (h + 1) * D, T(0));
        for (int64_t s0 = 0; s0 < S; s0 += kTile) {
          const int64_t s1 = std::min(S, s0 + kTile), cols = s1 - s0;
          std::fill(kt.begin(), kt.end(), T(0));
          std::fill(vtt.begin(), vtt.end(), T(0));
          for (int64_t c = 0; c < cols; ++c) {
            const T* kr = x.k + (kv_row0 + s0 + c) * x.kv_stride + g * D;
            const T* vr = x.v + (kv_row0 + s0 + c) * x.kv_stride + g * D;
            for (int64_t d = 0; d < D; ++d) {
              kt[d * kTile + c] = kr[d];
              vtt[d * kTile + c] = vr[d];
            }
            std::copy(kr, kr + D, &kn[c * Dp]);
          }
          std::fill(dk.begin(), dk.end(), T(0));
          std::fill(dv.begin(), dv.end(), T(0));
          const int64_t r_end = rows_seeing(docs, s, b, s1);  // documents, window: later rows see none of the tile
          for (int64_t r0 = causal ? s0 : 0; r0 < r_end; r0 += kRows) {  // query rows that see this key tile
            const int64_t nr = std::min(kRows, S - r0);
            const int64_t cmax = causal ? std::min(cols, r0 + nr - 1 - s0 + 1) : cols;
            if (cmax <= 0) continue;
            for (int64_t i = 0; i < kRows; ++i) {
              const int64_t t = r0 + std::min(i, nr - 1);
              const T* qr = qbase + t * x.q_stride + h * D;
              const T* dor = dout + (b * S + t) * q_size + h * D;
              const T* orow = out + (b * S + t) * q_size + h * D;
              T di = 0;
              for (int64_t d = 0; d < D; ++d) {
                qs[i * Dp + d] = qr[d] * scale;
                go[i * Dp + d] = i < nr ? dor[d] : T(0);  // padding rows contribute nothing
                di += dor[d] * orow[d];
              }
              Di[i] = di;
              L[i] = lse[(b * s.heads + h) * S + t];
              c_lo[i] = i < nr ? std::max<int64_t>(first_key(docs, s, b * S + t) - s0, 0) : 0;
            }
            // Scores and dO V^T for the block, then P and dS; masked columns get 0.
            for (int64_t c0 = 0; c0 < cmax; c0 += kCols) {
              T sc[kRows][kCols] = {}, gp[kRows][kCols] = {};
              for (int64_t d = 0; d < D; ++d) {
                const T* kd = &kt[d * kTile + c0];
                const T* vd = &vtt[d * kTile + c0];
                for (int64_t i = 0; i < kRows; ++i) {
                  const T qd = qs[i * Dp + d], gd = go[i * Dp + d];
#pragma omp simd
                  for (int64_t j = 0; j < kCols; ++j) {
                    sc[i][j] += qd * kd[j];
                    gp[i][j] += gd * vd[j];
                  }
                }
              }
              for (int64_t i = 0; i < kRows; ++i) {
                const int64_t visible = i >= nr ? 0 : causal ? std::min(cols, r0 + i - s0 + 1) : cols;
                for (int64_t j = 0; j < kCols && c0 + j < kTile; ++j) {
                  const bool on = c0 + j < visible && c0 + j >= c_lo[i];
                  const T pv = on ? fast_exp(sc[i][j] - L[i]) : T(0);
                  p[i * kTile + c0 + j] = pv;
                  ds[i * kTile + c0 + j] = on ? pv * (gp[i][j] - Di[i]) : T(0);
                }
              }
            }
            // dV_c += sum_i p_ic dO_i;  dK_c += sum_i dS_ic q_i * scale
            for (int64_t c = 0; c < cmax; ++c) {
              T* dvr = &dv[c * Dp];
              T* dkr = &dk[c * Dp];
              for (int64_t i = 0; i < kRows; ++i) {
                const T pc = p[i * kTile + c], dsc = ds[i * kTile + c];
                const T* gi = &go[i * Dp];
                const T* qi = &qs[i * Dp];
#pragma omp simd
                for (int64_t d = 0; d < Dp; ++d) {
                  dvr[d] += pc * gi[d];
                  dkr[d] += dsc * qi[d];
                }
              }
            }
            // dQ_i += sum_c dS_ic k_c * scale, kCols output columns at a time in registers.
            for (int64_t d0 = 0; d0 < Dp; d0 += kCols) {
              T dq[kRows][kCols] = {};
              for (int64_t c = 0; c < cmax; ++c) {
                const T* kc = &kn[c * Dp + d0];
                for (int64_t i = 0; i < kRows; ++i) {
                  const T dsc = ds[i * kTile + c];
#pragma omp simd
                  for (int64_t j = 0; j < kCols; ++j) dq[i][j] += dsc * kc[j];
                }
              }
              for (int64_t i = 0; i < nr; ++i) {
                T* dqr = dqbase + (r0 + i) * y.dq_stride + h * D;
                for (int64_t j = 0; j < kCols && d0 + j < D; ++j) dqr[d0 + j] += dq[i][j] * scale;
              }
            }
          }
          for (int64_t c = 0; c < cols; ++c) {
            T* dkr = dk_row(s0 + c);
            T* dvr = dv_row(s0 + c);
            for (int64_t d = 0; d < D; ++d) {
              dkr[d] += dk[c * Dp + d];
              dvr[d] += dv[c * Dp + d];
            }
          }
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s, const Documents& docs,
                       const T* sinks) {
  forward(fused(qkv, s), out, lse, s, true, docs, sinks);
}

template <typename T>
void attention_sink_backward(const T* out, const T* dout, const T* lse, const T* sinks, T* dsinks,
                             const AttentionShape& s) {
  const int64_t S = s.seq, D = s.head_dim, H = s.heads;
#pragma omp parallel for schedule(static) if (s.batch * S * H * D >= kAttentionParallelMin)
  for (int64_t h = 0; h < H; ++h) {  // one head's sum in one thread, in a fixed order
    double sum = 0;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t t = 0; t < S; ++t) {
        const T* o = out + (b * S + t) * H * D + h * D;
        const T* g = dout + (b * S + t) * H * D + h * D;
        T di = 0;
        for (int64_t d = 0; d < D; ++d) di += o[d] * g[d];
        sum += double(std::exp(sinks[h] - lse[(b * H + h) * S + t]) * di);
      }
    dsinks[h] -= T(sum);
  }
}

template <typename T>
void attention_backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv, const AttentionShape& s,
                        const Documents& docs) {
  const Operands<T> x = fused(qkv, s);
  const Gradients<T> y{dqkv, x.q_stride, dqkv + (x.k - qkv), dqkv + (x.v - qkv), x.kv_stride, false};
  backward(x, out, lse, dout, y, s, true, docs);
}

template <typename T>
void attention_block_forward(const T* qkv, const T* kv, T* out, T* lse, const AttentionShape& s, bool causal,
                             const Documents& docs) {
  forward<T>(block(qkv, kv, s), out, lse, s, causal, docs, nullptr);
}

template <typename T>
void attention_block_backward(const T* qkv, const T* kv, const T* out, const T* lse, const T* dout, T* dq_acc,
                              T* dkv_acc, const AttentionShape& s, bool causal, const Documents& docs) {
  const int64_t GD = s.groups * s.head_dim;
  const Gradients<T> y{dq_acc, s.heads * s.head_dim, dkv_acc, dkv_acc + GD, 2 * GD, true};
  backward(block(qkv, kv, s), out, lse, dout, y, s, causal, docs);
}

template <typename T>
void attention_merge(T* acc, T* lse, const T* block_out, const T* block_lse, const AttentionShape& s) {
  const int64_t S = s.seq, D = s.head_dim, H = s.heads;
  const int64_t items = s.batch * H * S;
#pragma omp parallel for schedule(static) if (items * D >= kAttentionParallelMin)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t t = it % S, h = (it / S) % H, b = it / (S * H);
    const T la = lse[it], lb = block_lse[it], m = std::max(la, lb);
    if (m == -std::numeric_limits<T>::infinity()) continue;  // neither has seen a key yet
    const T wa = std::exp(la - m), wb = std::exp(lb - m), z = wa + wb;
    T* a = acc + (b * S + t) * H * D + h * D;
    const T* o = block_out + (b * S + t) * H * D + h * D;
    for (int64_t d = 0; d < D; ++d) a[d] = (a[d] * wa + o[d] * wb) / z;
    lse[it] = m + std::log(z);
  }
}

// One sequence's cached rows; each query row r attends to rows 0..r. Few rows per call (a prompt,
// then one token at a time), so heads are the parallel dimension.
template <typename T>
void attention_decode(const T* cache, int64_t first, T* out, const AttentionShape& s, const T* sinks) {
  const int64_t L = s.seq, D = s.head_dim, stride = s.qkv_stride();
  const int64_t q_size = s.heads * D, kv_size = s.groups * D, per_group = s.heads / s.groups;
  const T scale = T(1) / std::sqrt(T(D));
  const int64_t rows = L - first;
#pragma omp parallel if(rows * s.heads * L * D >= kAttentionParallelMin)
  {
    std::vector<T> p(L);
#pragma omp for schedule(static) collapse(2)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t row = first + r, g = h / per_group;
        const T* q = cache + row * stride + h * D;
        const int64_t t_lo = s.window_start(row);
        T mx = sinks ? sinks[h] : -std::numeric_limits<T>::infinity();
        for (int64_t t = t_lo; t <= row; ++t) {
          const T* k = cache + t * stride + q_size + g * D;
          T d = 0;
#pragma omp simd reduction(+ : d)
          for (int64_t j = 0; j < D; ++j) d += q[j] * k[j];
          p[t] = d * scale;
          mx = std::max(mx, p[t]);
        }
        T z = sinks ? std::exp(sinks[h] - mx) : T(0);
        for (int64_t t = t_lo; t <= row; ++t) z += (p[t] = std::exp(p[t] - mx));
        T* o = out + r * q_size + h * D;
        std::fill(o, o + D, T(0));
        for (int64_t t = t_lo; t <= row; ++t) {
          const T* v = cache + t * stride + q_size + kv_size + g * D;
          const T w = p[t] / z;
#pragma omp simd
          for (int64_t j = 0; j < D; ++j) o[j] += w * v[j];
        }
      }
  }
}

template void attention_forward<float>(const float*, float*, float*, const AttentionShape&, const Documents&,
                                       const float*);
template void attention_forward<double>(const double*, double*, double*, const AttentionShape&, const Documents&,
                                        const double*);
template void attention_sink_backward<float>(const float*, const float*, const float*, const float*, float*,
                                             const AttentionShape&);
template void attention_sink_backward<double>(const double*, const double*, const double*, const double*, double*,
                                              const AttentionShape&);
template void attention_backward<float>(const float*, const float*, const float*, const float*, float*,
                                        const AttentionShape&, const Documents&);
template void attention_backward<double>(const double*, const double*, const double*, const double*, double*,
                                         const AttentionShape&, const Documents&);

template void attention_block_forward<float>(const float*, const float*, float*, float*, const AttentionShape&, bool,
                                             const Documents&);
template void attention_block_forward<double>(const double*, const double*, double*, double*, const AttentionShape&,
                                              bool, const Documents&);
template void attention_block_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                              float*, float*, const AttentionShape&, bool, const Documents&);
template void attention_block_backward<double>(const double*, const double*, const double*, const double*,
                                               const double*, double*, double*, const AttentionShape&, bool,
                                               const Documents&);

template void attention_merge<float>(float*, float*, const float*, const float*, const AttentionShape&);
template void attention_merge<double>(double*, double*, const double*, const double*, const AttentionShape&);

template void attention_decode<float>(const float*, int64_t, float*, const AttentionShape&, const float*);
template void attention_decode<double>(const double*, int64_t, double*, const AttentionShape&, const double*);

}  // namespace primus::cpu
