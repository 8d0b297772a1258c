// The names of SFT's fixed conversation formats (Primus's `sft_conversation_format`), apart from
// their code so that the config's choice table (config/choices.h) needs nothing else.
#pragma once

#include <cstdint>

namespace primus::data {

// alpaca: "### Instruction / ### Input / ### Response" blocks; chatml: one <|im_start|> user turn
// and its assistant answer; openai (alias messages): every message of a conversation as a ChatML
// turn; squad: "Context: .. Question: .. Answer: ..". data/sft_format.h renders them.
// chat_template: the model's own, the Jinja chat_template of the tokenizer's tokenizer_config.json,
// rendered as Hugging Face's apply_chat_template does (data/sft_chat_template.h).
enum class ChatFormatName : uint8_t { Alpaca, ChatML, OpenAI, Squad, ChatTemplate };

}  // namespace primus::data
