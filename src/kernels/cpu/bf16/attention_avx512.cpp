// Causal attention in bf16 on AVX512-BF16 (kernels.h), FlashAttention's scheme as in
// kernels/cpu/attention.cpp: the products are vdpbf16ps dot products over k-pairs (fp32 sums), the
// softmax statistics are fp32, and the probabilities (and in the backward dS) are rounded to bf16
// before they multiply V (dO, Q, K), as GPU flash attention does.
//
// Operands are packed once per call (avx512_common.h panels of 16 columns): per (batch, kv group)
// K and V as "c-major" panels over keys (S = Q K^T and dP = dO V^T reduce over the head dimension)
// and K and V as "k-major" panels over the head dimension (O = P V and dQ = dS K reduce over
// keys). Sequences are padded with zero keys and rows to whole tiles; padding is masked.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/bf16/kernels.h"
#include "kernels/cpu/bf16/scratch.h"
#include "kernels/cpu/bf16/target.h"

PRIMUS_AVX512_BF16_BEGIN
#include "kernels/cpu/bf16/avx512_common.h"

namespace primus::cpu::bf16k {
namespace {

constexpr int64_t kKeys = 64;  // key tile
constexpr int64_t kRows = 32;  // query tile
// Below this many multiply-adds of the score matrix one thread does it all.
constexpr double kParallelMin = 1 << 18;

struct Dims {
  int64_t B, S, H, G, D, stride, q_size, kv_size, per_group;
  int64_t Dp;  // head dim padded to 16 (zeros)
  int64_t Sp;  // sequence padded to kKeys (zero keys, masked rows)
  float scale;
  explicit Dims(const AttentionShape& s)
      : B(s.batch), S(s.seq), H(s.heads), G(s.groups), D(s.head_dim), stride(s.qkv_stride()),
        q_size(s.heads * s.head_dim), kv_size(s.groups * s.head_dim), per_group(s.heads / s.groups),
        Dp(round_up(s.head_dim, 16)), Sp(round_up(s.seq, kKeys)), scale(1.0f / std::sqrt(float(s.head_dim))) {}
  // Panels of one (batch, group): c-major over keys [Sp/16][Dp/2][16][2], k-major over the head dim
  // [Dp/16][Sp/2][16][2]; both Sp * Dp elements.
  int64_t panel_size() const { return Sp * Dp; }
};

// Both packings of the K (or V, at offset) rows of one (batch, group).
void pack_kv(const uint16_t* qkv, const Dims& d, int64_t b, int64_t g, int64_t offset, uint16_t* c_major,
             uint16_t* k_major) {
  const uint16_t* rows = qkv + b * d.S * d.stride + offset + g * d.D;
  if (c_major) {
    const PackSource src{rows, d.stride, d.D, d.S, false, d.Sp};
    pack<16>(src, d.Dp / 2, 0, d.Dp / 2, c_major);
  }
  if (k_major) {
    const PackSource src{rows, d.stride, d.S, d.D, true, d.Dp};
    pack<16>(src, d.Sp / 2, 0, d.Sp / 2, k_major);
  }
}

// Rows of q, k, v, O and dO lie a row of the fused tensor apart (kilobytes) and usually come from
// memory (the forward wrote them long before the backward reads them): the row loops ask for the
// row kAhead rows on while they work on this one (prefetch_span), so that the loads do not wait
// one by one.
constexpr int64_t kAhead = 8;

// rows [t0, t0 + n) of a [*, ld] bf16 matrix (columns c0 .. c0 + D) into dst [n_pad][Dp], zeros
// around.
void copy_rows(const uint16_t* src, int64_t ld, int64_t t0, int64_t n, int64_t n_pad, int64_t D, int64_t Dp,
               uint16_t* dst) {
  std::memset(dst, 0, size_t(n_pad * Dp) * 2);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_span(src + (t0 + i + kAhead) * ld, D * 2);
    std::memcpy(dst + i * Dp, src + (t0 + i) * ld, size_t(D) * 2);
  }
}

// The first key row that query row `row` (b*S + t) may see (its document's start, 0 without
// documents, and t - window with a window), and the rows of sequence b that see some key before
// key_end (documents: their starts do not decrease; a window: none past key_end - 1 + window).
int64_t first_key(const Documents& docs, const AttentionShape& s, int64_t row) {
  const int64_t doc = docs.start ? int64_t(docs.start[row]) - docs.key_pos0 : 0;
  const int64_t win = s.window_start(row % s.seq);
  return doc > win ? doc : win;
}
int64_t rows_seeing(const Documents& docs, const AttentionShape& s, int64_t b, int64_t key_end) {
  const int64_t S = s.window < 0 ? s.seq : min64(s.seq, key_end + s.window);
  if (!docs.start) return S;
  const int32_t* st = docs.start + b * S;
  int64_t lo = 0, hi = S;  // the first row whose document starts after key_end - 1
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (int64_t(st[mid]) - docs.key_pos0 <= key_end - 1) lo = mid + 1; else hi = mid;
  }
  return lo;
}
// Lanes j .. j+15 of a row whose visible columns are [c_lo, visible).
__mmask16 visible_lanes(int64_t j, int64_t c_lo, int64_t visible) {
  const __mmask16 below = j < visible ? tail_mask(visible - j) : __mmask16(0);
  const __mmask16 before = j < c_lo ? tail_mask(c_lo - j) : __mmask16(0);
  return __mmask16(below & ~before);
}

// One key tile of the forward's online softmax (FlashAttention's rescaling) over a query tile's
// kRows rows: from the scores sc [kRows][kKeys] (unscaled) and each row's visible columns [lo_key,
// vis) (vis 0: none), the bf16 probabilities p [kRows][kKeys] (zero elsewhere), and each row's
// running maximum m, sum l and output o [kRows][Dp] rescaled. In phases over the rows, each
// phase's rows independent of one another (one row's horizontal maxima and sums overlap the next
// row's), and the rescaling factors of all rows from one vector exp.
void online_softmax(const float* sc, const int64_t* vis, const int64_t* lo_key, float scale, int64_t Dp, uint16_t* p,
                    float* m, float* l, float* o) {
  alignas(64) float m_new[kRows], alpha[kRows], sums[kRows];
  for (int64_t i = 0; i < kRows; ++i) {
    m_new[i] = m[i];
    if (!vis[i]) continue;
    __m512 mx = _mm512_set1_ps(m[i]);
    for (int64_t j = 0; j < vis[i]; j += 16) {
      const __mmask16 mk = visible_lanes(j, lo_key[i], vis[i]);
      mx = _mm512_mask_max_ps(mx, mk, mx, _mm512_mul_ps(_mm512_loadu_ps(sc + i * kKeys + j), _mm512_set1_ps(scale)));
    }
    m_new[i] = _mm512_reduce_max_ps(mx);
  }
  for (int64_t i = 0; i < kRows; i += 16) {  // exp(m - m_new); 1 where the max stayed (also -inf)
    const __m512 mo = _mm512_load_ps(m + i), mn = _mm512_load_ps(m_new + i), diff = _mm512_sub_ps(mo, mn);
    const __mmask16 same = _mm512_cmp_ps_mask(mo, mn, _CMP_EQ_OQ);
    // a NaN maximum stays NaN (as std::exp keeps it; exp512 would clamp it away)
    const __mmask16 nan = __mmask16(_mm512_cmp_ps_mask(diff, diff, _CMP_UNORD_Q) & ~same);
    const __m512 a = _mm512_mask_blend_ps(same, exp512(diff), _mm512_set1_ps(1.0f));
    _mm512_store_ps(alpha + i, _mm512_mask_blend_ps(nan, a, diff));
  }
  for (int64_t i = 0; i < kRows; ++i) {
    uint16_t* pi = p + i * kKeys;
    int64_t j = 0;
    __m512 sum = _mm512_setzero_ps();
    for (; j < vis[i]; j += 16) {
      const __mmask16 mk = visible_lanes(j, lo_key[i], vis[i]);
      const __m512 e = _mm512_maskz_mov_ps(mk,
                                           exp512(_mm512_fmsub_ps(_mm512_loadu_ps(sc + i * kKeys + j),
                                                                  _mm512_set1_ps(scale), _mm512_set1_ps(m_new[i]))));
      sum = _mm512_add_ps(sum, e);  // the fp32 probabilities, as the reference sums them
      store_bf16(pi + j, e);
    }
    if (j < kKeys) std::memset(pi + j, 0, size_t(kKeys - j) * 2);
    sums[i] = vis[i] ? _mm512_reduce_add_ps(sum) : 0.0f;
  }
  for (int64_t i = 0; i < kRows; ++i) {
    if (!vis[i]) continue;
    l[i] = l[i] * alpha[i] + sums[i];
    m[i] = m_new[i];
    if (alpha[i] != 1.0f)
      for (int64_t c = 0; c < Dp; c += 16)
        _mm512_storeu_ps(o + i * Dp + c, _mm512_mul_ps(_mm512_loadu_ps(o + i * Dp + c), _mm512_set1_ps(alpha[i])));
  }
}

// Pieces of one scratch slot (scratch.h), 64-byte aligned.
struct Scratch {
  char* base = nullptr;
  size_t used = 0;
  Scratch(ScratchSlot slot, size_t bytes) : base(static_cast<char*>(thread_scratch(slot, bytes))) {}
  template <typename T>
  T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (size_t(n) * sizeof(T) + 63) / 64 * 64;
    return p;
  }
};
// Bytes that take() hands out for n elements of T.
template <typename T>
size_t bytes_for(int64_t n) {
  return (size_t(n) * sizeof(T) + 63) / 64 * 64;
}

}  // namespace

void attention_forward(const uint16_t* qkv, uint16_t* out, float* lse, const AttentionShape& shape,
                       const Documents& docs, const float* sinks) {
  const Dims d(shape);
  const int64_t ps = d.panel_size();
  Scratch packs(kAttentionPacks, 2 * bytes_for<uint16_t>(d.B * d.G * ps));
  uint16_t* const kc = packs.take<uint16_t>(d.B * d.G * ps);
  uint16_t* const vk = packs.take<uint16_t>(d.B * d.G * ps);
  const int64_t qtiles = ceil_div(d.S, kRows), tasks = d.B * d.H * qtiles;
  const bool parallel = double(d.B * d.H) * double(d.S) * double(d.S) * double(d.D) / 2 >= kParallelMin;
#pragma omp parallel if(parallel)
  {
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < d.B * d.G; ++bg) {
      pack_kv(qkv, d, bg / d.G, bg % d.G, d.q_size, kc + bg * ps, nullptr);
      pack_kv(qkv, d, bg / d.G, bg % d.G, d.q_size + d.kv_size, nullptr, vk + bg * ps);
    }
    Scratch mem(kAttentionWork, bytes_for<uint16_t>(kRows * d.Dp) + bytes_for<uint16_t>(kRows * kKeys) + bytes_for<float>(kRows * kKeys) +
              bytes_for<float>(kRows * d.Dp) + 2 * bytes_for<float>(kRows));
    uint16_t *q = mem.take<uint16_t>(kRows * d.Dp), *p = mem.take<uint16_t>(kRows * kKeys);
    float *sc = mem.take<float>(kRows * kKeys), *o = mem.take<float>(kRows * d.Dp), *m = mem.take<float>(kRows),
          *l = mem.take<float>(kRows);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qt = qtiles - 1 - task % qtiles;  // the longest (causal) tiles first
      const int64_t h = (task / qtiles) % d.H, b = task / (qtiles * d.H), g = h / d.per_group;
      const int64_t t0 = qt * kRows, rows = min64(kRows, d.S - t0);
      const uint16_t* base = qkv + b * d.S * d.stride;
      copy_rows(base + h * d.D, d.stride, t0, rows, kRows, d.D, d.Dp, q);
      const uint16_t* K = kc + (b * d.G + g) * ps;
      const uint16_t* V = vk + (b * d.G + g) * ps;
      // A sink is a key of score sinks[h] and value 0: the softmax starts from it.
      for (int64_t i = 0; i < kRows; ++i) m[i] = sinks ? sinks[h] : -INFINITY, l[i] = sinks ? 1.0f : 0.0f;
      std::memset(o, 0, size_t(kRows * d.Dp) * 4);
      const int64_t t_last = t0 + rows - 1;
      int64_t lo = d.S;  // documents: key tiles before every row's document are skipped
      for (int64_t i = 0; i < rows; ++i) lo = min64(lo, first_key(docs, shape, b * d.S + t0 + i));
      for (int64_t s0 = (lo > 0 ? lo : 0) / kKeys * kKeys; s0 <= t_last; s0 += kKeys) {
        // Scores: 16-key panels s0/16 .. s0/16 + 3, each [Dp/2][16][2].
        dot_block({q, d.Dp, 2}, kRows, {K + (s0 / 16) * (d.Dp / 2) * 32, 32, (d.Dp / 2) * 32}, kKeys, d.Dp / 2, sc,
                  kKeys, false);
        const int64_t cmax = min64(kKeys, t_last - s0 + 1);  // columns any row of the tile sees
        // Each row's visible columns [lo_key, vis) (vis 0: none): causal, keys s <= t; documents and a
        // window mask the keys before the row's first one.
        int64_t vis[kRows], lo_key[kRows];
        for (int64_t i = 0; i < kRows; ++i) {
          const int64_t visible = i < rows ? min64(cmax, t0 + i - s0 + 1) : 0;
          const int64_t c_lo = i < rows ? first_key(docs, shape, b * d.S + t0 + i) - s0 : 0;
          vis[i] = visible <= 0 || c_lo >= visible ? 0 : visible, lo_key[i] = c_lo;
        }
        online_softmax(sc, vis, lo_key, d.scale, d.Dp, p, m, l, o);
        // O += P V over the visible key pairs: V panels of 16 head-dim columns, [Sp/2][16][2] each.
        dot_block({p, kKeys, 2}, kRows, {V + (s0 / 2) * 32, 32, (d.Sp / 2) * 32}, d.Dp, ceil_div(cmax, 2), o, d.Dp,
                  true);
      }
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = t0 + i;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;  // 0: a row that saw no key (documents)
        const float* oi = o + i * d.Dp;
        uint16_t* dst = out + (b * d.S + t) * d.q_size + h * d.D;
        for (int64_t c = 0; c < d.D; c += 16)
          store_bf16(dst + c, _mm512_mul_ps(_mm512_loadu_ps(oi + c), _mm512_set1_ps(inv)), tail_mask(d.D - c));
        lse[(b * d.H + h) * d.S + t] = l[i] > 0.0f ? m[i] + std::log(l[i]) : -INFINITY;
      }
    }
  }
}

// One task per (batch, kv group): it owns dK and dV of its group and dQ of its heads. Key tiles
// outside, query tiles inside, for every head of the group.
void attention_backward(const uint16_t* qkv, const uint16_t* out, const float* lse, const uint16_t* dout,
                        uint16_t* dqkv, const AttentionShape& shape, const Documents& docs) {
  const Dims d(shape);
  const int64_t ps = d.panel_size();
  const bool parallel = double(d.B * d.H) * double(d.S) * double(d.S) * double(d.D) / 2 >= kParallelMin;
#pragma omp parallel if(parallel)
  {
    // Per task: K and V c-major (scores, dP), K k-major (dQ); per head: Q and dO as rows and
    // k-major over rows (dK, dV); fp32 sums of dK, dV (group) and dQ (head).
    const int64_t rows_dp = d.Sp * d.Dp;
    Scratch mem(kAttentionWork, 7 * bytes_for<uint16_t>(ps) + 4 * bytes_for<uint16_t>(kKeys * kRows) + 3 * bytes_for<float>(rows_dp) +
              2 * bytes_for<float>(kRows * kKeys) + 2 * bytes_for<float>(d.Sp));
    uint16_t *kc = mem.take<uint16_t>(ps), *vc = mem.take<uint16_t>(ps), *kk = mem.take<uint16_t>(ps),
             *q = mem.take<uint16_t>(rows_dp), *go = mem.take<uint16_t>(rows_dp), *qk = mem.take<uint16_t>(ps),
             *gk = mem.take<uint16_t>(ps), *pt = mem.take<uint16_t>(kKeys * kRows), *dst = mem.take<uint16_t>(kKeys * kRows),
             *pm = mem.take<uint16_t>(kRows * kKeys), *ds = mem.take<uint16_t>(kRows * kKeys);
    float *dk = mem.take<float>(rows_dp), *dv = mem.take<float>(rows_dp), *dq = mem.take<float>(rows_dp),
          *sc = mem.take<float>(kRows * kKeys), *dp = mem.take<float>(kRows * kKeys), *Di = mem.take<float>(d.Sp),
          *L = mem.take<float>(d.Sp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < d.B * d.G; ++task) {
      const int64_t b = task / d.G, g = task % d.G;
      pack_kv(qkv, d, b, g, d.q_size, kc, kk);
      pack_kv(qkv, d, b, g, d.q_size + d.kv_size, vc, nullptr);
      std::memset(dk, 0, size_t(rows_dp) * 4);
      std::memset(dv, 0, size_t(rows_dp) * 4);
      const uint16_t* base = qkv + b * d.S * d.stride;
      for (int64_t h = g * d.per_group; h < (g + 1) * d.per_group; ++h) {
        copy_rows(base + h * d.D, d.stride, 0, d.S, d.Sp, d.D, d.Dp, q);
        copy_rows(dout + b * d.S * d.q_size + h * d.D, d.q_size, 0, d.S, d.Sp, d.D, d.Dp, go);
        {  // k-major over rows: [Dp/16][Sp/2][16][2]
          const PackSource qs{q, d.Dp, d.Sp, d.Dp, true}, gs{go, d.Dp, d.Sp, d.Dp, true};
          pack<16>(qs, d.Sp / 2, 0, d.Sp / 2, qk);
          pack<16>(gs, d.Sp / 2, 0, d.Sp / 2, gk);
        }
        for (int64_t t = 0; t < d.S; ++t) {  // Di = rowsum(dO * O), as the rows are stored (bf16)
          const uint16_t* o_row = out + (b * d.S + t) * d.q_size + h * d.D;
          const uint16_t* g_row = go + t * d.Dp;
          if (t + kAhead < d.S) prefetch_span(o_row + kAhead * d.q_size, d.D * 2);
          __m512 acc = _mm512_setzero_ps();
          for (int64_t c = 0; c < d.D; c += 16) {
            const __mmask16 mk = tail_mask(d.D - c);
            acc = _mm512_fmadd_ps(load_bf16(o_row + c, mk), load_bf16(g_row + c, mk), acc);
          }
          Di[t] = _mm512_reduce_add_ps(acc);
          L[t] = lse[(b * d.H + h) * d.S + t];
        }
        std::memset(dq, 0, size_t(rows_dp) * 4);
        for (int64_t s0 = 0; s0 < d.S; s0 += kKeys) {
          const uint16_t* Kt = kc + (s0 / 16) * (d.Dp / 2) * 32;
          const uint16_t* Vt = vc + (s0 / 16) * (d.Dp / 2) * 32;
          const int64_t r_end = rows_seeing(docs, shape, b, s0 + kKeys);  // documents, window: later rows see none
          for (int64_t r0 = s0 / kRows * kRows; r0 < r_end; r0 += kRows) {
            // S = Q K^T and dP = dO V^T for the tile's rows and keys.
            const Cols kt{Kt, 32, (d.Dp / 2) * 32}, vt{Vt, 32, (d.Dp / 2) * 32};
            dot_block({q + r0 * d.Dp, d.Dp, 2}, kRows, kt, kKeys, d.Dp / 2, sc, kKeys, false);
            dot_block({go + r0 * d.Dp, d.Dp, 2}, kRows, vt, kKeys, d.Dp / 2, dp, kKeys, false);
            // P = exp(S scale - L), dS = P (dP - Di), in bf16; masked (s > t, padding) 0.
            for (int64_t i = 0; i < kRows; ++i) {
              const int64_t t = r0 + i;
              const int64_t visible = t < d.S ? min64(kKeys, t - s0 + 1) : 0;
              const int64_t c_lo = t < d.S ? first_key(docs, shape, b * d.S + t) - s0 : 0;
              const float* si = sc + i * kKeys;
              const float* dpi = dp + i * kKeys;
              for (int64_t j = 0; j < kKeys; j += 16) {
                const __mmask16 mk = visible_lanes(j, c_lo, visible);
                __m512 pv = _mm512_setzero_ps(), dsv = _mm512_setzero_ps();
                if (mk) {
                  pv = _mm512_maskz_mov_ps(
                      mk, exp512(_mm512_fmsub_ps(_mm512_loadu_ps(si + j), _mm512_set1_ps(d.scale), _mm512_set1_ps(L[t]))));
                  dsv = _mm512_mul_ps(pv, _mm512_sub_ps(_mm512_loadu_ps(dpi + j), _mm512_set1_ps(Di[t])));
                }
                store_bf16(pm + i * kKeys + j, pv);
                store_bf16(ds + i * kKeys + j, dsv);
              }
            }
            // P and dS as panels over keys with pairs of rows ([kKeys/16][kRows/2][16][2]): the A
            // operand of dV[keys] += P^T dO[rows] and dK[keys] += dS^T Q[rows].
            const PackSource ps_src{pm, kKeys, kRows, kKeys, true}, ds_src{ds, kKeys, kRows, kKeys, true};
            pack<16>(ps_src, kRows / 2, 0, kRows / 2, pt);
            pack<16>(ds_src, kRows / 2, 0, kRows / 2, dst);
            const Cols gr{gk + (r0 / 2) * 32, 32, (d.Sp / 2) * 32}, qr{qk + (r0 / 2) * 32, 32, (d.Sp / 2) * 32};
            dot_block({pt, 2, 32, (kRows / 2) * 32}, kKeys, gr, d.Dp, kRows / 2, dv + s0 * d.Dp, d.Dp, true);
            dot_block({dst, 2, 32, (kRows / 2) * 32}, kKeys, qr, d.Dp, kRows / 2, dk + s0 * d.Dp, d.Dp, true);
            // dQ[rows] += dS K[keys] (scaled at the end).
            dot_block({ds, kKeys, 2}, kRows, {kk + (s0 / 2) * 32, 32, (d.Sp / 2) * 32}, d.Dp, kKeys / 2,
                      dq + r0 * d.Dp, d.Dp, true);
          }
        }
        for (int64_t t = 0; t < d.S; ++t) {
          uint16_t* dst_row = dqkv + (b * d.S + t) * d.stride + h * d.D;
          const float* src = dq + t * d.Dp;
          for (int64_t c = 0; c < d.D; c += 16)
            store_bf16(dst_row + c, _mm512_mul_ps(_mm512_loadu_ps(src + c), _mm512_set1_ps(d.scale)), tail_mask(d.D - c));
        }
      }
      for (int64_t t = 0; t < d.S; ++t) {
        uint16_t* k_row = dqkv + (b * d.S + t) * d.stride + d.q_size + g * d.D;
        uint16_t* v_row = k_row + d.kv_size;
        for (int64_t c = 0; c < d.D; c += 16) {
          const __mmask16 mk = tail_mask(d.D - c);
          store_bf16(k_row + c, _mm512_mul_ps(_mm512_loadu_ps(dk + t * d.Dp + c), _mm512_set1_ps(d.scale)), mk);
          store_bf16(v_row + c, _mm512_loadu_ps(dv + t * d.Dp + c), mk);
        }
      }
    }
  }
}

// Few query rows (a prompt, then one token at a time): heads are the parallel dimension. Scores
// by vdpbf16ps over the head dim, softmax in fp32, the weighted sum of V rows in fp32.
void attention_decode(const uint16_t* cache, int64_t first, uint16_t* out, const AttentionShape& shape,
                      const float* sinks) {
  const Dims d(shape);
  const int64_t L = d.S, rows = L - first;
#pragma omp parallel if(double(rows) * double(d.H) * double(L) * double(d.D) >= kParallelMin)
  {
    Scratch mem(kAttentionWork, bytes_for<float>(L) + bytes_for<float>(d.Dp) + 2 * bytes_for<uint16_t>(d.Dp + 32));
    float *p = mem.take<float>(L), *o = mem.take<float>(d.Dp);
    uint16_t *qpad = mem.take<uint16_t>(d.Dp + 32), *kpad = mem.take<uint16_t>(d.Dp + 32);
    std::memset(qpad, 0, size_t(d.Dp + 32) * 2);
    std::memset(kpad, 0, size_t(d.Dp + 32) * 2);
#pragma omp for schedule(static) collapse(2)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t row = first + r, g = h / d.per_group;
        std::memcpy(qpad, cache + row * d.stride + h * d.D, size_t(d.D) * 2);
        const int64_t t_lo = shape.window_start(row);
        float mx = sinks ? sinks[h] : -INFINITY;
        for (int64_t t = t_lo; t <= row; ++t) {
          const uint16_t* k = cache + t * d.stride + d.q_size + g * d.D;
          __m512 acc = _mm512_setzero_ps();
          int64_t c = 0;
          for (; c + 32 <= d.D; c += 32)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(qpad + c), (__m512bh)_mm512_loadu_si512(k + c));
          if (c < d.D) {  // the last < 32 values, zero-padded
            std::memcpy(kpad, k + c, size_t(d.D - c) * 2);
            std::memset(kpad + (d.D - c), 0, 64);
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(qpad + c), (__m512bh)_mm512_loadu_si512(kpad));
          }
          p[t] = _mm512_reduce_add_ps(acc) * d.scale;
          mx = p[t] > mx ? p[t] : mx;
        }
        float z = sinks ? std::exp(sinks[h] - mx) : 0.0f;
        for (int64_t t = t_lo; t <= row; ++t) z += (p[t] = std::exp(p[t] - mx));
        std::memset(o, 0, size_t(d.Dp) * 4);
        for (int64_t t = t_lo; t <= row; ++t) {
          const uint16_t* v = cache + t * d.stride + d.q_size + d.kv_size + g * d.D;
          const __m512 w = _mm512_set1_ps(p[t] / z);
          for (int64_t c = 0; c < d.D; c += 16) {
            const __mmask16 mk = tail_mask(d.D - c);
            _mm512_storeu_ps(o + c, _mm512_fmadd_ps(w, load_bf16(v + c, mk), _mm512_loadu_ps(o + c)));
          }
        }
        uint16_t* dst = out + r * d.q_size + h * d.D;
        for (int64_t c = 0; c < d.D; c += 16) store_bf16(dst + c, _mm512_loadu_ps(o + c), tail_mask(d.D - c));
      }
  }
}

}  // namespace primus::cpu::bf16k

PRIMUS_AVX512_BF16_END
