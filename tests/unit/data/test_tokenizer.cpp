#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sentencepiece_trainer.h>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace primus::data {
namespace {

using testing::slurp;
using testing::spit;
using testing::temp_dir;
using Ids = std::vector<int32_t>;

std::string b64(const std::string& s) {
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], a[v & 63]};
  }
  if (s.size() - i == 1) {
    uint32_t v = uint8_t(s[i]) << 16;
    out += {a[v >> 18], a[(v >> 12) & 63], '=', '='};
  } else if (s.size() - i == 2) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], '='};
  }
  return out;
}

// A rank file with the 256 bytes and a few merges on top.
std::string tiny_ranks(const std::vector<std::string>& extra) {
  std::string out;
  int r = 0;
  for (int b = 0; b < 256; ++b) out += b64(std::string(1, char(b))) + " " + std::to_string(r++) + "\n";
  for (const auto& t : extra) out += b64(t) + " " + std::to_string(r++) + "\n";
  return out;
}

TEST(Tokenizer, ByteLevelRoundTripsAnyText) {
  auto tok = build_tokenizer({.type = "ByteLevelTokenizer"});
  std::string text = "héllo, 世界 🎉\n\t\x01";
  Ids ids = tok->encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_EQ(tok->eod(), 258);
  EXPECT_EQ(tok->bos(), 257);
  EXPECT_EQ(tok->pad(), 256);
  EXPECT_THROW(tok->decode(Ids{259}), Error);
}

TEST(Tokenizer, NullTokenizerParsesIds) {
  auto tok = build_tokenizer({.type = "NullTokenizer", .vocab_size = 100});
  EXPECT_EQ(tok->encode("1 2 99"), (Ids{1, 2, 99}));
  EXPECT_EQ(tok->decode(Ids{1, 2, 99}), "1 2 99");
  EXPECT_EQ(tok->vocab_size(), 101);
  EXPECT_EQ(tok->eod(), 100);
  EXPECT_THROW(tok->encode("1 x"), Error);
  EXPECT_THROW(tok->encode("100"), Error);
}

TEST(Tokenizer, TikTokenMergesByRankAndLooksUpWholePieces) {
  auto dir = temp_dir();
  spit(dir / "tiny.tiktoken", tiny_ranks({"ab", "abc", " a"}));
  auto tok = build_tokenizer({.type = "TikTokenizer", .model = (dir / "tiny.tiktoken").string(),
                              .tiktoken_pattern = "gpt2"});
  // "abc" is a whole token; " abd" -> " a"(258) beats "ab"(256)? No: rank 256 < 258, so a+b merge first.
  EXPECT_EQ(tok->encode("abc"), (Ids{257}));
  EXPECT_EQ(tok->encode(" abd"), (Ids{' ', 256, 'd'}));
  EXPECT_EQ(tok->encode(" ax"), (Ids{258, 'x'}));
  EXPECT_EQ(tok->decode(tok->encode("abc abd, xyz!")), "abc abd, xyz!");
  // OpenAI layout under the gpt2 name: <|endoftext|> is 50256, past these ranks.
  EXPECT_EQ(tok->eod(), 50256);
}

TEST(Tokenizer, TikTokenMegatronLayoutShiftsRanksBehindSpecialTokens) {
  auto dir = temp_dir();
  spit(dir / "tiny.tiktoken", tiny_ranks({"ab"}));
  auto tok = build_tokenizer({.type = "TikTokenizer", .model = (dir / "tiny.tiktoken").string(),
                              .tiktoken_pattern = "v2", .tiktoken_num_special_tokens = 10});
  EXPECT_EQ(tok->vocab_size(), 10 + 257);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_EQ(tok->encode("ab"), (Ids{10 + 256}));
  EXPECT_EQ(tok->encode("a"), (Ids{10 + 'a'}));
  EXPECT_EQ(tok->decode(Ids{10 + 256, 2}), "ab</s>");
}

TEST(Tokenizer, TikTokenRejectsBadFiles) {
  auto dir = temp_dir();
  try {
    build_tokenizer({.type = "TikTokenizer", .model = (dir / "missing.tiktoken").string(), .tiktoken_pattern = "gpt2"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.tiktoken"), std::string::npos) << e.what();
  }
  spit(dir / "bad.tiktoken", "IQ== 0\nIg== 5\n");
  try {
    build_tokenizer({.type = "TikTokenizer", .model = (dir / "bad.tiktoken").string(), .tiktoken_pattern = "gpt2"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  spit(dir / "ok.tiktoken", tiny_ranks({}));
  EXPECT_THROW(build_tokenizer({.type = "TikTokenizer", .model = (dir / "ok.tiktoken").string()}), Error)
      << "no pattern given and the file name names none";
  EXPECT_THROW(build_tokenizer({.type = "TikTokenizer", .model = (dir / "ok.tiktoken").string(),
                                .tiktoken_pattern = "(unclosed"}),
               Error);
}

// GPT-2's byte <-> character table, as tokenizer.json files spell their vocabularies.
std::string byte_char(int b) {
  std::vector<int> direct;
  int n = 0, cp = -1;
  for (int x = 0; x < 256; ++x) {
    bool d = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
    int c = d ? x : 256 + n++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) s += char(cp);
  else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  return s;
}

std::filesystem::path write_tiny_hf(const std::filesystem::path& dir) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  std::string G = byte_char(' ');
  vocab["ll"] = 256, vocab["he"] = 257, vocab["hell"] = 258, vocab["hello"] = 259, vocab[G + "w"] = 260;
  json j = {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 261}, {"content", "<|bos|>"}, {"special", true}},
                                    {{"id", 262}, {"content", "<|eos|>"}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {261}}, {"tokens", {"<|bos|>"}}}}}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({"l l", "h e", "he ll", "hell o", G + " w"})}}}};
  spit(dir / "tokenizer.json", j.dump());
  spit(dir / "tokenizer_config.json", R"({"bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>"}})");
  return dir / "tokenizer.json";
}

TEST(Tokenizer, HuggingFaceByteLevelBpe) {
  auto dir = temp_dir();
  write_tiny_hf(dir);
  auto tok = build_tokenizer({.type = "HuggingFaceTokenizer", .model = dir.string()});  // a folder works too
  EXPECT_EQ(tok->vocab_size(), 263);
  EXPECT_EQ(tok->bos(), 261);
  EXPECT_EQ(tok->eos(), 262);
  // Template adds BOS; merges apply by rank; the added token is matched in the raw text.
  EXPECT_EQ(tok->encode("hello world<|eos|>"), (Ids{261, 259, 260, 'o', 'r', 'l', 'd', 262}));
  EXPECT_EQ(tok->decode(tok->encode("hello world<|eos|>")), "<|bos|>hello world<|eos|>");
  std::string text = "Größe: 42 — ok?";
  Ids ids = tok->encode(text);
  EXPECT_EQ(tok->decode(std::span<const int32_t>(ids).subspan(1)), text);
}

TEST(Tokenizer, HuggingFaceGpt2StyleByteLevelPreTokenizer) {
  // GPT-2's tokenizer.json: ByteLevel alone (its use_regex means GPT-2's regex), here with a prefix space.
  auto dir = temp_dir();
  auto path = write_tiny_hf(dir);
  auto j = nlohmann::json::parse(testing::slurp(path));
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"trim_offsets", true}};
  spit(path, j.dump());
  auto tok = build_tokenizer({.type = "HuggingFaceTokenizer", .model = path.string()});
  EXPECT_EQ(tok->encode("hello world"), (Ids{' ', 259, 260, 'o', 'r', 'l', 'd'}));
}

TEST(Tokenizer, HuggingFaceRejectsWhatItCannotRead) {
  auto dir = temp_dir();
  spit(dir / "tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  try {
    build_tokenizer({.type = "HuggingFaceTokenizer", .model = (dir / "tokenizer.json").string()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Unigram"), std::string::npos) << e.what();
  }
  spit(dir / "tokenizer.json", "{not json");
  EXPECT_THROW(build_tokenizer({.type = "HuggingFaceTokenizer", .model = (dir / "tokenizer.json").string()}), Error);
}

TEST(Tokenizer, SentencePieceModels) {
  auto dir = temp_dir();
  std::string corpus;
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "cat", "runs", "far"};
  for (int i = 0; i < 400; ++i) {
    for (int k = 0; k < 8; ++k) corpus += std::string(words[(i * 7 + k * 5) % 12]) + " ";
    corpus += "\n";
  }
  spit(dir / "corpus.txt", corpus);
  auto st = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir / "corpus.txt").string() + " --model_prefix=" + (dir / "sp").string() +
      " --vocab_size=300 --hard_vocab_limit=false --model_type=bpe --character_coverage=1.0 --byte_fallback=true --minloglevel=2"
      " --num_threads=1");
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::string model = (dir / "sp.model").string();

  auto gpt = build_tokenizer({.type = "GPTSentencePieceTokenizer", .model = model});
  auto llama = build_tokenizer({.type = "Llama2Tokenizer", .model = model});
  std::string text = "the quick brown fox, ünïcode 123";
  Ids a = gpt->encode(text), b = llama->encode(text);
  EXPECT_EQ(gpt->decode(a), text);
  ASSERT_EQ(b.size(), a.size() + 1);
  EXPECT_EQ(b[0], llama->bos());
  EXPECT_EQ(Ids(b.begin() + 1, b.end()), a);
  EXPECT_EQ(llama->eod(), llama->eos());

  // Megatron's SentencePieceTokenizer adds <CLS> <SEP> <EOD> <MASK> past the model's pieces, and
  // <PAD> too when the model has no pad piece (this one has none).
  auto sp = build_tokenizer({.type = "SentencePieceTokenizer", .model = model});
  EXPECT_EQ(gpt->pad(), -1);
  EXPECT_EQ(sp->vocab_size(), gpt->vocab_size() + 5);
  Ids c = sp->encode("the fox<EOD>dog");
  EXPECT_NE(std::find(c.begin(), c.end(), sp->eod()), c.end());
  EXPECT_GE(sp->eod(), gpt->vocab_size());

  try {
    build_tokenizer({.type = "Llama2Tokenizer", .model = (dir / "nope.model").string()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.model"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnknownTypeListsTheKnownOnes) {
  try {
    build_tokenizer({.type = "GPT3Tokenizer"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HuggingFaceTokenizer"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, InvalidUtf8IsAnErrorForRegexTokenizers) {
  auto dir = temp_dir();
  spit(dir / "tiny.tiktoken", tiny_ranks({}));
  auto tok = build_tokenizer({.type = "TikTokenizer", .model = (dir / "tiny.tiktoken").string(),
                              .tiktoken_pattern = "gpt2"});
  EXPECT_THROW(tok->encode(std::string("ok \xff\xfe")), Error);
  EXPECT_EQ(find_invalid_utf8("a\xc3\xa9"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("a\xc0\xaf"), 1u);  // overlong
  EXPECT_EQ(find_invalid_utf8("ab\xed\xa0\x80"), 2u);  // surrogate
}

TEST(Bpe, LongPiecesMergeLikeShortOnes) {
  // The heap path (pieces > 64 bytes) must agree with the rescan path: compare a long piece with the
  // concatenation of its parts where no merge crosses the cut ('|' never merges).
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, char(b)));
  for (std::string t : {"ab", "abab", "ba", "aab", "bb", "abb", "aa", "aaaa"}) toks.push_back(t);
  auto bpe = BytePairEncoder::from_ranks(toks, 0, static_cast<int32_t>(toks.size()));
  std::string unit = "aababbabaaaabbbab";
  std::vector<int32_t> one;
  bpe->encode_piece(unit, one);
  std::string long_piece;
  std::vector<int32_t> expect;
  for (int i = 0; i < 10; ++i) {
    long_piece += unit + "|";
    expect.insert(expect.end(), one.begin(), one.end());
    expect.push_back('|');
  }
  std::vector<int32_t> got;
  bpe->encode_piece(long_piece, got);
  EXPECT_EQ(got, expect);
}

}  // namespace
}  // namespace primus::data
