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
    if (!optional) read_jsonl(path, in, out);  // one split: the training one
  } else {
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded()) {
      in.clear();
      in.seekg(0);
      if (!optional) read_jsonl(path, in, out);  // a JSONL file by another name
    } else if (j.is_array()) {
      if (!optional) add_list(j, path, out);
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
  const SftRecord r = sft_record_from_json(record, where);
  try {
    return tokenize_chat(format.render(r), tokenizer);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
}

std::vector<std::vector<int32_t>> pack_first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t capacity) {
  std::vector<int32_t> by_length(lengths.size());
  std::iota(by_length.begin(), by_length.end(), 0);
  std::stable_sort(by_length.begin(), by_length.end(), [&](int32_t x, int32_t y) { return lengths[x] > lengths[y]; });
  // room[leaves + b]: what bin b has left (bins not opened yet have all of it); inner nodes hold the
  // largest room below them, so the first bin with room for a length is a walk down from the root.
  size_t leaves = 1;
  while (leaves < lengths.size()) leaves *= 2;
  std::vector<int64_t> room(2 * leaves, capacity);
  std::vector<std::vector<int32_t>> bins;
  for (int32_t i : by_length) {
    if (lengths[size_t(i)] > capacity)
      fail("a conversation of {} tokens cannot be packed into {}", lengths[size_t(i)], capacity);
    size_t node = 1;
    while (node < leaves) node = room[2 * node] >= lengths[size_t(i)] ? 2 * node : 2 * node + 1;
    const size_t bin = node - leaves;
    if (bin == bins.size()) bins.emplace_back();
    bins[bin].push_back(i);
    for (room[node] -= lengths[size_t(i)]; node > 1; node /= 2) room[node / 2] = std::max(room[node], room[node ^ 1]);
  }
  return bins;
}

SftDataset::SftDataset(const SftRecords& records, const ChatFormat& format, const Tokenizer& tokenizer,
                       const SftDatasetOptions& o) {
  if (o.seq_length <= 0) fail("SFT samples need a positive seq_length, got {}", o.seq_length);
  if (records.records.empty()) fail("the SFT data set holds no records");
  const size_t len = size_t(o.seq_length) + 1;
  std::vector<SftTokens> conversations = tokenize(records, format, tokenizer, len);
  conversations_ = int64_t(conversations.size());
  const int32_t pad = tokenizer.pad() >= 0 ? tokenizer.pad() : std::max(tokenizer.eos(), 0);
  if (!o.pack) {
    samples_ = std::move(conversations);
  } else {  // conversations one after the other, as many as fit, first-fit decreasing
    std::vector<int64_t> lengths;
    for (const SftTokens& c : conversations) lengths.push_back(int64_t(c.ids.size()));
    for (const std::vector<int32_t>& bin : pack_first_fit_decreasing(lengths, int64_t(len))) {
      SftTokens packed;
      std::vector<int64_t> starts;
      for (int32_t c : bin) {
        starts.push_back(int64_t(packed.ids.size()));
        packed.ids.insert(packed.ids.end(), conversations[size_t(c)].ids.begin(), conversations[size_t(c)].ids.end());
        packed.mask.insert(packed.mask.end(), conversations[size_t(c)].mask.begin(),
                           conversations[size_t(c)].mask.end());
      }
      samples_.push_back(std::move(packed));
      starts_.push_back(std::move(starts));
    }
    log::info("sft: {} conversations packed into {} sequences of {} tokens (first-fit decreasing)", conversations_,
              samples_.size(), len);
  }
  for (SftTokens& s : samples_) {
    s.ids.resize(len, pad);
    s.mask.resize(len, 0);
  }
  order_ = shuffled_epochs(int64_t(samples_.size()), std::max(o.num_samples, int64_t(samples_.size())), o.seed);
}

// Each conversation's ids and mask, at most `len` of them (the log says how many were cut, once).
std::vector<SftTokens> SftDataset::tokenize(const SftRecords& records, const ChatFormat& format,
                                            const Tokenizer& tokenizer, size_t len) {
  std::vector<SftTokens> out;
  out.reserve(records.records.size());
  int64_t longest = 0, untrained = 0;
  for (size_t r = 0; r < records.records.size(); ++r) {
    SftTokens s = sft_sample(records.records[r], records.where[r], format, tokenizer);
    longest = std::max<int64_t>(longest, int64_t(s.ids.size()));
    if (s.ids.size() > len) {
      ++truncated_;
      s.ids.resize(len);
      s.mask.resize(len);
    }
    // The first token is never a target.
    untrained += std::find(s.mask.begin() + 1, s.mask.end(), uint8_t(1)) == s.mask.end();
    out.push_back(std::move(s));
  }
  if (untrained == int64_t(out.size()))
    fail("sft: no conversation keeps a response token within seq_length + 1 = {} tokens (the longest has {}): "
         "raise seq_length",
         len, longest);
  if (truncated_ > 0)
    log::warn("sft: {} of {} conversations are longer than seq_length + 1 = {} tokens (the longest {}) and are "
              "truncated{}",
              truncated_, out.size(), len, longest,
              untrained > 0 ? fmt::format("; {} of them keep no response token and add nothing to the loss", untrained)
                            : "");
  return out;
}

std::vector<int32_t> shuffled_epochs(int64_t n, int64_t want, uint64_t seed) {
  std::vector<int32_t> order;
  order.reserve(size_t(want));
  std::vector<int32_t> perm(static_cast<size_t>(n));
  const Rng rng(seed ^ 0x5f7a5eedULL, 0);
  for (int64_t epoch = 0; int64_t(order.size()) < want; ++epoch) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(perm[size_t(i)], perm[size_t(rng.at(uint64_t(epoch) * uint64_t(n) + uint64_t(i)) % uint64_t(i + 1))]);
    for (int64_t i = 0; i < n && int64_t(order.size()) < want; ++i) order.push_back(perm[size_t(i)]);
  }
  return order;
}

std::vector<int32_t> SftDataset::get(int64_t i) const { return samples_[size_t(order_[size_t(i % size())])].ids; }

std::vector<uint8_t> SftDataset::loss_mask(int64_t i) const {
  return samples_[size_t(order_[size_t(i % size())])].mask;
}

std::vector<int32_t> SftDataset::document_starts(int64_t i) const {
  if (starts_.empty()) return {0};
  const std::vector<int64_t>& s = starts_[size_t(order_[size_t(i % size())])];
  return std::vector<int32_t>(s.begin(), s.end());
}

}  // namespace primus::data
