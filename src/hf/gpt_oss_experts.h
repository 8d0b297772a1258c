// gpt-oss's experts, packed per layer (modeling_gpt_oss's GptOssExperts), to and from ours (one
// linear_fc1 / linear_fc2 with biases per expert):
//   model.layers.N.mlp.experts.gate_up_proj       [E, hidden, 2f]: x @ it, gate and up interleaved
//                                                  by column (gate 2r, up 2r + 1)
//   model.layers.N.mlp.experts.gate_up_proj_bias  [E, 2f], interleaved alike
//   model.layers.N.mlp.experts.down_proj          [E, f, hidden]: x @ it
//   model.layers.N.mlp.experts.down_proj_bias     [E, hidden]
// or, as OpenAI publishes them, gate_up_proj_blocks / _scales and down_proj_blocks / _scales in
// MXFP4 (dequant.h), [E, out, in / 32, 16] and [E, out, in / 32]: the weights transposed (out rows,
// in columns; gate_up's rows interleaved), dequantized on import. Export writes the unpacked
// tensors in F32 or BF16.
// Llama 4's experts (modeling_llama4's Llama4TextExperts) are packed alike under
// model.layers.N.feed_forward.experts., without biases, and gate_up_proj's columns are the gate's
// then the up's (gate_up.chunk(2, dim=-1)), not interleaved.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hf/safetensors.h"
#include "model/model_spec.h"
#include "model/param_store.h"

namespace primus::hf {

// How a family packs its experts: the layer's block ("mlp." / "feed_forward."), whether gate and
// up interleave by column, whether there are biases.
struct PackedExperts {
  const char* block;
  bool interleaved;
  bool biases;
};
inline constexpr PackedExperts kGptOssExperts{"mlp.", true, true};
inline constexpr PackedExperts kLlama4Experts{"feed_forward.", false, false};

// Fills every MoE layer's expert tensors of `store` from `st` (their names under `prefix`: a
// multimodal folder's text model, hf_families.h Multimodal), marking the tensors read in `used`;
// `check` sees each tensor's values (the finiteness check). Errors name the tensor.
void import_packed_experts(const PackedExperts& k, const SafetensorsReader& st, const std::string& prefix,
                           const ModelSpec& s, ParamStore& store, std::map<std::string, bool>& used,
                           const std::function<void(const std::vector<float>&, const std::string&)>& check);

// The packed tensors of every MoE layer from `values` (the store's flat layout), as `dtype`.
std::vector<TensorOut> export_packed_experts(const PackedExperts& k, const ModelSpec& s, const ParamStore& store,
                                             const std::vector<float>& values, const std::string& dtype);

}  // namespace primus::hf
