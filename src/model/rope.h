// A model's rotary-embedding tables: cos and sin [positions, head_dim / 2] from its rotary base
// and, when the spec asks for it, Llama 3.1's frequency scaling or YaRN. One place for the fp32 model,
// the bf16 model and the decoder, so that they rotate alike.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/elementwise.h"
#include "model/model_spec.h"

namespace primus {

// YaRN rotary scaling (Peng et al. 2023; Megatron's YarnRotaryEmbedding, Hugging Face's rope_type
// "yarn"), one rule for multi-latent attention (DeepSeek) and grouped-query attention (gpt-oss):
// the frequency of pair i, base^(-2i/dim), is kept where the pair turns more than beta_fast times
// over original_max_position positions, divided by factor where it turns fewer than beta_slow
// times, and blended linearly between (the correction range [low, high] of pair indices, floored
// and ceiled when round_to_int); cos and sin both carry the concentration mscale(factor, mscale) /
// mscale(factor, mscale_all_dim), mscale(f, m) = 0.1 m ln f + 1 (1 for m = 0 or f <= 1).
struct Yarn {
  double factor = 1.0;  // 1: no scaling
  double beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_max_position = 4096;
  bool round_to_int = true;
  double mscale = 1.0, mscale_all_dim = 0.0;
  double concentration() const;
};
// 0.1 * m * ln(factor) + 1 for factor > 1, else 1.
double yarn_mscale(double factor, double m);
// The spec's YaRN, by Megatron's keys: under multi_latent_attention rotary_scaling_factor,
// beta_fast, beta_slow, original_max_position_embeddings (rounded ranges); on grouped-query
// attention with position_embedding_type yarn rotary_scaling_factor, yarn_beta_fast,
// yarn_beta_slow, yarn_original_max_position_embeddings, yarn_correction_range_round_to_int;
// both with mscale and mscale_all_dim. std::nullopt when the spec has none.
std::optional<Yarn> yarn_of(const ModelSpec& s);
// cos and sin [positions, dim / 2] of YaRN y (factor 1: plain rotary, times the concentration).
void yarn_rope_tables(const Yarn& y, int64_t dim, double base, int64_t positions, double* cos, double* sin);

// Grouped-query attention's tables [positions, rotary_dim() / 2]: YaRN when the spec asks for it
// (position_embedding_type yarn), else plain rotary with Llama 3.1's scaling when use_rope_scaling;
// the frequencies run over the rotary width (rotary_percent of the head).
template <typename T>
void rope_tables_of(const ModelSpec& s, int64_t positions, T* cos, T* sin) {
  const int64_t dim = s.rotary_dim();
  if (!s.multi_latent_attention && s.position_embedding_type == "yarn") {
    const int64_t n = positions * (dim / 2);
    std::vector<double> c(static_cast<size_t>(n)), sn(static_cast<size_t>(n));
    yarn_rope_tables(*yarn_of(s), dim, s.rotary_base, positions, c.data(), sn.data());
    for (int64_t i = 0; i < n; ++i) {
      cos[i] = T(c[size_t(i)]);
      sin[i] = T(sn[size_t(i)]);
    }
    return;
  }
  cpu::RopeScaling sc;
  if (s.use_rope_scaling)
    sc = {s.rope_scaling_factor, s.rope_low_freq_factor, s.rope_high_freq_factor,
          s.rope_original_max_position_embeddings};
  cpu::rope_tables(cos, sin, positions, dim, s.rotary_base, sc);
}

// Rotary embedding on the device: tables [positions, dims / 2] in the stat dtype, applied to the
// first `dims` columns of each of the first `heads` heads of `head_width` columns of every row
// (head_width 0: dims, the whole head); a head's other columns are left as they are (Megatron's
// rotary_percent). Under context parallelism a rank's rows are its two chunks of every sequence
// ([chunk j][batch][position], model/context_parallel.h), each rotated at its global positions.
class Rotary {
 public:
  // cos, sin: host tables [positions, dims / 2] in the stat dtype.
  Rotary(ops::Backend& backend, const Tensor& cos, const Tensor& sin, int64_t dims, int cp_size = 1, int cp_rank = 0,
         int64_t head_width = 0);
  // x [batch * seq rows, stride]: row r of a sequence at position pos0 + r % seq (under cp, pos0 +
  // the chunk's start); inverse for the backward. positions, when given (packed documents whose
  // positions restart: model/documents.h), holds each row's position instead (seq, pos0 unused).
  void apply(Tensor& x, int64_t heads, int64_t seq, int64_t pos0, bool inverse,
             const std::vector<int32_t>* positions = nullptr) const;

 private:
  // apply() on x whose heads are `dims` wide.
  void rotate(Tensor& x, int64_t heads, int64_t seq, int64_t pos0, bool inverse,
              const std::vector<int32_t>* positions) const;

  ops::Backend& be_;
  Tensor cos_, sin_;
  int64_t dims_, head_width_;
  int cp_, cp_rank_;
};

// Llama 4's attention temperature tuning (Hugging Face's attn_temperature_tuning, ModelSpec's
// floor_scale and attn_scale) on its NoPE layers: the queries of the row at position t are scaled
// by log1p(floor((t + 1) / floor_scale)) * attn_scale + 1. A row's position is the rotary one
// (Rotary's rule: pos0 + r % seq, cp's chunks, or packed documents' restarted positions). The
// scaling is diagonal, so the backward applies it again.
class QueryTemperature {
 public:
  QueryTemperature(ops::Backend& backend, double floor_scale, double attn_scale, int cp_size = 1, int cp_rank = 0);
  double scale(int64_t position) const;
  // x [rows, stride]: its first `width` columns (the query heads) scaled row by row.
  void apply(Tensor& x, int64_t width, int64_t seq, int64_t pos0, const std::vector<int32_t>* positions) const;

 private:
  ops::Backend& be_;
  double floor_scale_, attn_scale_;
  int cp_, cp_rank_;
};

// What a grouped-query attention layer does to its query and key rows for their positions: the
// rotary embedding (RoPE layers), or none (Llama 4's NoPE layers, no_rope_freq), then, when given,
// the queries' temperature. AttentionParts picks one per layer.
class QkPositions {
 public:
  QkPositions(const Rotary* rope, const QueryTemperature* temperature) : rope_(rope), temp_(temperature) {}
  // qkv [rows, (heads + 2 groups) head_dim]; inverse for the backward (Rotary::apply's arguments).
  void apply(Tensor& qkv, int64_t heads, int64_t groups, int64_t head_dim, int64_t seq, int64_t pos0, bool inverse,
             const std::vector<int32_t>* positions = nullptr) const;

 private:
  const Rotary* rope_;
  const QueryTemperature* temp_;
};

}  // namespace primus
