// SFT with the model's own chat template (sft_conversation_format: chat_template): a record's
// conversation rendered by the Jinja chat_template of the tokenizer's tokenizer_config.json exactly
// as Hugging Face's tokenizer.apply_chat_template(messages, tokenize=True) renders and encodes it
// (data/chat_template.h renders; the text writes its own BOS and special tokens, so it is encoded
// with nothing added around it, Tokenizer::encode_bare), and the assistant turns as the trained
// spans:
//
//   {% generation %} marks    the spans the template marks (Hugging Face's
//                             return_assistant_tokens_mask), as they are
//   no marks                  each assistant message's content as the template renders it (trim
//                             and all) and the end-of-turn text the template writes right after
//                             it (<|im_end|>, <|eot_id|>, <end_of_turn>, </s>, ...), not the
//                             whitespace after that
//
// Without marks, a turn is found by rendering the conversation again with that message's content
// replaced by a marker: the text before and after the marker must be the text before and after
// the content in the real rendering, and the end-of-turn text is what follows the marker when the
// conversation ends with that turn. (Rendering prefixes of the conversation does not work for every
// template: Mistral's puts the system prompt into the last user turn, Qwen3's renders the last
// assistant turn with an empty <think> block and earlier ones without.) A template whose turn text
// depends on the content in other ways is an error that says to mark its turns with
// {% generation %}.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/sft_format.h"
#include "data/sft_options.h"

namespace primus::data {

class TemplateChatFormat : public ChatFormat {
 public:
  // source: the template's text; special_tokens: the tokenizer's special tokens by name
  // ({"bos_token": "<s>", "eos_token": "</s>", ...}), passed to the template as apply_chat_template
  // passes its tokenizer's special_tokens_map.
  TemplateChatFormat(const std::string& source, nlohmann::ordered_json special_tokens);

  // The template of a tokenizer folder (or of the folder of a tokenizer.json or
  // tokenizer_config.json file): its chat_template.jinja, else its tokenizer_config.json's
  // chat_template; the special tokens from that tokenizer_config.json.
  static TemplateChatFormat from_tokenizer(const std::filesystem::path& tokenizer_model);

  ChatText render(const SftRecord& record) const override;

  // What the template is given for a conversation: messages, tools and documents (None),
  // add_generation_prompt false, and the special tokens.
  nlohmann::ordered_json variables(const nlohmann::ordered_json& messages) const;

  // The conversation of a record as messages: its `messages` as given, or the system prompt, the
  // instruction (and input) as the user's turn and the response as the assistant's.
  static nlohmann::ordered_json messages_of(const SftRecord& record);

 private:
  std::pair<size_t, size_t> assistant_span(const nlohmann::ordered_json& messages, size_t i,
                                           const std::string& full) const;

  ChatTemplate template_;
  nlohmann::ordered_json special_tokens_;
};

// The special tokens of a parsed tokenizer_config.json as apply_chat_template passes them: each
// of bos_token, eos_token, unk_token, sep_token, pad_token, cls_token and mask_token that is set
// (a string, or an added-token object's "content"), and additional_special_tokens when not empty.
nlohmann::ordered_json chat_template_special_tokens(const nlohmann::json& tokenizer_config);

// The format `name` names: a fixed one (data/sft_format.h), or for ChatFormatName::ChatTemplate
// the chat template of the tokenizer at `tokenizer_model` (a folder or a file in it).
std::unique_ptr<ChatFormat> chat_format(ChatFormatName name, const std::string& tokenizer_model);

}  // namespace primus::data
