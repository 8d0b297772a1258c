// Context parallelism's row order, the one rule the data loader and the model share. Each
// sequence of S positions is cut into 2 cp chunks and rank r keeps chunks r and 2 cp - 1 - r (so
// that every rank gets the same share of the causal mask's work). A rank's rows are
// [chunk j][batch][position in the chunk]: data/microbatch.h hands them over in that order, and
// the model's rotary positions, document rows and multi-token prediction read them that way.
#pragma once

#include <cstdint>
#include <vector>

namespace primus {

// Which of the 2 cp chunks of a sequence is rank cp_rank's chunk j (0 or 1).
inline int64_t cp_chunk_index(int64_t j, int cp, int cp_rank) { return j == 0 ? cp_rank : 2 * cp - 1 - cp_rank; }

// Where each of rank cp_rank's rows sits in the microbatch's whole sequences: b * seq + position,
// for `batch` sequences of `seq` positions (the whole length, a multiple of 2 cp), in the rank's
// row order. cp 1: 0, 1, ..., batch * seq - 1.
std::vector<int64_t> cp_sequence_rows(int64_t batch, int64_t seq, int cp, int cp_rank);

}  // namespace primus
