#include "data/sft_format.h"

#include <algorithm>

#include "core/error.h"

namespace primus::data {
namespace {

using json = nlohmann::ordered_json;

// A text field: absent or null gives "", a number or bool its JSON text (as Primus's str()), a
// list or object is an error.
std::string text_field(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number() || it->is_boolean()) return it->dump();
  fail("{}: field '{}' must be text, got {}", where, key, it->type_name());
}

// The first of `keys` present (not null) in j, or nullptr.
const json* first_of(const json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (const auto it = j.find(k); it != j.end() && !it->is_null()) return &*it;
  return nullptr;
}

std::string first_text(const json& j, std::initializer_list<const char*> keys, const std::string& where) {
  for (const char* k : keys)
    if (const auto it = j.find(k); it != j.end() && !it->is_null()) return text_field(j, k, where);
  return "";
}

// SQuAD's answers: {"text": [...], "answer_start": [...]} or a plain list; the first answer.
std::string squad_answer(const json& answers, const std::string& where) {
  const json* list = answers.is_object() && answers.contains("text") ? &answers["text"] : &answers;
  if (!list->is_array())
    fail("{}: field 'answers' must be a list or {{\"text\": [...]}}, got {}", where, list->type_name());
  if (list->empty()) return "";
  if (!(*list)[0].is_string()) fail("{}: the first of 'answers' must be text", where);
  return (*list)[0].get<std::string>();
}

// The single turn the one-turn formats (alpaca, chatml, squad) train on: of a conversation, its
// system prompt, last user message and last assistant message (as Primus collapses them).
SftRecord single_turn(const SftRecord& r) {
  if (r.messages.empty()) return r;
  SftRecord out;
  for (const SftTurn& t : r.messages) {
    if (t.content.empty()) continue;
    if (t.role == "system")
      out.system = t.content;
    else if (t.role == "user")
      out.instruction = t.content;
    else if (t.role == "assistant")
      out.response = t.content;
  }
  return out;
}

// Appends text, trained or not.
struct Builder {
  ChatText out;
  void add(const std::string& s, bool trained = false) {
    if (trained && !s.empty()) out.trained.push_back({out.text.size(), out.text.size() + s.size()});
    out.text += s;
  }
};

class Alpaca : public ChatFormat {
 public:
  ChatText render(const SftRecord& record) const override {
    const SftRecord r = single_turn(record);
    Builder b;
    b.add(!r.system.empty() ? r.system + "\n\n"
                            : "Below is an instruction that describes a task. Write a response that appropriately "
                              "completes the request.\n\n");
    b.add("### Instruction:\n" + r.instruction + "\n\n");
    if (!r.input.empty()) b.add("### Input:\n" + r.input + "\n\n");
    b.add("### Response:\n");
    b.add(r.response, true);
    b.out.end_with_eos = true;
    return b.out;
  }
};

class ChatML : public ChatFormat {
 public:
  ChatText render(const SftRecord& record) const override {
    const SftRecord r = single_turn(record);
    Builder b;
    if (!r.system.empty()) b.add("<|im_start|>system\n" + r.system + "<|im_end|>\n");
    b.add("<|im_start|>user\n" + (r.input.empty() ? r.instruction : r.instruction + "\n\n" + r.input) + "<|im_end|>\n");
    b.add("<|im_start|>assistant\n");
    b.add(r.response + "<|im_end|>", true);  // the answer and its end token
    return b.out;
  }
};

// Every message as a ChatML turn; the assistant turns' content and <|im_end|> are trained on.
class OpenAIMessages : public ChatFormat {
 public:
  ChatText render(const SftRecord& r) const override {
    std::vector<SftTurn> turns = r.messages;
    if (turns.empty()) {
      if (!r.system.empty()) turns.push_back({"system", r.system});
      turns.push_back({"user", r.input.empty() ? r.instruction : r.instruction + "\n\n" + r.input});
      turns.push_back({"assistant", r.response});
    }
    Builder b;
    for (const SftTurn& t : turns) {
      if (t.role.empty() || t.content.empty()) continue;
      b.add("<|im_start|>" + t.role + "\n");
      const bool assistant = t.role == "assistant";
      b.add(t.content + "<|im_end|>", assistant);
      b.add("\n");
    }
    return b.out;
  }
};

std::string strip_spaces(const std::string& s) {
  const size_t a = s.find_first_not_of(' ');
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(' ') - a + 1);
}

class Squad : public ChatFormat {
 public:
  ChatText render(const SftRecord& record) const override {
    const SftRecord r = single_turn(record);
    Builder b;
    b.add("Context: " + strip_spaces(r.input) + " Question: " + strip_spaces(r.instruction) + " Answer:");
    b.add(" " + strip_spaces(r.response), true);
    b.out.end_with_eos = true;
    return b.out;
  }
};

// Length of the common prefix of a and b.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return size_t(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

}  // namespace

SftRecord sft_record_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: a record must be a JSON object, got {}", where, j.type_name());
  SftRecord r;
  if (const json* m = first_of(j, {"messages"})) {
    if (!m->is_array())
      fail("{}: field 'messages' must be a list of {{\"role\", \"content\"}}, got {}", where, m->type_name());
    for (size_t i = 0; i < m->size(); ++i) {
      const json& t = (*m)[i];
      const std::string at = where + " messages[" + std::to_string(i) + "]";
      if (!t.is_object()) fail("{}: a message must be an object with role and content, got {}", at, t.type_name());
      r.messages.push_back({text_field(t, "role", at), text_field(t, "content", at)});
    }
    r.messages_json = *m;
    if (std::none_of(r.messages.begin(), r.messages.end(),
                     [](const SftTurn& t) { return t.role == "assistant" && !t.content.empty(); }))
      fail("{}: the conversation has no assistant message to train on", where);
    return r;
  }
  r.system = text_field(j, "system", where);
  r.instruction = first_text(j, {"instruction", "prompt", "question"}, where);
  r.input = first_text(j, {"input", "context"}, where);
  if (first_of(j, {"response", "output", "answer"}))
    r.response = first_text(j, {"response", "output", "answer"}, where);
  else if (const json* a = first_of(j, {"answers"}))
    r.response = squad_answer(*a, where);
  else
    fail("{}: no response to train on: a record needs 'output', 'response', 'answer', 'answers' or 'messages'", where);
  return r;
}

std::unique_ptr<ChatFormat> fixed_chat_format(ChatFormatName name) {
  switch (name) {
    case ChatFormatName::Alpaca: return std::make_unique<Alpaca>();
    case ChatFormatName::ChatML: return std::make_unique<ChatML>();
    case ChatFormatName::OpenAI: return std::make_unique<OpenAIMessages>();
    case ChatFormatName::Squad: return std::make_unique<Squad>();
    case ChatFormatName::ChatTemplate:
      fail("the chat_template format is the tokenizer's own: build it with chat_format(name, tokenizer folder)");
  }
  fail("unknown chat format {}", int(name));
}

SftTokens tokenize_chat(const ChatText& t, const Tokenizer& tokenizer) {
  SftTokens out;
  auto encode = [&](std::string_view s) { return t.add_special_tokens ? tokenizer.encode(s) : tokenizer.encode_bare(s); };
  out.ids = encode(t.text);
  out.mask.assign(out.ids.size(), 0);
  for (const auto& [begin, end] : t.trained) {
    const std::vector<int32_t> before = encode(std::string_view(t.text).substr(0, begin));
    const std::vector<int32_t> through = encode(std::string_view(t.text).substr(0, end));
    const size_t first = common_prefix(before, out.ids);
    size_t last = common_prefix(through, out.ids);
    if (last < through.size()) last = std::min(last + 1, out.ids.size());  // a token straddles the span's end
    for (size_t k = first; k < last; ++k) out.mask[k] = 1;
  }
  if (t.end_with_eos) {
    if (tokenizer.eos() < 0)
      fail("this conversation format ends each response with the end-of-sequence token, and tokenizer {} has none",
           tokenizer.type());
    out.ids.push_back(tokenizer.eos());
    out.mask.push_back(1);
  }
  return out;
}

}  // namespace primus::data
