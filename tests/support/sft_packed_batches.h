// The same SFT conversations as two microbatches that are one problem (docs/posttraining.md): one
// conversation per sequence (padded to seq_length + 1), and packed first-fit decreasing into longer
// sequences with use_packed_attention (each attends to itself alone, positions restarting), both
// built by the real pipeline: data::SftDataset (messages format, byte-level tokenizer) and
// data::fill_microbatch. Every sample of the set is in the one microbatch, so the loss (the mean
// over the trained tokens) and the gradients of the two must agree. Used by the CPU tests
// (tests/unit/engine/test_sft_packing.cpp) and the GPU suite (tests/gpu/test_cuda_backend.cpp, run
// on the emulated GPU too).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "data/microbatch.h"
#include "data/sft_dataset.h"
#include "data/tokenizer.h"

namespace primus::test {

struct SftBatch {
  data::Microbatch mb;
  int64_t batch = 0, seq = 0;
};

// Conversations of 60 to 150 bytes: some with a system prompt, some with a second turn.
inline data::SftRecords sft_packing_records(int n) {
  data::SftRecords r;
  for (int i = 0; i < n; ++i) {
    nlohmann::ordered_json m = nlohmann::ordered_json::array();
    if (i % 3 == 0) m.push_back({{"role", "system"}, {"content", "Answer with the sum only."}});
    m.push_back({{"role", "user"}, {"content", "What is " + std::to_string(7 * i) + " + " + std::to_string(i * i) + "?"}});
    m.push_back({{"role", "assistant"}, {"content", std::to_string(7 * i + i * i)}});
    if (i % 2 == 1) {
      m.push_back({{"role", "user"}, {"content", "And times two?"}});
      m.push_back({{"role", "assistant"}, {"content", std::to_string(2 * (7 * i + i * i)) + ", twice that."}});
    }
    r.records.push_back({{"messages", m}});
    r.where.push_back("conversation " + std::to_string(i));
  }
  return r;
}

// All n conversations in one microbatch: unpacked, sequences of `seq` (every conversation must fit
// seq + 1), or packed into sequences of `seq`.
inline SftBatch sft_packing_batch(int n, bool packed, int64_t seq) {
  data::TokenizerOptions to;
  to.type = "ByteLevelTokenizer";
  const auto tok = data::build_tokenizer(to);
  const auto format = data::fixed_chat_format(data::ChatFormatName::OpenAI);
  data::SftDatasetOptions o;
  o.seq_length = seq;
  o.pack = packed;
  auto ds = std::make_shared<data::SftDataset>(sft_packing_records(n), *format, *tok, o);
  data::SampleSource src;
  src.dataset = ds;
  src.dataset_documents = packed;  // use_packed_attention
  SftBatch b;
  b.batch = ds->size();
  b.seq = seq;
  data::fill_microbatch(src, 0, b.batch, seq, b.mb);
  return b;
}

}  // namespace primus::test
