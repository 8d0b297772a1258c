// Supervised fine-tuning: what one JSON record of a chat data set says (SftRecord), how a chat
// format turns it into training text with the spans the loss covers (ChatFormat), and how that
// text becomes token ids with a loss mask (tokenize_chat).
//
//   record (JSONL line) --SftRecord--> ChatFormat::render --ChatText{text, trained spans}-->
//   tokenize_chat --SftTokens{ids, mask}--> data/sft_dataset.h's samples
//
// The fixed formats (alpaca, chatml, openai/messages, squad) are ChatFormats; a model's own chat
// template is another (data/sft_chat_template.h): it renders text and the assistant spans too,
// and everything after render() stays the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/sft_options.h"
#include "data/tokenizer.h"

namespace primus::data {

struct SftTurn {
  std::string role, content;  // role: system | user | assistant (| tool ...)
};

// The field shapes Primus accepts: instruction/input/output (alpaca), prompt/response,
// question/answer (and SQuAD's context/answers), messages [{role, content}], with an optional
// system prompt.
struct SftRecord {
  std::vector<SftTurn> messages;  // non-empty: a conversation (the fields below are then unused)
  // The record's `messages` list as given, every key of each message kept (a chat template may
  // read more than role and content: reasoning_content, tool_calls, ...); null for other shapes.
  nlohmann::ordered_json messages_json;
  std::string system, instruction, input, response;
};

// Reads one record; `where` names it in errors ("data.jsonl:12"). A record without a response to
// train on, or with a field of the wrong kind, is an error naming the field.
SftRecord sft_record_from_json(const nlohmann::ordered_json& j, const std::string& where);

// A rendered sample: its text and the [begin, end) byte spans of it that the loss covers.
// end_with_eos: the tokenizer's end-of-sequence id follows the text and is trained on too.
// add_special_tokens false: the text writes the model's own special tokens (a chat template writes
// its BOS), so it is encoded as it is, nothing added around it (Tokenizer::encode_bare, as
// apply_chat_template encodes with add_special_tokens=False).
struct ChatText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;
  bool end_with_eos = false;
  bool add_special_tokens = true;
};

class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  virtual ChatText render(const SftRecord& record) const = 0;
};

// The fixed formats; ChatFormatName::ChatTemplate is the tokenizer's (chat_format() in
// data/sft_chat_template.h) and an error here.
std::unique_ptr<ChatFormat> fixed_chat_format(ChatFormatName name);

// Token ids and, per id, 1 where the loss takes it as a target (0 elsewhere).
struct SftTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};

// Encodes the whole text at once (so tokens are the tokenizer's own for it) and marks the tokens
// of the trained spans: a span's bounds are found as the ids the text before each bound encodes
// to; a token that straddles a bound is trained on. Then the end-of-sequence id when asked.
SftTokens tokenize_chat(const ChatText& text, const Tokenizer& tokenizer);

}  // namespace primus::data
