#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "core/context_parallel_rows.h"
#include "core/error.h"

namespace primus {

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

double Yarn::concentration() const { return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim); }

std::optional<Yarn> yarn_of(const ModelSpec& s) {
  Yarn y;
  y.factor = s.rotary_scaling_factor;
  y.mscale = s.mscale;
  y.mscale_all_dim = s.mscale_all_dim;
  if (s.multi_latent_attention) {
    if (s.rotary_scaling_factor <= 1) return std::nullopt;
    y.beta_fast = s.beta_fast;
    y.beta_slow = s.beta_slow;
    y.original_max_position = s.original_max_position_embeddings;
    return y;
  }
  if (s.position_embedding_type != "yarn") return std::nullopt;
  y.beta_fast = s.yarn_beta_fast;
  y.beta_slow = s.yarn_beta_slow;
  y.original_max_position = s.yarn_original_max_position_embeddings;
  y.round_to_int = s.yarn_correction_range_round_to_int;
  return y;
}

void yarn_rope_tables(const Yarn& y, int64_t dim, double base, int64_t positions, double* cos, double* sin) {
  const int64_t half = dim / 2;
  const double f = y.factor;
  std::vector<double> inv(size_t(half), 0.0);
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = 1.0 / std::pow(base, double(2 * i) / double(dim));
  double m = 1.0;
  if (f > 1) {
    // The pair index whose frequency turns `rotations` times over the original context.
    auto correction_dim = [&](double rotations) {
      return double(dim) * std::log(double(y.original_max_position) / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(base));
    };
    double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
    if (y.round_to_int) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0), keep = 1.0 - ramp;
      inv[size_t(i)] = inv[size_t(i)] / f * (1.0 - keep) + inv[size_t(i)] * keep;
    }
    m = y.concentration();
  }
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      cos[p * half + i] = std::cos(double(p) * inv[size_t(i)]) * m;
      sin[p * half + i] = std::sin(double(p) * inv[size_t(i)]) * m;
    }
}

Rotary::Rotary(ops::Backend& backend, const Tensor& cos, const Tensor& sin, int64_t dims, int cp_size, int cp_rank,
               int64_t head_width)
    : be_(backend), cos_(cos.to(backend.device())), sin_(sin.to(backend.device())), dims_(dims),
      head_width_(head_width ? head_width : dims), cp_(cp_size), cp_rank_(cp_rank) {
  PRIMUS_CHECK(dims_ <= head_width_, "rope: {} rotary channels in heads of {}", dims_, head_width_);
}

void Rotary::apply(Tensor& x, int64_t heads, int64_t seq, int64_t pos0, bool inverse,
                   const std::vector<int32_t>* positions) const {
  if (head_width_ == dims_) return rotate(x, heads, seq, pos0, inverse, positions);
  // Partial rotary: each head's first dims_ columns, rotated in a contiguous buffer.
  const int64_t rows = x.size(0);
  Tensor part = be_.empty({rows, heads * dims_}, x.dtype());
  for (int64_t h = 0; h < heads; ++h) copy_block(part, 0, h * dims_, x, 0, h * head_width_, rows, dims_);
  rotate(part, heads, seq, pos0, inverse, positions);
  for (int64_t h = 0; h < heads; ++h) copy_block(x, 0, h * head_width_, part, 0, h * dims_, rows, dims_);
}

void Rotary::rotate(Tensor& x, int64_t heads, int64_t seq, int64_t pos0, bool inverse,
                    const std::vector<int32_t>* positions) const {
  if (positions) {
    // The tables' rows at the rows' positions, then row r rotated at table row r.
    const int64_t rows = x.size(0);
    PRIMUS_CHECK(int64_t(positions->size()) == rows, "rope: {} positions for {} rows", positions->size(), rows);
    Tensor c = be_.empty({rows, cos_.size(1)}, cos_.dtype()), s = be_.empty({rows, sin_.size(1)}, sin_.dtype());
    be_.gather_rows(cos_, *positions, {}, c);
    be_.gather_rows(sin_, *positions, {}, s);
    return be_.rope_apply(x, heads, dims_, rows, 0, c, s, inverse);
  }
  if (cp_ == 1) return be_.rope_apply(x, heads, dims_, seq, pos0, cos_, sin_, inverse);
  // This rank's two chunks: rows [chunk j][batch][position], chunk j at its global position.
  const int64_t ch = seq / 2, rows = x.size(0) / 2;
  for (int64_t j = 0; j < 2; ++j) {
    Tensor part = x.slice(0, j * rows, rows);
    be_.rope_apply(part, heads, dims_, ch, pos0 + cp_chunk_index(j, cp_, cp_rank_) * ch, cos_, sin_, inverse);
  }
}

QueryTemperature::QueryTemperature(ops::Backend& backend, double floor_scale, double attn_scale, int cp_size,
                                   int cp_rank)
    : be_(backend), floor_scale_(floor_scale), attn_scale_(attn_scale), cp_(cp_size), cp_rank_(cp_rank) {}

double QueryTemperature::scale(int64_t position) const {
  return std::log1p(std::floor(double(position + 1) / floor_scale_)) * attn_scale_ + 1.0;
}

void QueryTemperature::apply(Tensor& x, int64_t width, int64_t seq, int64_t pos0,
                             const std::vector<int32_t>* positions) const {
  const int64_t rows = x.size(0);
  std::vector<double> sc(static_cast<size_t>(rows));
  const int64_t per_chunk = cp_ > 1 ? seq / 2 : seq, chunk_rows = cp_ > 1 ? rows / 2 : rows;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t pos = pos0 + r % per_chunk;
    if (cp_ > 1) pos += cp_chunk_index(r / chunk_rows, cp_, cp_rank_) * per_chunk;
    sc[size_t(r)] = scale(positions ? (*positions)[size_t(r)] : pos);
  }
  std::vector<int32_t> all(static_cast<size_t>(rows));
  std::iota(all.begin(), all.end(), 0);
  Tensor q = be_.empty({rows, width}, x.dtype()), scaled = be_.empty({rows, width}, x.dtype());
  copy_block(q, 0, 0, x, 0, 0, rows, width);
  be_.gather_rows(q, all, sc, scaled);
  copy_block(x, 0, 0, scaled, 0, 0, rows, width);
}

void QkPositions::apply(Tensor& qkv, int64_t heads, int64_t groups, int64_t head_dim, int64_t seq, int64_t pos0,
                        bool inverse, const std::vector<int32_t>* positions) const {
  if (rope_) rope_->apply(qkv, heads + groups, seq, pos0, inverse, positions);
  if (temp_) temp_->apply(qkv, heads * head_dim, seq, pos0, positions);
}

}  // namespace primus
