// A model's rotary-embedding tables: cos and sin [positions, head_dim / 2] from its rotary base
// and, when the spec asks for it, Llama 3.1's frequency scaling. One place for the fp32 model,
// the bf16 model and the decoder, so that they rotate alike.
#pragma once

#include <cstdint>

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

}  // namespace primus
