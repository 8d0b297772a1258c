// Supervised fine-tuning samples from a local chat data set (Primus's sft_dataset_name,
// sft_dataset_split, sft_conversation_format): records read from a JSONL or JSON file, rendered by
// a chat format, tokenized with the model's tokenizer (data/sft_format.h), one conversation per
// sample of seq_length + 1 tokens, or with packing (enable_packed_sequences) as many as fit,
// first-fit decreasing, one after the other (attention runs across them, Primus's
// use_packed_attention: false; with true, within each, positions restarting at each):
//
//   longer      truncated to seq_length + 1 tokens (the build logs how many, once, and how many keep
//               no response token; when none keeps one, that is an error)
//   shorter     padded with the tokenizer's pad id (else its eos, else 0), left out of the loss
//
// loss_mask(i) keeps in the loss only the response tokens and their end token; the trainer's
// microbatch (data/microbatch.h) turns the others into targets of -1. Samples are drawn in a
// seeded shuffle, a new one per epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/gpt_dataset.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"

namespace primus::data {

// The records of `split` in a local file: a JSONL file (one object per line) or a JSON list holds
// one split and is read whole; a JSON object maps split names to lists ({"train": [...],
// "validation": [...]}). `where` of each record names its file and line or index. `optional` asks
// for a split beside the training one (validation): a JSON object's, when it has it; a JSONL file
// or JSON list has none. Otherwise a missing split is an error naming the splits there are.
struct SftRecords {
  std::vector<nlohmann::ordered_json> records;
  std::vector<std::string> where;  // "file:line" or "file[split][i]"
};
SftRecords read_sft_records(const std::string& path, const std::string& split, bool optional = false);

// One conversation per sample: ids (no padding) and the loss mask, for sft-preview and tests.
SftTokens sft_sample(const nlohmann::ordered_json& record, const std::string& where, const ChatFormat& format,
                     const Tokenizer& tokenizer);

struct SftDatasetOptions {
  int64_t seq_length = 0;   // samples are seq_length + 1 tokens
  int64_t num_samples = 0;  // samples wanted (epochs follow each other); 0: one epoch
  uint64_t seed = 1234;
  bool pack = false;  // enable_packed_sequences: several conversations per sample
};

// First-fit decreasing: the items by length, longest first (ties in index order), each into the
// first bin (in the order bins were opened) with room for it. Returns the item indices of each bin.
std::vector<std::vector<int32_t>> pack_first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity);

// `want` draws of n items, epoch after epoch, each epoch in its own seeded order (Fisher-Yates over
// a counter-based stream): SFT's samples, DPO's pairs (data/dpo_dataset.h).
std::vector<int32_t> shuffled_epochs(int64_t n, int64_t want, uint64_t seed);

class SftDataset : public SampleDataset {
 public:
  SftDataset(const SftRecords& records, const ChatFormat& format, const Tokenizer& tokenizer,
             const SftDatasetOptions& options);

  int64_t size() const override { return int64_t(order_.size()); }
  std::vector<int32_t> get(int64_t i) const override;
  std::vector<uint8_t> loss_mask(int64_t i) const override;

  // Where each conversation of sample i starts ({0} unpacked): with use_packed_attention the
  // microbatch's documents (data/microbatch.h), attention kept within each conversation.
  std::vector<int32_t> document_starts(int64_t i) const override;

  int64_t conversations() const { return conversations_; }
  int64_t sequences() const { return int64_t(samples_.size()); }
  int64_t truncated() const { return truncated_; }

 private:
  std::vector<SftTokens> tokenize(const SftRecords& records, const ChatFormat& format, const Tokenizer& tokenizer,
                                  size_t len);

  std::vector<SftTokens> samples_;            // padded to seq_length + 1
  std::vector<std::vector<int64_t>> starts_;  // packed: each sample's conversation starts
  std::vector<int32_t> order_;                // sample index of each draw
  int64_t conversations_ = 0, truncated_ = 0;
};

}  // namespace primus::data
