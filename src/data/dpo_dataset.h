// Direct preference optimization (DPO) pairs from a local preference data set (sft_dataset_name,
// sft_dataset_split, sft_conversation_format, as SFT reads them: data/sft_dataset.h): each record
// a prompt with a chosen and a rejected response, in TRL's shapes:
//
//   text                "prompt", "chosen", "rejected" strings (and an optional "system")
//   explicit prompt     "prompt" a list of messages (or text: one user message), "chosen" and
//                       "rejected" lists of messages that follow it (usually the assistant's answer)
//   implicit prompt     "chosen" and "rejected" whole conversations that share their first turns
//
// Each side is a conversation rendered by the SFT chat format (data/sft_format.h) and tokenized
// with its loss mask; the mask keeps the response only: of the format's trained spans, those that
// reach the first byte where the chosen and rejected texts differ (an assistant turn that both
// share, before it, is the prompt's). A side longer than seq_length + 1 tokens is truncated; a pair
// where a side keeps no response token is left out (counted in the log). Sample 2k of the data set
// is draw k's chosen side, 2k + 1 its rejected side; draws follow a seeded shuffle per epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/gpt_dataset.h"
#include "data/sft_dataset.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"

namespace primus::data {

struct DpoPair {
  SftTokens chosen, rejected;  // ids and loss masks, not padded
};

// Reads and renders one record; `where` names it in errors. A record without "chosen" or
// "rejected", with an empty response, or with fields of the wrong kind is an error naming it.
DpoPair dpo_pair(const nlohmann::ordered_json& record, const std::string& where, const ChatFormat& format,
                 const Tokenizer& tokenizer);

struct DpoDatasetOptions {
  int64_t seq_length = 0;  // each side is seq_length + 1 tokens
  int64_t num_pairs = 0;   // draws wanted (epochs follow each other); 0: one epoch
  uint64_t seed = 1234;
};

class DpoDataset : public SampleDataset {
 public:
  DpoDataset(const SftRecords& records, const ChatFormat& format, const Tokenizer& tokenizer,
             const DpoDatasetOptions& options);

  // Two samples per draw: 2k chosen, 2k + 1 rejected (seq_length + 1 tokens, padded).
  int64_t size() const override { return 2 * int64_t(order_.size()); }
  std::vector<int32_t> get(int64_t i) const override;
  std::vector<uint8_t> loss_mask(int64_t i) const override;

  int64_t pairs() const { return int64_t(pairs_->size()); }  // distinct pairs kept
  int64_t draws() const { return int64_t(order_.size()); }
  int64_t pair_of(int64_t draw) const { return order_[size_t(draw % draws())]; }
  int64_t records() const { return records_; }
  int64_t truncated() const { return truncated_; }
  // The same pairs, once each in file order (draw k is pair k): the reference pass's view.
  std::shared_ptr<DpoDataset> in_order() const;

 private:
  DpoDataset() = default;
  const SftTokens& side(int64_t i) const;

  std::shared_ptr<const std::vector<DpoPair>> pairs_;  // padded to seq_length + 1
  std::vector<int32_t> order_;                         // pair index of each draw
  int64_t records_ = 0, truncated_ = 0;
};

}  // namespace primus::data
