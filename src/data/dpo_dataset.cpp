#include "data/dpo_dataset.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace primus::data {
namespace {

using json = nlohmann::ordered_json;

// The side `key` of a record as the SFT record it renders from: text after a text prompt, or
// messages after the prompt's messages (none: the side is a whole conversation).
json side_record(const json& j, const char* key, const std::string& where) {
  const json& side = j[key];
  const auto prompt = j.find("prompt");
  const bool has_prompt = prompt != j.end() && !prompt->is_null();
  if (side.is_string()) {
    if (side.get<std::string>().empty()) fail("{}: '{}' is empty: a preference pair needs two responses", where, key);
    json r = {{"response", side}};
    if (has_prompt) r["prompt"] = *prompt;
    if (j.contains("system")) r["system"] = j["system"];
    return r;
  }
  if (!side.is_array())
    fail("{}: '{}' must be text or a list of messages, got {}", where, key, side.type_name());
  if (side.empty()) fail("{}: '{}' is empty: a preference pair needs two responses", where, key);
  const json& last = side.back();
  const auto field = [&](const char* name) {
    const auto it = last.is_object() ? last.find(name) : last.end();
    return it != last.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (field("role") != "assistant" || field("content").empty())
    fail("{}: '{}' must end with an assistant message with content (the response)", where, key);
  json messages = json::array();
  if (j.contains("system") && j["system"].is_string()) messages.push_back({{"role", "system"}, {"content", j["system"]}});
  if (has_prompt && prompt->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *prompt}});
  } else if (has_prompt) {
    if (!prompt->is_array()) fail("{}: 'prompt' must be text or a list of messages, got {}", where, prompt->type_name());
    messages.insert(messages.end(), prompt->begin(), prompt->end());
  }
  messages.insert(messages.end(), side.begin(), side.end());
  return {{"messages", messages}};
}

// The first byte where a and b differ (the shorter's length when one starts the other).
size_t first_difference(const std::string& a, const std::string& b) {
  return size_t(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

// Keeps the trained spans that reach `from` (the response); the ones before it are the prompt's.
ChatText response_only(ChatText t, size_t from) {
  std::erase_if(t.trained, [&](const std::pair<size_t, size_t>& s) { return s.second < from; });
  return t;
}

bool keeps_a_target(const SftTokens& s) {  // the first token is never a target
  return s.mask.size() > 1 && std::find(s.mask.begin() + 1, s.mask.end(), uint8_t(1)) != s.mask.end();
}

}  // namespace

DpoPair dpo_pair(const json& j, const std::string& where, const ChatFormat& format, const Tokenizer& tokenizer) {
  if (!j.is_object()) fail("{}: a record must be a JSON object, got {}", where, j.type_name());
  for (const char* key : {"chosen", "rejected"})
    if (!j.contains(key) || j[key].is_null())
      fail("{}: no '{}': a preference pair needs 'chosen' and 'rejected' (text after a 'prompt', or lists of "
           "messages)",
           where, key);
  if (j["chosen"].is_string() != j["rejected"].is_string())
    fail("{}: 'chosen' and 'rejected' must be both text or both lists of messages", where);
  const ChatText chosen = format.render(sft_record_from_json(side_record(j, "chosen", where), where + " chosen"));
  const ChatText rejected = format.render(sft_record_from_json(side_record(j, "rejected", where), where + " rejected"));
  const size_t from = first_difference(chosen.text, rejected.text);
  DpoPair p{tokenize_chat(response_only(chosen, from), tokenizer),
            tokenize_chat(response_only(rejected, from), tokenizer)};
  for (const auto& [s, key] : {std::pair{&p.chosen, "chosen"}, std::pair{&p.rejected, "rejected"}})
    if (!keeps_a_target(*s)) fail("{}: the '{}' response renders to no trained token", where, key);
  return p;
}

DpoDataset::DpoDataset(const SftRecords& records, const ChatFormat& format, const Tokenizer& tokenizer,
                       const DpoDatasetOptions& o) {
  if (o.seq_length <= 0) fail("DPO samples need a positive seq_length, got {}", o.seq_length);
  if (records.records.empty()) fail("the DPO data set holds no records");
  const size_t len = size_t(o.seq_length) + 1;
  const int32_t pad = tokenizer.pad() >= 0 ? tokenizer.pad() : std::max(tokenizer.eos(), 0);
  auto pairs = std::make_shared<std::vector<DpoPair>>();
  int64_t longest = 0, dropped = 0;
  records_ = int64_t(records.records.size());
  for (size_t r = 0; r < records.records.size(); ++r) {
    DpoPair p = dpo_pair(records.records[r], records.where[r], format, tokenizer);
    bool keeps = true, cut = false;
    for (SftTokens* s : {&p.chosen, &p.rejected}) {
      longest = std::max<int64_t>(longest, int64_t(s->ids.size()));
      if (s->ids.size() > len) cut = true;
      s->ids.resize(len, pad);
      s->mask.resize(len, 0);
      keeps = keeps && keeps_a_target(*s);
    }
    truncated_ += cut;
    if (!keeps) {
      ++dropped;
      continue;
    }
    pairs->push_back(std::move(p));
  }
  if (pairs->empty())
    fail("dpo: no pair keeps a response token on both sides within seq_length + 1 = {} tokens (the longest side has "
         "{}): raise seq_length",
         len, longest);
  if (truncated_ > 0)
    log::warn("dpo: {} of {} pairs have a side longer than seq_length + 1 = {} tokens (the longest {}) and are "
              "truncated{}",
              truncated_, records_, len, longest,
              dropped > 0 ? fmt::format("; {} of them keep no response token on a side and are left out", dropped)
                          : "");
  pairs_ = std::move(pairs);
  order_ = shuffled_epochs(this->pairs(), std::max(o.num_pairs, this->pairs()), o.seed);
}

std::shared_ptr<DpoDataset> DpoDataset::in_order() const {
  std::shared_ptr<DpoDataset> d(new DpoDataset());
  d->pairs_ = pairs_;
  d->order_.resize(pairs_->size());
  for (size_t k = 0; k < d->order_.size(); ++k) d->order_[k] = int32_t(k);
  d->records_ = records_;
  d->truncated_ = truncated_;
  return d;
}

const SftTokens& DpoDataset::side(int64_t i) const {
  const DpoPair& p = (*pairs_)[size_t(pair_of(i / 2))];
  return i % 2 == 0 ? p.chosen : p.rejected;
}

std::vector<int32_t> DpoDataset::get(int64_t i) const { return side(i).ids; }

std::vector<uint8_t> DpoDataset::loss_mask(int64_t i) const { return side(i).mask; }

}  // namespace primus::data
