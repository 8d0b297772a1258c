// Tokenizers behind one interface, chosen by Megatron's --tokenizer-type names:
//
//   HuggingFaceTokenizer     tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2.5), or a folder with one
//   TikTokenizer             tiktoken rank file (.tiktoken "base64 rank" lines, or Megatron's JSON list)
//   GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer   SentencePiece .model
//   ByteLevelTokenizer       UTF-8 bytes 0..255 plus <pad> <s> </s>; needs no model file
//   NullTokenizer            text is space-separated integer ids (Megatron's, for tests and benchmarks)
//
// encode() follows what Megatron's tokenizer of that type does in tokenize() (Llama2Tokenizer prepends
// BOS, a tokenizer.json post-processor adds its template tokens), so preprocessed data match theirs.
// All methods are const and thread-safe: the preprocessor calls one tokenizer from many workers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace primus::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The ids of the text alone, as Hugging Face's encode(text, add_special_tokens=False): added
  // tokens written in the text are still matched, but nothing is added around it (no BOS of
  // Llama2Tokenizer, no post-processor template). A chat template's text needs this: it writes its
  // own BOS (apply_chat_template tokenizes so).
  virtual std::vector<int32_t> encode_bare(std::string_view text) const { return encode(text); }
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // Number of ids the model may see (special tokens included); ids are in [0, vocab_size).
  virtual int64_t vocab_size() const = 0;
  // -1 when the tokenizer has no such token.
  virtual int32_t bos() const { return -1; }
  virtual int32_t eos() const { return -1; }
  virtual int32_t pad() const { return -1; }
  // End of document, appended by `data preprocess --append-eod` (Megatron: eod == eos for most types).
  virtual int32_t eod() const { return eos(); }
  virtual std::vector<std::pair<std::string, int32_t>> special_tokens() const { return {}; }
  virtual std::string type() const = 0;
};

struct TokenizerOptions {
  std::string type;   // Megatron --tokenizer-type
  std::string model;  // --tokenizer-model: file (or folder for HuggingFaceTokenizer)
  // TikTokenizer: --tiktoken-pattern. "cl100k_base" / "o200k_base" use OpenAI's regex and special
  // tokens at OpenAI's ids; "v1" / "v2" (Megatron's patterns) or a literal regex use Megatron's layout:
  // num_special_tokens ids first (<unk> <s> </s> <SPECIAL_3> ...), then the ranks shifted by that.
  std::string tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  int64_t vocab_size = 0;  // NullTokenizer: required; TikTokenizer (Megatron layout): 0 = all ranks
};

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options);

// The names build_tokenizer accepts, for help texts and error messages.
std::vector<std::string> tokenizer_types();

}  // namespace primus::data
