// Supervised fine-tuning samples from a local chat data set (Primus's sft_dataset_name,
// sft_dataset_split, sft_conversation_format): records read from a JSONL or JSON file, rendered by
// a chat format, tokenized with the model's tokenizer (data/sft_format.h), one conversation per
// sample of seq_length + 1 tokens:
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
// "validation": [...]}). `where` of each record names its file and line or index. A missing split
// of a JSON object is an empty result when `optional`, else an error naming the splits there are.
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
};

class SftDataset : public SampleDataset {
 public:
  SftDataset(const SftRecords& records, const ChatFormat& format, const Tokenizer& tokenizer,
             const SftDatasetOptions& options);

  int64_t size() const override { return int64_t(order_.size()); }
  std::vector<int32_t> get(int64_t i) const override;
  std::vector<uint8_t> loss_mask(int64_t i) const override;

  int64_t conversations() const { return int64_t(samples_.size()); }
  int64_t truncated() const { return truncated_; }

 private:
  std::vector<SftTokens> samples_;  // padded to seq_length + 1
  std::vector<int32_t> order_;      // sample index of each draw
  int64_t truncated_ = 0;
};

}  // namespace primus::data
