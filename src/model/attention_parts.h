// The attention parts of a decoder block (model/block_part.h), x2 = x + attention(norm(x)):
//
//   GqaAttention   grouped-query attention: qkv = h Wqkv^T (+ b) (linear_qkv, column-parallel: this
//                  rank's heads, then its k and v groups), QK-norm (qk_layernorm, model/qk_norm.h),
//                  rotary embedding, the attention core, linear_proj (row-parallel); Llama 4's
//                  layers as its variants: NoPE layers (no rotary, the queries' temperature),
//                  the QK L2-norm, chunked attention as documents (model/documents.h)
//   MlaAttention   multi-latent attention (model/mla.h): its projections pack the heads into the
//                  core's fused layout, one group per head; linear_proj as above
//
// Both call the layout's attention core (model/attention_core.h: local, ring or all-to-all), which
// owns its saves. AttentionParts builds them layer by layer and holds what their layers share
// (the core, the rotary tables, the MLA engine); it is where a new attention variant is chosen.
#pragma once

#include <cstdint>
#include <memory>

#include "model/attention_core.h"
#include "model/block_part.h"
#include "model/mla.h"
#include "model/param_store.h"
#include "model/qk_norm.h"
#include "model/rope.h"

namespace primus {

class AttentionParts {
 public:
  // Checks the layout's attention rules (cp's a2a over heads) and builds the shared engines.
  explicit AttentionParts(const PartKit& kit);
  ~AttentionParts();
  // Registers layer `layer`'s attention parameters in `params` and returns its part.
  std::unique_ptr<BlockPart> make(ParamStore& params, int64_t layer);

 private:
  const PartKit& kit_;
  std::unique_ptr<AttentionCore> core_;
  std::unique_ptr<Rotary> rope_;  // GQA's tables
  std::unique_ptr<QueryTemperature> temperature_;  // Llama 4's NoPE layers' (attn_temperature_tuning)
  Tensor unit_weight_;  // qk_l2_norm: the ones its norm runs with (the activation dtype)
  std::unique_ptr<Mla> mla_;      // MLA's projections and tables
  std::unique_ptr<QkNorm> qk_norm_;
};

}  // namespace primus
