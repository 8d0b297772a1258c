#include "data/sft_chat_template.h"

#include <string_view>

#include "core/bounded_json.h"
#include "core/error.h"

namespace primus::data {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// Stands for an assistant message's content while its place in the text is found: letters only,
// so that trim, strip and the like leave it whole.
constexpr std::string_view kMarker = "qPrimusAssistantContentMarkerq";

bool trained_turn(const json& m) {
  if (!m.is_object() || m.value("role", "") != "assistant") return false;
  const auto c = m.find("content");
  return c != m.end() && c->is_string() && !c->get_ref<const std::string&>().empty();
}

std::string_view rtrim(std::string_view s) {
  const size_t n = s.find_last_not_of(" \t\r\n");
  return n == std::string_view::npos ? std::string_view() : s.substr(0, n + 1);
}

std::string token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

json chat_template_special_tokens(const nlohmann::json& config) {
  json out = json::object();
  if (!config.is_object()) return out;
  for (const char* k : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (config.contains(k))
      if (std::string t = token_text(config[k]); !t.empty()) out[k] = t;
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    json list = json::array();
    for (const auto& v : config["additional_special_tokens"])
      if (std::string t = token_text(v); !t.empty()) list.push_back(t);
    if (!list.empty()) out["additional_special_tokens"] = list;
  }
  return out;
}

TemplateChatFormat::TemplateChatFormat(const std::string& source, json special_tokens)
    : template_(source), special_tokens_(std::move(special_tokens)) {
  if (!special_tokens_.is_object()) fail("chat template format: the special tokens must be a JSON object");
}

TemplateChatFormat TemplateChatFormat::from_tokenizer(const fs::path& tokenizer_model) {
  std::error_code ec;
  const fs::path folder = fs::is_directory(tokenizer_model, ec) ? tokenizer_model : tokenizer_model.parent_path();
  const fs::path config = folder / "tokenizer_config.json";
  const bool has_config = fs::is_regular_file(config, ec);
  if (!has_config && !fs::is_regular_file(folder / "chat_template.jinja", ec))
    fail("sft_conversation_format chat_template: '{}' has no tokenizer_config.json (nor chat_template.jinja) with the "
         "model's chat template; point tokenizer_model at the Hugging Face model's folder",
         folder.string());
  json tokens = json::object();
  if (has_config) tokens = chat_template_special_tokens(read_json_file(config, "tokenizer config '" + config.string() + "'"));
  return TemplateChatFormat(read_chat_template(folder), std::move(tokens));
}

json TemplateChatFormat::messages_of(const SftRecord& r) {
  if (r.messages_json.is_array()) return r.messages_json;
  json m = json::array();
  auto add = [&](const std::string& role, const std::string& content) {
    json turn = json::object();
    turn["role"] = role;
    turn["content"] = content;
    m.push_back(std::move(turn));
  };
  if (!r.messages.empty()) {
    for (const SftTurn& t : r.messages) add(t.role, t.content);
    return m;
  }
  if (!r.system.empty()) add("system", r.system);
  add("user", r.input.empty() ? r.instruction : r.instruction + "\n\n" + r.input);
  add("assistant", r.response);
  return m;
}

json TemplateChatFormat::variables(const json& messages) const {
  json v = json::object();
  v["messages"] = messages;
  v["tools"] = nullptr;
  v["documents"] = nullptr;
  v["add_generation_prompt"] = false;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) v[it.key()] = it.value();
  return v;
}

ChatText TemplateChatFormat::render(const SftRecord& record) const {
  const json messages = messages_of(record);
  const Rendered full = template_.render(variables(messages));
  ChatText out;
  out.text = full.text;
  out.add_special_tokens = false;
  if (template_.has_generation_blocks()) {
    for (const auto& span : full.generation_spans)
      if (span.second > span.first) out.trained.push_back(span);
    return out;
  }
  for (size_t i = 0; i < messages.size(); ++i)
    if (trained_turn(messages[i])) out.trained.push_back(assistant_span(messages, i, out.text));
  return out;
}

// Message i's content as the template renders it and the end-of-turn text after it, in `full`.
std::pair<size_t, size_t> TemplateChatFormat::assistant_span(const json& messages, size_t i,
                                                             const std::string& full) const {
  json marked = messages;
  marked[i]["content"] = std::string(kMarker);
  const std::string with_marker = template_.render(variables(marked)).text;
  const size_t at = with_marker.find(kMarker);
  if (at == std::string::npos || with_marker.find(kMarker, at + 1) != std::string::npos)
    fail("the chat template renders the content of assistant message {} {}: mark its assistant turns with "
         "{{% generation %}} to say what to train on",
         i, at == std::string::npos ? "not as it is" : "more than once");
  const std::string_view before(with_marker.data(), at), after = std::string_view(with_marker).substr(at + kMarker.size());
  if (before.size() + after.size() > full.size() || !full.starts_with(before) || !full.ends_with(after))
    fail("the chat template renders the turns around assistant message {} differently depending on its content: mark "
         "its assistant turns with {{% generation %}} to say what to train on",
         i);
  const size_t content_end = full.size() - after.size();
  // The end of the turn: what the template writes after the content when the conversation ends
  // with this message, up to the whitespace that ends it.
  const json upto(marked.begin(), marked.begin() + std::ptrdiff_t(i) + 1);
  const std::string last = template_.render(variables(upto)).text;
  const size_t last_at = last.rfind(kMarker);
  const std::string_view end_text =
      last_at == std::string::npos ? std::string_view() : rtrim(std::string_view(last).substr(last_at + kMarker.size()));
  if (!std::string_view(full).substr(content_end).starts_with(end_text))
    fail("the chat template ends assistant message {} with '{}' when it ends the conversation but not within it: mark "
         "its assistant turns with {{% generation %}} to say what to train on",
         i, end_text);
  return {at, content_end + end_text.size()};
}

std::unique_ptr<ChatFormat> chat_format(ChatFormatName name, const std::string& tokenizer_model) {
  if (name != ChatFormatName::ChatTemplate) return fixed_chat_format(name);
  if (tokenizer_model.empty())
    fail("sft_conversation_format chat_template renders the tokenizer's own chat template: set tokenizer_model to the "
         "Hugging Face model's folder (its tokenizer_config.json holds the template)");
  return std::make_unique<TemplateChatFormat>(TemplateChatFormat::from_tokenizer(tokenizer_model));
}

}  // namespace primus::data
