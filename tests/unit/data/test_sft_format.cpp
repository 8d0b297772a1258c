// SFT's records, fixed chat formats and loss masks (data/sft_format.h): each field shape is read,
// each format renders Primus's text, and the mask covers exactly the responses and their end token,
// with a byte-level tokenizer (one token per byte) and with a word tokenizer that prepends BOS and
// glues a space to the next word (tokens across the prompt / response boundary).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "support/error_of.h"
#include "test_util.h"

namespace primus::data {
namespace {

using testing::bytes;
SftRecord rec(const std::string& text) {
  return sft_record_from_json(nlohmann::ordered_json::parse(text), "t.jsonl:1");
}

// The bytes of the trained tokens of a byte-level encoding (the eos as "<eos>").
std::string trained_bytes(const SftTokens& t, const Tokenizer& tok) {
  std::string out;
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (t.mask[i]) out += t.ids[i] == tok.eos() ? std::string("<eos>") : std::string(1, char(t.ids[i]));
  return out;
}

SftTokens render_bytes(ChatFormatName f, const std::string& record, std::string* text = nullptr) {
  const auto tok = bytes();
  const ChatText t = fixed_chat_format(f)->render(rec(record));
  if (text) *text = t.text;
  return tokenize_chat(t, *tok);
}

TEST(SftRecord, ReadsEveryFieldShape) {
  SftRecord r = rec(R"({"instruction": "Add", "input": "1 and 2", "output": "3"})");
  EXPECT_EQ(r.instruction, "Add");
  EXPECT_EQ(r.input, "1 and 2");
  EXPECT_EQ(r.response, "3");
  r = rec(R"({"prompt": "Hi", "response": "Hello", "system": "Be brief"})");
  EXPECT_EQ(r.instruction, "Hi");
  EXPECT_EQ(r.response, "Hello");
  EXPECT_EQ(r.system, "Be brief");
  r = rec(R"({"question": "2+2?", "answer": 4})");
  EXPECT_EQ(r.instruction, "2+2?");
  EXPECT_EQ(r.response, "4");  // a number is its JSON text
  r = rec(
      R"({"question": "Who?", "context": "Ann came.", "answers": {"text": ["Ann", "ann"], "answer_start": [0, 0]}})");
  EXPECT_EQ(r.input, "Ann came.");
  EXPECT_EQ(r.response, "Ann");
  r = rec(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                           {"role": "assistant", "content": "A"}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "A");
}

TEST(SftRecord, BadRecordsNameTheProblem) {
  using test::error_of;
  EXPECT_NE(error_of([] { rec(R"({"instruction": "no answer"})"); }).find("t.jsonl:1: no response to train on"),
            std::string::npos);
  EXPECT_NE(error_of([] { rec(R"({"messages": "hi"})"); }).find("field 'messages' must be a list"), std::string::npos);
  EXPECT_NE(error_of([] {
              rec(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})");
            }).find("t.jsonl:1 messages[0]: field 'content' must be text, got array"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              rec(R"({"messages": [{"role": "user", "content": "only a question"}]})");
            }).find("no assistant message to train on"),
            std::string::npos);
  EXPECT_NE(error_of([] { rec("[1, 2]"); }).find("a record must be a JSON object"), std::string::npos);
}

TEST(SftFormat, AlpacaTextAndMask) {
  std::string text;
  SftTokens t = render_bytes(ChatFormatName::Alpaca, R"({"instruction": "Add", "input": "1 and 2", "output": "3"})",
                             &text);
  EXPECT_EQ(text, "Below is an instruction that describes a task. Write a response that appropriately completes the "
                  "request.\n\n### Instruction:\nAdd\n\n### Input:\n1 and 2\n\n### Response:\n3");
  EXPECT_EQ(trained_bytes(t, *bytes()), "3<eos>");
  EXPECT_EQ(t.ids.back(), bytes()->eos());
  // A system prompt replaces the preamble; no input, no Input block.
  render_bytes(ChatFormatName::Alpaca, R"({"system": "Sys", "prompt": "Hi", "response": "Yo"})", &text);
  EXPECT_EQ(text, "Sys\n\n### Instruction:\nHi\n\n### Response:\nYo");
}

TEST(SftFormat, ChatMLTextAndMask) {
  std::string text;
  SftTokens t = render_bytes(ChatFormatName::ChatML, R"({"system": "S", "question": "Q?", "answer": "A."})", &text);
  EXPECT_EQ(text,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\nA.<|im_end|>");
  EXPECT_EQ(trained_bytes(t, *bytes()), "A.<|im_end|>");
  EXPECT_NE(t.ids.back(), bytes()->eos());  // <|im_end|> is the end token
}

TEST(SftFormat, OpenAIMessagesTrainEveryAssistantTurn) {
  std::string text;
  SftTokens t = render_bytes(ChatFormatName::OpenAI,
                             R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1"},
                                 {"role": "assistant", "content": "2"}, {"role": "user", "content": "and +1"},
                                 {"role": "assistant", "content": "3"}]})",
                             &text);
  EXPECT_EQ(text,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
            "<|im_start|>user\nand +1<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n");
  EXPECT_EQ(trained_bytes(t, *bytes()), "2<|im_end|>3<|im_end|>");
  // The alpaca shape becomes a system, user and assistant turn.
  t = render_bytes(ChatFormatName::OpenAI, R"({"instruction": "I", "input": "X", "output": "O"})", &text);
  EXPECT_EQ(text, "<|im_start|>user\nI\n\nX<|im_end|>\n<|im_start|>assistant\nO<|im_end|>\n");
  EXPECT_EQ(trained_bytes(t, *bytes()), "O<|im_end|>");
}

TEST(SftFormat, SquadTextAndMask) {
  std::string text;
  SftTokens t = render_bytes(ChatFormatName::Squad,
                             R"({"question": " Who? ", "context": "Ann came.", "answers": {"text": ["Ann "]}})", &text);
  EXPECT_EQ(text, "Context: Ann came. Question: Who? Answer: Ann");
  EXPECT_EQ(trained_bytes(t, *bytes()), " Ann<eos>");
}

TEST(SftFormat, SingleTurnFormatsTakeAConversationsLastTurn) {
  std::string text;
  render_bytes(ChatFormatName::Alpaca,
               R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})",
               &text);
  EXPECT_NE(text.find("### Instruction:\nc\n\n### Response:\nd"), std::string::npos) << text;
}

// Words with their leading space glued on (" Ann"), other characters alone; BOS first, as
// Llama2Tokenizer's encode does. Ids are stable per piece.
class WordTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out{bos()};
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i + (text[i] == ' ' ? 1 : 0);
      while (j < text.size() && std::isalnum(static_cast<unsigned char>(text[j]))) ++j;
      if (j == i || (j == i + 1 && text[i] == ' ')) j = i + 1;
      out.push_back(id(std::string(text.substr(i, j - i))));
      i = j;
    }
    return out;
  }
  std::string decode(std::span<const int32_t>) const override { return ""; }
  int64_t vocab_size() const override { return 1 << 20; }
  int32_t bos() const override { return 1; }
  int32_t eos() const override { return 2; }
  std::string type() const override { return "word"; }
  static int32_t id(const std::string& piece) { return 3 + int32_t(std::hash<std::string>{}(piece) % 100000); }
};

TEST(SftFormat, MaskFollowsTokensThatGlueASpaceToTheAnswer) {
  const WordTokenizer tok;
  const ChatText text =
      fixed_chat_format(ChatFormatName::Squad)->render(rec(R"({"question": "Who", "context": "Ann came",
                                                                                 "answer": "Ann Lee"})"));
  const SftTokens t = tokenize_chat(text, tok);
  // <s> Context : " Ann" " came" " Question" : " Who" " Answer" : | " Ann" " Lee" <eos>
  ASSERT_EQ(t.ids.size(), 13u);
  EXPECT_EQ(t.ids[0], tok.bos());
  EXPECT_EQ(t.ids[10], WordTokenizer::id(" Ann"));
  EXPECT_EQ(t.ids[11], WordTokenizer::id(" Lee"));
  EXPECT_EQ(t.ids[12], tok.eos());
  EXPECT_EQ(t.mask, (std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
}

TEST(SftFormat, AFormatThatEndsWithEosNeedsATokenizerWithOne) {
  class NoEos : public WordTokenizer {
    int32_t eos() const override { return -1; }
  };
  const NoEos tok;
  const ChatText text = fixed_chat_format(ChatFormatName::Alpaca)->render(rec(R"({"prompt": "p", "response": "r"})"));
  EXPECT_NE(test::error_of([&] { tokenize_chat(text, tok); }).find("end-of-sequence token"), std::string::npos);
}

}  // namespace
}  // namespace primus::data
