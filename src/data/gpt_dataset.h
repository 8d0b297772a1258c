// GPT pretraining samples over Megatron indexed datasets, after megatron/core/datasets/gpt_dataset.py
// and blended_dataset.py:
//
//   document index  the split's documents (sequences of the .idx), repeated once per epoch and
//                   shuffled; when the last epoch is needed only in part (< 80%), it is shuffled on
//                   its own so the earlier epochs stay whole
//   sample index    (position in document index, token offset) where each sample starts; a sample
//                   is seq_length + 1 consecutive tokens, crossing document boundaries
//   shuffle index   a permutation of the samples
//
// The three indices are built once and cached in `<prefix>/cache/GPTDataset_indices/` (Megatron's
// default place: a folder named like the dataset's prefix, beside its .bin/.idx), file names carrying a
// hash of every parameter that shapes them; ranks that find the files load them instead. Reads are
// memory-mapped. Everything is a pure function of the seed, so a run that resumes at a consumed-samples
// count sees the same next samples.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/indexed_dataset.h"

namespace primus::data {

// Something to draw samples from: one dataset, or a blend.
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  // seq_length + 1 tokens (inputs are [0, seq_length), labels [1, seq_length]).
  virtual std::vector<int32_t> get(int64_t i) const = 0;
  // Which of sample i's tokens the loss takes as targets: seq_length + 1 flags, 0 leaving that token
  // out; empty (every dataset but SFT's, data/sft_dataset.h): all of them.
  virtual std::vector<uint8_t> loss_mask(int64_t /*i*/) const { return {}; }
  // Where the documents packed into sample i begin (ascending, the first 0); empty: one document,
  // or none that the dataset knows of (every dataset but packed SFT's).
  virtual std::vector<int32_t> document_starts(int64_t /*i*/) const { return {}; }
};

struct GPTDatasetConfig {
  // Megatron's data_path: ["a"] or [weight, prefix, weight, prefix, ...], e.g. {"0.3", "a", "0.7", "b"}.
  std::vector<std::string> data_path;
  std::string split = "969,30,1";
  int64_t seq_length = 0;
  uint64_t seed = 1234;
  // Samples wanted for train/valid/test (e.g. train_iters * global_batch_size); 0 = one epoch.
  std::array<int64_t, 3> num_samples{0, 0, 0};
  // Where the index files go; "" = beside the data (Megatron's default).
  std::string cache_dir;
  bool build_cache = true;  // false: build in memory only (read-only data folders, tests)
};

class GPTDataset : public SampleDataset {
 public:
  // Documents [doc_begin, doc_end) of `data` (indices of its sequences), `num_samples` samples
  // (0 = one epoch). `split_name` only names the cache files.
  GPTDataset(std::shared_ptr<const IndexedDataset> data, int64_t doc_begin, int64_t doc_end, int64_t num_samples,
             int64_t seq_length, uint64_t seed, const std::string& split_name, const std::string& cache_dir,
             bool build_cache);

  int64_t size() const override { return static_cast<int64_t>(shuffle_index_.size()); }
  std::vector<int32_t> get(int64_t i) const override;

  int64_t num_epochs() const { return num_epochs_; }
  const std::vector<int32_t>& document_index() const { return document_index_; }
  const std::vector<std::pair<int64_t, int64_t>>& sample_index() const { return sample_index_; }
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }
  bool loaded_from_cache() const { return from_cache_; }
  const std::string& cache_prefix() const { return cache_prefix_; }

 private:
  void build(int64_t doc_begin, int64_t doc_end, int64_t num_samples, uint64_t seed);
  bool load(const std::string& prefix);
  void save(const std::string& prefix) const;

  std::shared_ptr<const IndexedDataset> data_;
  int64_t seq_length_;
  int64_t num_epochs_ = 0;
  std::vector<int32_t> document_index_;
  std::vector<std::pair<int64_t, int64_t>> sample_index_;  // size() + 1 entries
  std::vector<int64_t> shuffle_index_;
  std::string cache_prefix_;
  bool from_cache_ = false;
};

// Draws from several datasets in proportion to their weights: sample i goes to the dataset whose
// share so far lags its weight the most (Megatron's build_blending_indices), so any prefix of the
// blend matches the weights to within one sample per dataset.
class BlendedDataset : public SampleDataset {
 public:
  BlendedDataset(std::vector<std::shared_ptr<SampleDataset>> datasets, std::vector<double> weights, int64_t size);
  int64_t size() const override { return static_cast<int64_t>(dataset_index_.size()); }
  std::vector<int32_t> get(int64_t i) const override;
  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }

 private:
  std::vector<std::shared_ptr<SampleDataset>> datasets_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

struct GPTDatasets {
  std::shared_ptr<SampleDataset> train, valid, test;  // null where the split gives no documents
};

// Parses "969,30,1" into fractions summing to 1.
std::array<double, 3> parse_split(const std::string& split);
// Document ranges [begin, end) of each split for `n` documents (Megatron's _get_split_indices).
std::array<std::pair<int64_t, int64_t>, 3> split_ranges(const std::array<double, 3>& split, int64_t n);

// Opens the datasets of config.data_path and builds train/valid/test, blended when weighted.
GPTDatasets build_gpt_datasets(const GPTDatasetConfig& config);

// Megatron's pretraining sampler: global batches of consecutive sample indices starting at
// consumed_samples, each data-parallel rank taking its micro_batch_size slice of every step.
class PretrainingSampler {
 public:
  PretrainingSampler(int64_t total_samples, int64_t consumed_samples, int64_t micro_batch_size, int64_t dp_rank,
                     int64_t dp_size);
  // The sample indices of this rank's next micro-batch; empty when the samples are used up.
  std::vector<int64_t> next();
  int64_t consumed_samples() const { return consumed_; }

 private:
  int64_t total_, consumed_, mbs_, rank_, dp_;
};

}  // namespace primus::data
