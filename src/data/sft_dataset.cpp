#include "data/sft_dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"

namespace primus::data {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

void read_jsonl(const std::string& path, std::ifstream& in, SftRecords& out) {
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) fail("{}: not a JSON object (a JSONL file holds one record per line)", where);
    out.records.push_back(std::move(j));
    out.where.push_back(where);
  }
}

void add_list(const json& list, const std::string& label, SftRecords& out) {
  if (!list.is_array()) fail("{}: must be a list of records, got {}", label, list.type_name());
  for (size_t i = 0; i < list.size(); ++i) {
    out.records.push_back(list[i]);
    out.where.push_back(label + "[" + std::to_string(i) + "]");
  }
}

}  // namespace

SftRecords read_sft_records(const std::string& path, const std::string& split, bool optional) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail("sft_dataset_name '{}' is not a local file: this engine reads a local JSONL or JSON file (download the data "
         "set and point sft_dataset_name at it)",
         path);
  std::ifstream in(path);
  if (!in) fail("cannot read {}", path);
  SftRecords out;
  // A JSONL file, unless the first non-blank character opens a list or an object spread over lines.
  const bool jsonl = path.ends_with(".jsonl");
  if (jsonl) {
    read_jsonl(path, in, out);
  } else {
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded()) {
      in.clear();
      in.seekg(0);
      read_jsonl(path, in, out);  // a JSONL file by another name
    } else if (j.is_array()) {
      add_list(j, path, out);
    } else if (j.is_object()) {
      if (!j.contains(split)) {
        if (optional) return out;
        std::vector<std::string> names;
        for (const auto& [k, v] : j.items()) names.push_back(k);
        fail("{} has no split '{}' (sft_dataset_split); its splits: {}", path, split, fmt::join(names, ", "));
      }
      add_list(j[split], path + "[" + split + "]", out);
    } else {
      fail("{}: a JSON data set must be a list of records or an object of splits, got {}", path, j.type_name());
    }
  }
  if (out.records.empty() && !optional) fail("{} holds no records", path);
  return out;
}

SftTokens sft_sample(const json& record, const std::string& where, const ChatFormat& format,
                     const Tokenizer& tokenizer) {
  return tokenize_chat(format.render(sft_record_from_json(record, where)), tokenizer);
}

SftDataset::SftDataset(const SftRecords& records, const ChatFormat& format, const Tokenizer& tokenizer,
                       const SftDatasetOptions& o) {
  if (o.seq_length <= 0) fail("SFT samples need a positive seq_length, got {}", o.seq_length);
  if (records.records.empty()) fail("the SFT data set holds no records");
  const size_t len = size_t(o.seq_length) + 1;
  const int32_t pad = tokenizer.pad() >= 0 ? tokenizer.pad() : std::max(tokenizer.eos(), 0);
  samples_.reserve(records.records.size());
  int64_t longest = 0;
  for (size_t r = 0; r < records.records.size(); ++r) {
    SftTokens s = sft_sample(records.records[r], records.where[r], format, tokenizer);
    longest = std::max<int64_t>(longest, int64_t(s.ids.size()));
    if (s.ids.size() > len) ++truncated_;
    s.ids.resize(len, pad);
    s.mask.resize(len, 0);
    samples_.push_back(std::move(s));
  }
  const auto untrained = std::count_if(samples_.begin(), samples_.end(), [](const SftTokens& s) {
    return std::find(s.mask.begin() + 1, s.mask.end(), uint8_t(1)) == s.mask.end();
  });
  if (untrained == int64_t(samples_.size()))
    fail("sft: no conversation keeps a response token within seq_length + 1 = {} tokens (the longest has {}): "
         "raise seq_length",
         len, longest);
  if (truncated_ > 0)
    log::warn("sft: {} of {} conversations are longer than seq_length + 1 = {} tokens (the longest {}) and are "
              "truncated{}",
              truncated_, samples_.size(), len, longest,
              untrained > 0 ? fmt::format("; {} of them keep no response token and add nothing to the loss", untrained)
                            : "");
  // Epoch after epoch, each in its own seeded order (Fisher-Yates over a counter-based stream).
  const int64_t n = int64_t(samples_.size());
  const int64_t want = std::max(o.num_samples, n);
  order_.reserve(size_t(want));
  std::vector<int32_t> perm(static_cast<size_t>(n));
  for (int64_t epoch = 0; int64_t(order_.size()) < want; ++epoch) {
    std::iota(perm.begin(), perm.end(), 0);
    const Rng rng(o.seed ^ 0x5f7a5eedULL, 0);
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(perm[size_t(i)], perm[size_t(rng.at(uint64_t(epoch) * uint64_t(n) + uint64_t(i)) % uint64_t(i + 1))]);
    for (int64_t i = 0; i < n && int64_t(order_.size()) < want; ++i) order_.push_back(perm[size_t(i)]);
  }
}

std::vector<int32_t> SftDataset::get(int64_t i) const { return samples_[size_t(order_[size_t(i % size())])].ids; }

std::vector<uint8_t> SftDataset::loss_mask(int64_t i) const {
  return samples_[size_t(order_[size_t(i % size())])].mask;
}

}  // namespace primus::data
