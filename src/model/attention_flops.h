// The attention core's training FLOPs, one rule for every count: model_stats (model/model_spec.h:
// the start-up line, the projection) counts a sequence's, the trainer's TFLOP/s and MFU the
// documents its microbatches attended to (packed SFT conversations, reset_attention_mask's).
#pragma once

#include <cstdint>

#include "core/packed_documents.h"
#include "model/model_spec.h"

namespace primus {

// Training FLOPs (forward and backward) of the attention core over one causal document of `tokens`
// tokens, summed over the decoder layers and the MTP depths' layers (each layer's sliding window
// honoured): QK^T and PV over
// its tokens^2 / 2 causal pairs, as model_stats counts a sequence's (its flops_per_token holds
// attention_flops(spec, seq_length) / seq_length of it).
double attention_flops(const ModelSpec& spec, int64_t tokens);

// The same over a microbatch of `batch` whole sequences of `seq` tokens as the passes run it: with
// docs.separate_attention the sum over every packed document, less than the whole sequences';
// else batch x attention_flops(seq).
double documents_attention_flops(const ModelSpec& spec, const PackedDocuments& docs, int64_t batch, int64_t seq);

}  // namespace primus
