// The small dense Llama that unit tests build: by default 2 layers, hidden 64, ffn 96, 4 heads in 2
// query groups; the caller names it and gives the vocabulary, the positions and the init std.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_spec.h"

namespace primus::test {

struct TinyShape {
  int64_t layers = 2, hidden = 64, ffn = 96, heads = 4, groups = 2;
};

inline ModelSpec tiny_llama_spec(std::string name, int64_t vocab, int64_t positions, double init_std,
                                 TinyShape shape = {}) {
  ModelSpec s;
  s.name = std::move(name);
  s.num_layers = shape.layers;
  s.hidden_size = shape.hidden;
  s.ffn_hidden_size = shape.ffn;
  s.num_attention_heads = shape.heads;
  s.num_query_groups = shape.groups;
  s.vocab_size = vocab;
  s.max_position_embeddings = positions;
  s.init_method_std = init_std;
  return s;
}

}  // namespace primus::test
