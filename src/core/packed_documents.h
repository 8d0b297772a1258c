// Documents packed into the sequences of a microbatch: where each one starts, and what the model
// does with those boundaries. The data that packs them fills it (data/microbatch.h: pretraining's
// documents split at the eod token, reset_attention_mask / reset_position_ids; packed SFT
// samples), the model reads it (model/documents.h: attention kept inside each document, rotary
// positions restarting at each). It lives here because both sides need it and neither depends on
// the other.
#pragma once

#include <cstdint>
#include <vector>

namespace primus {

struct PackedDocuments {
  // starts[b]: the positions (0 .. seq - 1 of the WHOLE sequence b, before any context-parallel
  // split) at which the documents of sequence b begin, strictly ascending, the first 0. Either
  // empty (nothing packed) or one list per sequence of the microbatch.
  std::vector<std::vector<int32_t>> starts;
  bool restart_positions = false;  // rotary position 0 at each document's start (reset_position_ids)
  bool separate_attention = false;  // attention only within each document (reset_attention_mask)

  // Whether the model has anything to do with them.
  bool active() const { return !starts.empty() && (restart_positions || separate_attention); }
  // Throws primus::Error naming the problem unless starts fits batch sequences of seq positions.
  void check(int64_t batch, int64_t seq) const;
};

}  // namespace primus
