#include "core/context_parallel_rows.h"

#include <cstddef>

namespace primus {

std::vector<int64_t> cp_sequence_rows(int64_t batch, int64_t seq, int cp, int cp_rank) {
  std::vector<int64_t> rows;
  rows.reserve(size_t(batch * seq / cp));
  if (cp == 1) {
    for (int64_t i = 0; i < batch * seq; ++i) rows.push_back(i);
    return rows;
  }
  const int64_t ch = seq / (2 * cp);
  for (int j = 0; j < 2; ++j) {
    const int64_t start = cp_chunk_index(j, cp, cp_rank) * ch;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < ch; ++i) rows.push_back(b * seq + start + i);
  }
  return rows;
}

}  // namespace primus
