// The micro-batch loader: what a rank feeds the model for each of its microbatches of a step.
// A micro-batch flows data (here) -> train (the step) -> pipeline (the schedule's F passes) -> model.
//
// Samples of seq_length + 1 tokens come from the Megatron datasets (gpt_dataset.h) or, with
// mock_data, from a counter-based random stream. A microbatch is micro_batch_size consecutive
// samples, split into inputs (tokens 0 .. seq-1) and targets (tokens 1 .. seq); a target of -1 is
// left out of the loss (eod_mask_loss, and the tokens an SFT sample's loss mask leaves out). Under
// context parallelism each rank keeps two chunks of every sequence (context_parallel_rows): the
// rows the model's context-parallel attention expects.
//
// Packed documents. A Microbatch also says where documents begin in each of its (whole)
// sequences and what the model does at their boundaries (core/packed_documents.h): Megatron's
// reset_attention_mask (attention only within a document) and reset_position_ids (positions
// restart at each document) split the samples after every eod input token, as Megatron's
// get_ltor_masks_and_position_ids does. Any other packer (packed SFT samples) fills the same
// fields: tokens and targets [mbs, seq] (this rank's rows), docs.starts one ascending list per
// sequence of the whole-sequence positions where its documents begin (the first 0), and the two
// flags; the model keeps them under every layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/packed_documents.h"
#include "data/gpt_dataset.h"

namespace primus::data {

// Samples of seq_length + 1 tokens: from the Megatron datasets, or random ("mock_data").
struct SampleSource {
  std::shared_ptr<SampleDataset> dataset;
  int64_t mock_vocab = 0, seq = 0;
  uint64_t mock_seed = 0;
  int32_t eod_mask = -1;  // eod_mask_loss: no loss where the input token is this id
  // reset_position_ids / reset_attention_mask: documents begin after each input token `eod`.
  int32_t eod = -1;
  bool reset_position_ids = false, reset_attention_mask = false;
  // use_packed_attention: the dataset's own document starts (packed SFT conversations), each
  // attended to alone with positions restarting at its start.
  bool dataset_documents = false;

  bool empty() const { return !dataset && mock_vocab == 0; }
  std::vector<int32_t> get(int64_t i) const;  // sample i (the dataset's i modulo its size)
};

// What a rank feeds the model for one microbatch: tokens and targets of its rows, and the
// documents packed into the whole sequences (inactive: one document per sequence).
struct Microbatch {
  std::vector<int32_t> tokens, targets;
  PackedDocuments docs;
};

// Fills mb's tokens/targets [mbs, seq] (and, with a reset key, its documents) from samples first ..
// first+mbs-1. A sample of another length is an error naming it.
void fill_microbatch(const SampleSource& src, int64_t first, int64_t mbs, int64_t seq, Microbatch& mb);

// Where the documents of each of the mbs sequences of `tokens` [mbs, seq] begin: at 0 and after
// every `eod` token (not after the last position), Megatron's split.
std::vector<std::vector<int32_t>> documents_after_eod(const std::vector<int32_t>& tokens, int64_t mbs, int64_t seq,
                                                      int32_t eod);

// This cp rank's tokens of a microbatch [batch, seq] (seq divisible by 2 cp): each sequence is cut
// in 2 cp chunks and the rank keeps chunks cp_rank and 2 cp - 1 - cp_rank (one early, one late:
// causal attention's work balanced), as rows [chunk j][batch][seq / (2 cp)]. The model's
// context-parallel attention (model/context_parallel.h) reads its rows in this order.
std::vector<int32_t> context_parallel_rows(const int32_t* tokens, int64_t batch, int64_t seq, int cp, int cp_rank);

// Fills this rank's microbatch `m` of the step: its rows' tokens and targets (under cp its two
// chunks of each sequence) and the whole sequences' documents.
using MicrobatchFill = std::function<void(int m, Microbatch& mb)>;

// Which microbatches of a global batch are this rank's: microbatch j of dp rank d is the global
// batch's microbatch d * per_rank + j; under context parallelism the rank keeps its two chunks of
// each sequence.
struct MicrobatchSlice {
  int64_t dp_rank = 0, per_rank = 1;  // microbatches per dp rank and step
  int64_t mbs = 1, seq = 0;           // seq: the whole sequence (before the cp split)
  int cp = 1, cp_rank = 0;
};

// The fill of the global batch that starts at sample `first_sample`. src must outlive it.
MicrobatchFill microbatches_from(const SampleSource& src, int64_t first_sample, const MicrobatchSlice& slice);

}  // namespace primus::data
