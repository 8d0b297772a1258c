// Helpers for the model-parallel tests: a tiny spec and a comparison of one rank's shard of the
// parameters or gradients against the same tensors of a one-process reference model.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "model/llama.h"

namespace primus::testing {

inline ModelSpec mp_spec(bool tied, bool qkv_bias, int64_t groups = 2, int64_t layers = 4) {
  ModelSpec s;
  s.name = "mp-tiny";
  s.num_layers = layers;
  s.hidden_size = 16;
  s.ffn_hidden_size = 24;
  s.num_attention_heads = 4;
  s.num_query_groups = groups;
  s.vocab_size = 12;
  s.max_position_embeddings = 16;
  s.untie_embeddings_and_output_weights = !tied;
  s.add_qkv_bias = qkv_bias;
  s.init_method_std = 0.3;
  return s;
}

struct MpBatch {
  int64_t b, s;
  std::vector<int32_t> tokens, targets;
};

inline MpBatch mp_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  MpBatch x{b, s, std::vector<int32_t>(b * s), std::vector<int32_t>(b * s)};
  for (auto& t : x.tokens) t = int32_t(rng.next_u64() % vocab);
  for (auto& t : x.targets) t = int32_t(rng.next_u64() % vocab);
  x.targets[1] = -1;  // a masked token
  return x;
}

// For each element of a (possibly sharded) local tensor, its flat index in the global tensor.
inline std::vector<int64_t> global_indices(const StoredParam& p) {
  std::vector<int64_t> out(p.numel);
  if (p.shard.pieces.empty()) {
    for (int64_t i = 0; i < p.numel; ++i) out[i] = i;
    return out;
  }
  const int d = p.shard.dim;
  int64_t inner = 1;
  for (size_t k = size_t(d) + 1; k < p.shape.size(); ++k) inner *= p.shape[k];
  std::vector<int64_t> to_global;
  for (const auto& pc : p.shard.pieces)
    for (int64_t g = 0; g < pc.length; ++g) to_global.push_back(pc.global_start + g);
  const int64_t ld = p.shape[d], gd = p.global_shape[d];
  for (int64_t i = 0; i < p.numel; ++i)
    out[i] = ((i / (inner * ld)) * gd + to_global[(i / inner) % ld]) * inner + i % inner;
  return out;
}

// Every tensor of `local` equals (to rel_tol) the reference's global tensor of the same name at
// the shard's positions; `grads` selects gradients instead of values. `scale` multiplies the
// reference (e.g. a replica that holds half of a summed gradient).
inline void expect_matches(const ParamStore& local, const ParamStore& ref, bool grads,
                           double rel_tol) {
  for (size_t id = 0; id < local.infos().size(); ++id) {
    const StoredParam& p = local.infos()[id];
    const int rid = ref.find(p.name);
    ASSERT_GE(rid, 0) << p.name;
    ASSERT_EQ(ref.infos()[rid].shape, p.global_shape) << p.name;
    const double* a = grads ? local.grad<double>(int(id)) : local.value<double>(int(id));
    const double* b = grads ? ref.grad<double>(rid) : ref.value<double>(rid);
    double scale = 0;
    for (int64_t i = 0; i < ref.infos()[rid].numel; ++i) scale = std::max(scale, std::fabs(b[i]));
    const std::vector<int64_t> gi = global_indices(p);
    for (int64_t i = 0; i < p.numel; ++i)
      ASSERT_NEAR(a[i], b[gi[i]], rel_tol * (scale + 1e-30)) << p.name << " element " << i << " (global " << gi[i]
                                                             << ")";
  }
}

}  // namespace primus::testing
