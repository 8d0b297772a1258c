#include "model/rope.h"

#include "core/error.h"

namespace primus {

Rotary::Rotary(ops::Backend& backend, const Tensor& cos, const Tensor& sin, int64_t dims, int cp_size, int cp_rank)
    : be_(backend), cos_(cos.to(backend.device())), sin_(sin.to(backend.device())), dims_(dims), cp_(cp_size),
      cp_rank_(cp_rank) {}

void Rotary::apply(Tensor& x, int64_t heads, int64_t seq, int64_t pos0, bool inverse,
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
    be_.rope_apply(part, heads, dims_, ch, pos0 + (j == 0 ? cp_rank_ : 2 * cp_ - 1 - cp_rank_) * ch, cos_, sin_,
                   inverse);
  }
}

}  // namespace primus
