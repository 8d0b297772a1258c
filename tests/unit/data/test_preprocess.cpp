#include <gtest/gtest.h>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace primus::data {
namespace {

namespace fs = std::filesystem;
using testing::run;
using testing::slurp;
using testing::spit;
using testing::temp_dir;

std::string corpus(int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += fmt::format(R"({{"text": "doc {} says héllo {}", "title": "t{}", "id": {}}})", i, std::string(i % 7, 'x'), i,
                     i) + "\n";
  return s;
}

PreprocessOptions opts(const fs::path& dir, const std::string& out = "out") {
  PreprocessOptions o;
  o.input = (dir / "in.jsonl").string();
  o.output_prefix = (dir / out).string();
  o.log_interval_s = 0;
  return o;
}

TEST(Preprocess, DocumentsAndEodLikeMegatron) {
  auto dir = temp_dir();
  spit(dir / "in.jsonl", "{\"text\": \"ab\"}\n\n{\"text\": \"\"}\n{\"text\": [\"cd\", \"e\"]}\n");
  auto tok = build_tokenizer({.type = "ByteLevelTokenizer"});
  auto o = opts(dir);
  o.append_eod = true;
  auto st = preprocess(o, *tok);
  EXPECT_EQ(st.documents, 3);
  EXPECT_EQ(st.empty, 1);
  ASSERT_EQ(st.outputs.size(), 1u);
  EXPECT_EQ(st.outputs[0], (dir / "out_text_document").string());
  IndexedDataset ds(st.outputs[0]);
  EXPECT_EQ(ds.dtype(), TokenDType::u16);
  // "ab"+eod; "" (no sequences, no eod); ["cd", "e"+eod] as two sequences of one document.
  ASSERT_EQ(ds.num_sequences(), 3u);
  EXPECT_EQ(ds.get(0), (std::vector<int32_t>{'a', 'b', 258}));
  EXPECT_EQ(ds.get(1), (std::vector<int32_t>{'c', 'd'}));
  EXPECT_EQ(ds.get(2), (std::vector<int32_t>{'e', 258}));
  EXPECT_EQ(std::vector<int64_t>(ds.document_indices().begin(), ds.document_indices().end()),
            (std::vector<int64_t>{0, 1, 1, 3}));
}

TEST(Preprocess, WorkersGiveIdenticalOutputInOrder) {
  auto dir = temp_dir();
  spit(dir / "in.jsonl", corpus(3000));
  auto tok = build_tokenizer({.type = "ByteLevelTokenizer"});
  auto o1 = opts(dir, "one");
  o1.batch_bytes = 4096;  // many batches, so ordering across workers is exercised
  o1.json_keys = {"text", "title"};
  auto o3 = o1;
  o3.output_prefix = (dir / "three").string();
  o3.workers = 3;
  auto s1 = preprocess(o1, *tok);
  auto s3 = preprocess(o3, *tok);
  EXPECT_EQ(s1.documents, 3000);
  EXPECT_EQ(s1.tokens, s3.tokens);
  for (const char* key : {"text", "title"}) {
    for (const char* ext : {".bin", ".idx"}) {
      std::string a = slurp(document_prefix(o1.output_prefix, key) + ext);
      EXPECT_FALSE(a.empty());
      EXPECT_EQ(a, slurp(document_prefix(o3.output_prefix, key) + ext)) << key << ext;
    }
  }
  IndexedDataset ds(document_prefix(o1.output_prefix, "text"));
  EXPECT_EQ(tok->decode(ds.get(2999)), "doc 2999 says héllo xxx");
}

TEST(Preprocess, MalformedLineIsNamedOrSkipped) {
  auto dir = temp_dir();
  std::string text = corpus(5);
  text += "{\"text\": \"broken\n";  // line 6
  text += corpus(2);
  text += "{\"title\": \"no text key\"}\n";  // line 9
  text += "{\"text\": 17}\n";                // line 10
  spit(dir / "in.jsonl", text);
  auto tok = build_tokenizer({.type = "ByteLevelTokenizer"});
  auto o = opts(dir);
  o.workers = 2;
  try {
    preprocess(o, *tok);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("in.jsonl:6:"), std::string::npos) << m;
    EXPECT_NE(m.find("--skip-bad"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir / "out_text_document.idx")) << "a failed run leaves no dataset";
  o.skip_bad = true;
  auto st = preprocess(o, *tok);
  EXPECT_EQ(st.skipped, 3);
  EXPECT_EQ(st.documents, 7);
  EXPECT_EQ(IndexedDataset(st.outputs[0]).num_sequences(), 7u);

  spit(dir / "in.jsonl", corpus(3) + "{\"title\": \"x\"}\n");
  o.skip_bad = false;
  try {
    preprocess(o, *tok);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in.jsonl:4: no key 'text'"), std::string::npos) << e.what();
  }
}

TEST(Preprocess, MissingInputIsNamed) {
  auto dir = temp_dir();
  auto tok = build_tokenizer({.type = "ByteLevelTokenizer"});
  auto o = opts(dir);
  try {
    preprocess(o, *tok);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in.jsonl"), std::string::npos) << e.what();
  }
}

TEST(Preprocess, CommandLine) {
  auto dir = temp_dir();
  spit(dir / "in.jsonl", corpus(10));
  std::string out;
  std::string cli = PRIMUS_CLI_PATH;
  int rc = run(fmt::format("{} direct --workspace {} -- data preprocess --input {} --output-prefix {} "
                           "--tokenizer-type ByteLevelTokenizer --append-eod --workers 2 --log-interval 0",
                           cli, (dir / "runs").string(), (dir / "in.jsonl").string(), (dir / "cli").string()),
               out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("10 documents"), std::string::npos) << out;
  EXPECT_EQ(IndexedDataset((dir / "cli_text_document").string()).num_sequences(), 10u);

  rc = run(fmt::format("{} direct --workspace {} -- data inspect --prefix {} --tokenizer-type ByteLevelTokenizer "
                       "--show 1",
                       cli, (dir / "runs").string(), (dir / "cli_text_document").string()),
           out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("10 sequences"), std::string::npos) << out;
  EXPECT_NE(out.find("doc 0 says"), std::string::npos) << out;

  spit(dir / "bad.jsonl", corpus(2) + "nope\n");
  rc = run(fmt::format("{} direct --workspace {} -- data preprocess --input {} --output-prefix {} "
                       "--tokenizer-type ByteLevelTokenizer",
                       cli, (dir / "runs").string(), (dir / "bad.jsonl").string(), (dir / "bad").string()),
           out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("error: "), std::string::npos) << out;
  EXPECT_NE(out.find("bad.jsonl:3"), std::string::npos) << out;
}

// Found by fuzz_jsonl_line: a number too large for a double escaped as nlohmann's out_of_range,
// not as a primus::Error naming the line; every malformed line is now the same clear error.
TEST(Preprocess, AnOverflowingNumberIsAMalformedLine) {
  auto tok = build_tokenizer({"ByteLevelTokenizer", ""});
  try {
    encode_jsonl_line(R"({"text": "a", "n": 1e999999})", {"text"}, *tok, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos) << e.what();
  }
  EXPECT_EQ(encode_jsonl_line(R"({"text": "ab"})", {"text"}, *tok, false).at(0).at(0).size(), 2u);
}

}  // namespace
}  // namespace primus::data
