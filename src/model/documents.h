// A microbatch's packed documents (core/packed_documents.h) as this rank's model applies them.
// LlamaModel::begin_microbatch builds them once per microbatch; every layer's passes read them
// through PassShape::docs:
//   - the attention core (model/attention_core.h) keeps each query inside its document: the op
//     set's attention takes each row's document start (ops::AttentionShape::doc_start), and under
//     context parallelism the ring's blocks and the all-to-all's whole sequences get theirs;
//   - the rotary embedding (model/rope.h) rotates each row at its position within its document.
#pragma once

#include <cstdint>
#include <vector>

#include "core/packed_documents.h"
#include "core/tensor.h"
#include "kernels/backend.h"

namespace primus {

struct DocumentRows {
  // Rotary positions of this rank's rows (restart_positions), host; empty: the rows' own positions.
  std::vector<int32_t> positions;
  // separate_attention, int32 on the backend's device: the whole-sequence position at which each of
  // this rank's rows' document starts, in the rows' order ([chunk][batch][position] under context
  // parallelism); and (context parallelism only) the same for the whole sequences in position
  // order [batch][seq * cp], which the all-to-all's attention runs over. Undefined otherwise.
  Tensor doc_start, seq_doc_start;

  bool restarts_positions() const { return !positions.empty(); }
  bool separates_attention() const { return doc_start.defined(); }
};

// docs (checked against batch sequences of seq * cp positions) for this rank's rows: batch
// sequences of `seq` rows each (under cp the two chunks cp_rank and 2 cp - 1 - cp_rank).
// attention_chunk > 0 (Llama 4's chunked attention, ModelSpec::attention_chunk_size): every chunk
// of that many positions of a sequence is a document of its own as well, so that a row's
// document starts at max(its packed document's start, floor(position / chunk) * chunk); the
// rotary positions stay the packed documents' alone.
DocumentRows document_rows(const PackedDocuments& docs, int64_t batch, int64_t seq, int cp, int cp_rank,
                           Device device, int64_t attention_chunk = 0);

// s with the documents of its query rows: doc_start [s.batch * s.seq] (rows of a block: a slice of
// DocumentRows::doc_start), key_pos0 the position of its key rows' first row. Undefined
// doc_start: s unchanged (plain causal).
ops::AttentionShape with_documents(ops::AttentionShape s, const Tensor& doc_start, int64_t key_pos0 = 0);

}  // namespace primus
