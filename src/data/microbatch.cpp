#include "data/microbatch.h"

#include <algorithm>

#include "core/context_parallel_rows.h"
#include "core/error.h"
#include "core/rng.h"

namespace primus::data {

std::vector<int32_t> SampleSource::get(int64_t i) const {
  if (dataset) return dataset->get(i % dataset->size());
  std::vector<int32_t> s(seq + 1);
  const Rng rng(mock_seed);
  for (int64_t j = 0; j <= seq; ++j) s[j] = int32_t(rng.at(uint64_t(i) * uint64_t(seq + 1) + j) % mock_vocab);
  return s;
}

std::vector<std::vector<int32_t>> documents_after_eod(const std::vector<int32_t>& tokens, int64_t mbs, int64_t seq,
                                                      int32_t eod) {
  std::vector<std::vector<int32_t>> starts(static_cast<size_t>(mbs));
  for (int64_t b = 0; b < mbs; ++b) {
    starts[size_t(b)].push_back(0);
    for (int64_t i = 0; i + 1 < seq; ++i)
      if (tokens[size_t(b * seq + i)] == eod) starts[size_t(b)].push_back(int32_t(i + 1));
  }
  return starts;
}

void fill_microbatch(const SampleSource& src, int64_t first, int64_t mbs, int64_t seq, Microbatch& mb) {
  std::vector<int32_t>& tokens = mb.tokens;
  std::vector<int32_t>& targets = mb.targets;
  tokens.resize(mbs * seq);
  targets.resize(mbs * seq);
  for (int64_t b = 0; b < mbs; ++b) {
    std::vector<int32_t> s = src.get(first + b);
    if (int64_t(s.size()) != seq + 1) fail("dataset sample {} has {} tokens, expected {}", first + b, s.size(), seq + 1);
    std::copy(s.begin(), s.end() - 1, tokens.begin() + b * seq);
    std::copy(s.begin() + 1, s.end(), targets.begin() + b * seq);
    if (src.dataset) {  // SFT: only the responses are targets
      const std::vector<uint8_t> keep = src.dataset->loss_mask((first + b) % src.dataset->size());
      for (size_t t = 1; t < keep.size(); ++t)
        if (!keep[t]) targets[b * seq + int64_t(t) - 1] = -1;
    }
  }
  if (src.eod_mask >= 0)  // a negative target is left out of the loss
    for (int64_t i = 0; i < mbs * seq; ++i)
      if (tokens[i] == src.eod_mask) targets[i] = -1;
  mb.docs = PackedDocuments();
  if (src.dataset_documents && src.dataset) {
    for (int64_t b = 0; b < mbs; ++b) {
      std::vector<int32_t> starts = src.dataset->document_starts((first + b) % src.dataset->size());
      // a conversation starting at the last token (a target only) has no input row
      std::erase_if(starts, [&](int32_t p) { return p >= seq; });
      if (starts.empty() || starts.front() != 0) starts.insert(starts.begin(), 0);
      mb.docs.starts.push_back(std::move(starts));
    }
    mb.docs.restart_positions = mb.docs.separate_attention = true;
  } else if (src.reset_position_ids || src.reset_attention_mask) {
    mb.docs.starts = documents_after_eod(tokens, mbs, seq, src.eod);
    mb.docs.restart_positions = src.reset_position_ids;
    mb.docs.separate_attention = src.reset_attention_mask;
  }
}

std::vector<int32_t> context_parallel_rows(const int32_t* tokens, int64_t batch, int64_t seq, int cp, int cp_rank) {
  if (cp < 1 || cp_rank < 0 || cp_rank >= cp || seq % (2 * cp) != 0)
    fail("context parallel rows: sequence length {} over {} ranks (rank {}) needs a multiple of 2 x {}", seq, cp,
         cp_rank, cp);
  std::vector<int32_t> out;
  for (const int64_t at : cp_sequence_rows(batch, seq, cp, cp_rank)) out.push_back(tokens[at]);
  return out;
}

MicrobatchFill microbatches_from(const SampleSource& src, int64_t first_sample, const MicrobatchSlice& slice) {
  return [&src, first_sample, s = slice](int j, Microbatch& mb) {
    fill_microbatch(src, first_sample + (s.dp_rank * s.per_rank + j) * s.mbs, s.mbs, s.seq, mb);
    if (s.cp > 1) {  // the documents stay the whole sequences'
      mb.tokens = context_parallel_rows(mb.tokens.data(), s.mbs, s.seq, s.cp, s.cp_rank);
      mb.targets = context_parallel_rows(mb.targets.data(), s.mbs, s.seq, s.cp, s.cp_rank);
    }
  };
}

}  // namespace primus::data
