// A model's rotary-embedding tables: cos and sin [positions, head_dim / 2] from its rotary base
// and, when the spec asks for it, Llama 3.1's frequency scaling. One place for the fp32 model,
// the bf16 model and the decoder, so that they rotate alike.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/elementwise.h"
#include "model/model_spec.h"

namespace primus {

template <typename T>
void rope_tables_of(const ModelSpec& s, int64_t positions, T* cos, T* sin) {
  cpu::RopeScaling sc;
  if (s.use_rope_scaling)
    sc = {s.rope_scaling_factor, s.rope_low_freq_factor, s.rope_high_freq_factor,
          s.rope_original_max_position_embeddings};
  cpu::rope_tables(cos, sin, positions, s.head_dim(), s.rotary_base, sc);
}

// Rotary embedding on the device: tables [positions, dims / 2] in the stat dtype, applied to the
// first `heads` heads of `dims` columns of every row. Under context parallelism a rank's rows are
// its two chunks of every sequence ([chunk j][batch][position], model/context_parallel.h), each
// rotated at its global positions.
class Rotary {
 public:
  // cos, sin: host tables [positions, dims / 2] in the stat dtype.
  Rotary(ops::Backend& backend, const Tensor& cos, const Tensor& sin, int64_t dims, int cp_size = 1, int cp_rank = 0);
  // x [batch * seq rows, stride]: row r of a sequence at position pos0 + r % seq (under cp, pos0 +
  // the chunk's start); inverse for the backward. positions, when given (packed documents whose
  // positions restart: model/documents.h), holds each row's position instead (seq, pos0 unused).
  void apply(Tensor& x, int64_t heads, int64_t seq, int64_t pos0, bool inverse,
             const std::vector<int32_t>* positions = nullptr) const;

 private:
  ops::Backend& be_;
  Tensor cos_, sin_;
  int64_t dims_;
  int cp_, cp_rank_;
};

}  // namespace primus
