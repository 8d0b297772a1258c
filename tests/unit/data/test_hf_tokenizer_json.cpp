// tokenizer.json features on small hand-written files: SentencePiece-style BPE with byte fallback
// and unknown tokens, the normalizers, Metaspace, decoding, and the errors for what is not read.
// (Real files against transformers.js: test_hf_tokenizer_oracle.cpp.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/normalizer.h"
#include "data/tokenizer.h"
#include "support/error_of.h"
#include "support/hostile_files.h"
#include "test_util.h"

namespace primus::data {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
using testing::spit;
using testing::temp_dir;

// A SentencePiece-style vocabulary: <unk> <s> </s>, byte tokens for 'A' (0x41) and the bytes of
// 'é' (0xC3 0xA9), then characters and merges ▁h ▁he ll ▁hell ▁hello.
json sp_tokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1},  {"</s>", 2},  {"<0x41>", 3}, {"<0xC3>", 4},  {"<0xA9>", 5},
                {"\u2581", 6}, {"h", 7},   {"e", 8},     {"l", 9},      {"o", 10},     {"\u2581h", 11},
                {"\u2581he", 12}, {"ll", 13}, {"\u2581hell", 14}, {"\u2581hello", 15}, {"w", 16}};
  return {{"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                        {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                        {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                      {{"type", "ByteFallback"}},
                                      {{"type", "Fuse"}},
                                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", {"\u2581 h", "\u2581h e", "l l", "\u2581he ll", "\u2581hell o"}}}}};
}

std::unique_ptr<Tokenizer> load(const json& j) {
  auto dir = temp_dir();
  spit(dir / "tokenizer.json", j.dump());
  return build_tokenizer({.type = "HuggingFaceTokenizer", .model = (dir / "tokenizer.json").string()});
}

std::string load_error(const json& j) {
  return test::error_of([&] { load(j); });
}

TEST(HfTokenizerJson, SentencePieceStyleBpeWithByteFallback) {
  auto tok = load(sp_tokenizer());
  // "hello": ▁hello after the merges; BOS from the template.
  EXPECT_EQ(tok->encode("hello"), (Ids{1, 15}));
  // 'A' is no token: its byte token; 'é' neither: the tokens of its two bytes.
  EXPECT_EQ(tok->encode("hA"), (Ids{1, 11, 3}));
  EXPECT_EQ(tok->encode("hé"), (Ids{1, 11, 4, 5}));
  // 'z' and 'q' have no byte tokens: <unk>, two in a row fused into one.
  EXPECT_EQ(tok->encode("hzqw"), (Ids{1, 11, 0, 16}));
  // Each stretch between added tokens is normalized on its own: "▁" is prepended to both.
  EXPECT_EQ(tok->encode("hello</s>hello"), (Ids{1, 15, 2, 15}));
  // Decoding: ▁ back to spaces, byte tokens to bytes, the one leading space stripped.
  EXPECT_EQ(tok->decode(Ids{15, 11, 4, 5}), "hello hé");
  EXPECT_EQ(tok->decode(Ids{15, 6, 11}), "hello  h");
  // As the HF library: special tokens decode as their text, and the strip sees "<" first.
  EXPECT_EQ(tok->decode(tok->encode("hello hé")), "<s> hello hé");
}

TEST(HfTokenizerJson, WithoutByteFallbackUnknownCharactersAreUnk) {
  json j = sp_tokenizer();
  j["model"]["byte_fallback"] = false;
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(load(j)->encode("hAA"), (Ids{1, 11, 0, 0}));
  j["model"]["unk_token"] = nullptr;
  const std::string e = test::error_of([&] { load(j)->encode("hA"); });
  EXPECT_NE(e.find("no unknown token"), std::string::npos) << e;
}

TEST(HfTokenizerJson, MetaspacePreTokenizer) {
  json j = sp_tokenizer();
  j["normalizer"] = nullptr;
  // "first": the marker starts the input only, not the text after an added token; split: each
  // marker starts a piece, so no merge crosses one.
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}};
  auto tok = load(j);
  EXPECT_EQ(tok->encode("hello hello"), (Ids{1, 15, 15}));
  EXPECT_EQ(tok->encode("</s>hello"), (Ids{1, 2, 7, 8, 13, 10}));
  j["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_EQ(load(j)->encode("</s>hello"), (Ids{1, 2, 15}));
  j["pre_tokenizer"]["add_prefix_space"] = false;  // the legacy key: false means never
  EXPECT_EQ(load(j)->encode("hello"), (Ids{1, 7, 8, 13, 10}));
}

// Split's behaviors decide where pieces end, which decides which merges can happen: with merges
// "a -", "- a", "- -", the text "a-a--a" comes out differently for each.
TEST(HfTokenizerJson, SplitBehaviors) {
  json j = {{"model",
             {{"type", "BPE"},
              {"unk_token", "<unk>"},
              {"vocab", {{"<unk>", 0}, {"a", 1}, {"-", 2}, {"a-", 3}, {"-a", 4}, {"--", 5}}},
              {"merges", {"a -", "- a", "- -"}}}},
            {"added_tokens", json::array()}};
  auto ids = [&](const std::string& behavior, bool invert = false) {
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", invert ? "a" : "-"}}}, {"behavior", behavior},
                          {"invert", invert}};
    return load(j)->encode("a-a--a");
  };
  EXPECT_EQ(ids("Isolated"), (Ids{1, 2, 1, 2, 2, 1}));
  EXPECT_EQ(ids("Removed"), (Ids{1, 1, 1}));
  EXPECT_EQ(ids("MergedWithPrevious"), (Ids{3, 3, 2, 1}));  // a- a- - a
  EXPECT_EQ(ids("MergedWithNext"), (Ids{1, 4, 2, 4}));      // a -a - -a
  EXPECT_EQ(ids("Contiguous"), (Ids{1, 2, 1, 5, 1}));       // a - a -- a
  // invert: the text between the matches of "a" is the delimiter: pieces a- a-- a.
  EXPECT_EQ(ids("MergedWithPrevious", true), (Ids{3, 3, 2, 1}));
}

TEST(HfTokenizerJson, Normalizers) {
  EXPECT_EQ(unicode_normalize("cafe\u0301", "NFC"), "caf\u00e9");
  EXPECT_EQ(unicode_normalize("caf\u00e9", "NFD"), "cafe\u0301");
  EXPECT_EQ(unicode_normalize("\ufb01 \uff21 \u2460 x\u00b2", "NFKC"), "fi A 1 x2");
  EXPECT_EQ(unicode_normalize("plain ascii", "NFKC"), "plain ascii");
  const auto seq = TextNormalizer::from_json(json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "NFKC"}, {"type": "Replace", "pattern": {"String": "fi"}, "content": "FI"}, {"type": "Prepend", "prepend": ">"}]})"),
                                             "test");
  EXPECT_EQ(seq.apply("\ufb01ne"), ">FIne");
  EXPECT_EQ(seq.apply(""), "");  // Prepend never makes text out of nothing
  EXPECT_TRUE(TextNormalizer::from_json(json::parse(R"({"type": "Sequence", "normalizers": []})"), "t").identity());
  EXPECT_TRUE(TextNormalizer::from_json(json(), "t").identity());
}

TEST(HfTokenizerJson, WhatIsNotReadIsRefusedByName) {
  json j = sp_tokenizer();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(load_error(j).find("normalizer 'BertNormalizer'"), std::string::npos);
  j = sp_tokenizer();
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}};
  EXPECT_NE(load_error(j).find("regex pattern"), std::string::npos);
  j = sp_tokenizer();
  j["added_tokens"][1]["lstrip"] = true;
  EXPECT_NE(load_error(j).find("lstrip"), std::string::npos);
  j = sp_tokenizer();
  j["added_tokens"][1]["normalized"] = true;
  EXPECT_NE(load_error(j).find("after normalization"), std::string::npos);
  j = sp_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
  EXPECT_NE(load_error(j).find("behavior 'Sideways'"), std::string::npos);
  j = sp_tokenizer();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(load_error(j).find("'Whitespace'"), std::string::npos);
  j = sp_tokenizer();
  j["model"]["unk_token"] = "<nope>";
  EXPECT_NE(load_error(j).find("<nope>"), std::string::npos);
  j = sp_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_error(j).find("decoder 'WordPiece'"), std::string::npos);
}

// Issue 32: a normalizer Sequence nested 50,000 deep (1.6 MB) killed the reader with SIGSEGV
// (20,000 worked). Nesting is bounded when the file is parsed; each component's steps are walked
// without recursion and counted.
TEST(HfTokenizerJson, DeepOrHugeComponentsAreRefusedByName) {
  const auto dir = temp_dir();
  const std::string deep = test::write_nested_normalizer_tokenizer(dir / "deep", 50'000);
  EXPECT_GT(std::filesystem::file_size(deep), 1'500'000u);
  std::string e = test::error_of([&] { build_tokenizer({.type = "HuggingFaceTokenizer", .model = deep}); });
  EXPECT_NE(e.find("nests objects and arrays more than 64 levels deep"), std::string::npos) << e;
  EXPECT_NE(e.find("deep/tokenizer.json"), std::string::npos) << e;
  // The same file 20 levels deep is a real (if odd) tokenizer: it loads and normalizes.
  const auto ok = build_tokenizer(
      {.type = "HuggingFaceTokenizer", .model = test::write_nested_normalizer_tokenizer(dir / "ok", 20)});
  EXPECT_EQ(ok->decode(ok->encode("e\xcc\x81")), "\xc3\xa9");  // NFC: e + combining acute is é
  // Every component: pre-tokenizer, decoder, post-processor.
  for (const auto& [key, list] : {std::pair<std::string, std::string>{"pre_tokenizer", "pretokenizers"},
                                  {"decoder", "decoders"},
                                  {"post_processor", "processors"}}) {
    json j = sp_tokenizer();
    json node = {{"type", "Fuse"}};
    for (int i = 0; i < 100; ++i) node = {{"type", "Sequence"}, {list, json::array({node})}};
    j[key] = node;
    EXPECT_NE(load_error(j).find("more than 64 levels deep"), std::string::npos) << key;
  }
  // A flat Sequence of thousands of steps: each would run on every text encoded.
  json j = sp_tokenizer();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int i = 0; i < 2000; ++i) j["normalizer"]["normalizers"].push_back({{"type", "NFC"}});
  e = load_error(j);
  EXPECT_NE(e.find("normalizer has more than 1024 steps"), std::string::npos) << e;
  j = sp_tokenizer();
  j["normalizer"] = {{"type", "Sequence"}};
  EXPECT_NE(load_error(j).find("a Sequence needs a \"normalizers\" list"), std::string::npos);
  j = sp_tokenizer();
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {"Fuse"}}};
  EXPECT_NE(load_error(j).find("decoder: a step must be an object"), std::string::npos);
}

}  // namespace
}  // namespace primus::data
