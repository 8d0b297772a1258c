// Exactness against the reference: our byte-level BPE and the npm `tiktoken` package (WASM build of
// OpenAI's tiktoken) must produce the same ids, token for token, on a few thousand varied lines.
// The package and node come from scripts/setup.sh; without them this test fails, it does not skip.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace primus::data {
namespace {

namespace fs = std::filesystem;
using testing::parse_id_lines;
using testing::run;
using testing::slurp;
using testing::spit;
using testing::temp_dir;

const fs::path kOracle = fs::path(PRIMUS_SOURCE_DIR) / "tests/oracles/tiktoken_oracle.js";

// Lines that stress the pre-tokenizer and the merge loop: scripts, emoji (ZWJ, skin tones), numbers,
// code, contractions in any case, whitespace of every kind (incl. U+00A0, U+3000, U+0085, U+180E),
// case-folding oddities (ſ, K, İ) and long runs that take the heap path.
std::vector<std::string> varied_lines(size_t n) {
  const std::vector<std::string> frags = {
      "the", "The", "THE", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "Hello",
      "I'm", "you're", "they'll", "we've", "he'd", "it's", "DON'T", "It'S", "WE'VE", "l'amour", "rock'n'roll",
      "0", "7", "42", "123", "1234", "12345678901234", "3.14159", "1,000,000", "-17", "1e-9", "0x1F", "v2.0.1",
      "2024-01-15", "12:30:45", "$100", "50%", "#1",
      "café", "naïve", "résumé", "Ärger", "Straße", "ñandú", "Ελληνικά", "Привет", "мир", "שלום", "مرحبا",
      "नमस्ते", "हिन्दी", "日本語", "東京タワー", "中文字符", "한국어", "ภาษาไทย", "Tiếng Việt", "ſ", "K", "İstanbul",
      "ı", "ǅ", "e\u0301", "a\u0308\u0301", "🎉", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "∑", "∫x²dx", "→", "≠", "€", "£",
      "for (int i = 0; i < n; ++i) {", "x->y", "a::b", "std::vector<int>", "def f(x):", "return x**2",
      "if (a && b || !c)", "#include <stdio.h>", "console.log('hi');", "SELECT * FROM t;", "<div class=\"a\">",
      "https://example.com/path?q=1&r=2", "user@example.org", "{\"k\": [1, 2]}", "/* comment */", "// note",
      "...", "!!!", "?!", "---", "***", "(", ")", "[", "]", "\"", "'", "`", "~", "_", "__init__", "@@",
      "<|endoftext|>", "<|fim_prefix|>",
  };
  const std::vector<std::string> seps = {
      " ",      " ",      " ",          "  ",     "   ",     "\t",    "\n",         "\n\n",  "\r\n", " \n ",
      "\u00a0", "\u3000", "\u2003",     "\u0085", "\u180e",  "\u200b", "",          ", ",    ". ",   " - ",
      "\n    ", "\t\t",   "      \n",   "\u2028", "/",       "'",     "'s ",        "\v",    "\f",
  };
  Rng rng(20240611);
  std::vector<std::string> lines;
  for (size_t i = 0; i < n; ++i) {
    std::string s;
    int parts = 1 + static_cast<int>(rng.next_u64() % 30);
    for (int k = 0; k < parts; ++k) {
      s += frags[rng.next_u64() % frags.size()];
      s += seps[rng.next_u64() % seps.size()];
    }
    switch (i % 50) {  // now and then a long run for the heap merge path
      case 7: s += std::string(200 + rng.next_u64() % 300, ' ') + "x"; break;
      case 13: s += std::string(150, '='); break;
      case 21: for (int k = 0; k < 40; ++k) s += "ab"; break;
      case 33: for (int k = 0; k < 30; ++k) s += "日本"; break;
      case 41: s += std::string(100, '\n') + std::string(70, '9'); break;
      default: break;
    }
    lines.push_back(s);
  }
  return lines;
}

void require_oracle() {
  std::string out;
  ASSERT_EQ(run("node --version", out), 0) << "node is missing: run scripts/setup.sh (" << out << ")";
  ASSERT_TRUE(fs::exists(fs::path(PRIMUS_SOURCE_DIR) / "tests/oracles/node_modules/tiktoken/package.json"))
      << "the npm tiktoken package is missing: run scripts/setup.sh (or npm ci in tests/oracles)";
}

// Runs the oracle on `lines`, returns its ids line by line.
std::vector<std::vector<int32_t>> oracle_encode(const std::string& encoding, const std::vector<std::string>& lines,
                                               const fs::path& dir) {
  std::string in;
  for (const auto& l : lines) in += nlohmann::json(l).dump() + "\n";
  spit(dir / "lines.jsonl", in);
  std::string out;
  int rc = run(fmt::format("node '{}' encode {} < '{}' > '{}'", kOracle.string(), encoding,
                           (dir / "lines.jsonl").string(), (dir / "ids.txt").string()),
               out);
  EXPECT_EQ(rc, 0) << out;
  return parse_id_lines(slurp(dir / "ids.txt"));
}

void compare(const Tokenizer& tok, const std::vector<std::string>& lines,
             const std::vector<std::vector<int32_t>>& want) {
  ASSERT_EQ(want.size(), lines.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto got = tok.encode(lines[i]);
    if (got != want[i] && ++mismatches <= 5)
      ADD_FAILURE() << "line " << i << " " << nlohmann::json(lines[i]).dump() << "\n  ours:     "
                    << fmt::format("{}", fmt::join(got, " ")) << "\n  tiktoken: "
                    << fmt::format("{}", fmt::join(want[i], " "));
    EXPECT_EQ(tok.decode(got), lines[i]) << "line " << i;
  }
  EXPECT_EQ(mismatches, 0u) << "of " << lines.size() << " lines";
}

class TiktokenOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(TiktokenOracle, IdenticalToTheNpmPackage) {
  require_oracle();
  const std::string enc = GetParam();
  auto dir = temp_dir();
  std::string out;
  fs::path ranks = dir / (enc + ".tiktoken");
  ASSERT_EQ(run(fmt::format("node '{}' dump {} '{}'", kOracle.string(), enc, ranks.string()), out), 0) << out;
  auto tok = build_tokenizer({.type = "TikTokenizer", .model = ranks.string()});  // pattern from the file name
  auto lines = varied_lines(3000);
  compare(*tok, lines, oracle_encode(enc, lines, dir));
}

INSTANTIATE_TEST_SUITE_P(Encodings, TiktokenOracle, ::testing::Values("cl100k_base", "o200k_base"));

// The same ranks written as a Hugging Face tokenizer.json (as Llama 3's was made from its tiktoken
// file: byte-level vocabulary, merges from every split of every token, ignore_merges) must agree too.
TEST(TiktokenOracle, HuggingFaceJsonOfTheSameRanksAgrees) {
  require_oracle();
  auto dir = temp_dir();
  std::string out;
  fs::path ranks = dir / "cl100k_base.tiktoken";
  ASSERT_EQ(run(fmt::format("node '{}' dump cl100k_base '{}'", kOracle.string(), ranks.string()), out), 0) << out;
  auto ttok = build_tokenizer({.type = "TikTokenizer", .model = ranks.string()});

  // Byte-level spelling of each rank's bytes.
  std::vector<std::string> spelled;
  std::vector<std::string> by_rank;
  for (int32_t r = 0;; ++r) {
    std::string bytes = ttok->decode(std::vector<int32_t>{r});
    if (r >= 100256) break;
    by_rank.push_back(bytes);
  }
  std::array<std::string, 256> ch;
  {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool d = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      int cp = d ? b : 256 + n++;
      ch[b] = cp < 0x80 ? std::string(1, char(cp))
                        : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    }
  }
  auto spell = [&](const std::string& bytes) {
    std::string s;
    for (unsigned char c : bytes) s += ch[c];
    return s;
  };
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  std::unordered_map<std::string, int32_t> rank;
  for (int32_t r = 0; r < static_cast<int32_t>(by_rank.size()); ++r) {
    vocab[spell(by_rank[r])] = r;
    rank[by_rank[r]] = r;
  }
  for (int32_t r = 256; r < static_cast<int32_t>(by_rank.size()); ++r) {
    const std::string& t = by_rank[r];
    std::vector<std::pair<int32_t, int32_t>> splits;
    for (size_t k = 1; k < t.size(); ++k) {
      auto a = rank.find(t.substr(0, k)), b = rank.find(t.substr(k));
      if (a != rank.end() && b != rank.end()) splits.emplace_back(a->second, b->second);
    }
    std::sort(splits.begin(), splits.end());
    for (auto [a, b] : splits) merges.push_back(spell(by_rank[a]) + " " + spell(by_rank[b]));
  }
  nlohmann::json j = {
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", nlohmann::json::array({{{"type", "Split"},
                                                  {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                                                  {"behavior", "Isolated"},
                                                  {"invert", false}},
                                                 {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merges}}}};
  spit(dir / "tokenizer.json", j.dump());
  auto htok = build_tokenizer({.type = "HuggingFaceTokenizer", .model = (dir / "tokenizer.json").string()});
  auto lines = varied_lines(1000);
  compare(*htok, lines, oracle_encode("cl100k_base", lines, dir));
}

}  // namespace
}  // namespace primus::data
