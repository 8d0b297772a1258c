// Hostile but realistic inputs shared by the tests of issue 32: a tokenizer.json whose normalizer
// is a Sequence nested thousands of levels deep (50,000 levels, 1.6 MB, killed `data preprocess`,
// `checkpoint import` and `train pretrain` with SIGSEGV before the JSON depth was bounded).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace primus::test {

// A byte-level tokenizer.json (GPT-2's byte-to-character table, one token per byte, no merges) whose
// normalizer is `depth` Sequences inside each other around one NFC step; depth 0: no normalizer.
// Built as text, so that no recursion over the nesting is needed to write it.
inline std::string nested_normalizer_tokenizer_json(int depth) {
  nlohmann::json vocab = nlohmann::json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const unsigned cp = direct ? unsigned(b) : unsigned(256 + n++);
    std::string u;
    if (cp < 0x80) u += char(cp);
    else u += char(0xC0 | (cp >> 6)), u += char(0x80 | (cp & 0x3F));
    vocab[u] = b;
  }
  const nlohmann::json tok = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                              {"normalizer", "@@"},
                              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                              {"decoder", {{"type", "ByteLevel"}}},
                              {"added_tokens", nlohmann::json::array()}};
  std::string nested;
  if (depth == 0) {
    nested = "null";
  } else {
    nested.reserve(size_t(depth) * 40);
    for (int i = 0; i < depth; ++i) nested += R"({"type":"Sequence","normalizers":[)";
    nested += R"({"type":"NFC"})";
    for (int i = 0; i < depth; ++i) nested += "]}";
  }
  std::string text = tok.dump();
  text.replace(text.find("\"@@\""), 4, nested);
  return text;
}

// Writes it as <dir>/tokenizer.json; returns the file's path.
inline std::string write_nested_normalizer_tokenizer(const std::filesystem::path& dir, int depth) {
  std::filesystem::create_directories(dir);
  const auto path = dir / "tokenizer.json";
  std::ofstream(path) << nested_normalizer_tokenizer_json(depth);
  return path.string();
}

}  // namespace primus::test
