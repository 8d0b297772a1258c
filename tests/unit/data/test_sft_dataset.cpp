// SFT data sets (data/sft_dataset.h): records from JSONL, JSON lists and JSON objects of splits,
// samples padded or truncated to seq_length + 1 with the padding out of the loss, seeded epochs,
// and the microbatch's targets of -1 wherever the mask leaves a token out (data/microbatch.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/microbatch.h"
#include "data/sft_dataset.h"
#include "data/tokenizer.h"
#include "support/error_of.h"
#include "test_util.h"

namespace primus::data {
namespace {

using testing::spit;
using testing::bytes;
using testing::temp_dir;

TEST(SftRecords, JsonlJsonListAndSplits) {
  const auto dir = temp_dir();
  spit(dir / "a.jsonl", "{\"prompt\": \"p1\", \"response\": \"r1\"}\n\n{\"prompt\": \"p2\", \"response\": \"r2\"}\n");
  SftRecords r = read_sft_records((dir / "a.jsonl").string(), "train");
  ASSERT_EQ(r.records.size(), 2u);
  EXPECT_EQ(r.where[1], (dir / "a.jsonl").string() + ":3");  // the blank line counts
  spit(dir / "b.json", R"([{"prompt": "p", "response": "r"}])");
  EXPECT_EQ(read_sft_records((dir / "b.json").string(), "train").records.size(), 1u);
  spit(dir / "c.json", R"({"train": [{"prompt": "p", "response": "r"}, {"prompt": "q", "response": "s"}],
                          "validation": [{"prompt": "v", "response": "w"}]})");
  EXPECT_EQ(read_sft_records((dir / "c.json").string(), "train").records.size(), 2u);
  EXPECT_EQ(read_sft_records((dir / "c.json").string(), "validation").records.size(), 1u);
  EXPECT_NE(test::error_of([&] {
              read_sft_records((dir / "c.json").string(), "test");
            }).find("has no split 'test' (sft_dataset_split); its splits: train, validation"),
            std::string::npos);
  EXPECT_TRUE(read_sft_records((dir / "c.json").string(), "test", /*optional=*/true).records.empty());
  // A JSONL file or a JSON list is the training split alone: no validation split beside it.
  EXPECT_TRUE(read_sft_records((dir / "a.jsonl").string(), "validation", /*optional=*/true).records.empty());
  EXPECT_TRUE(read_sft_records((dir / "b.json").string(), "validation", /*optional=*/true).records.empty());
  EXPECT_EQ(read_sft_records((dir / "c.json").string(), "validation", /*optional=*/true).records.size(), 1u);
  spit(dir / "bad.jsonl", "{\"prompt\": \"p\", \"response\": \"r\"}\n{oops\n");
  EXPECT_NE(test::error_of([&] {
              read_sft_records((dir / "bad.jsonl").string(), "train");
            }).find("bad.jsonl:2: not a JSON"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              read_sft_records("tatsu-lab/alpaca", "train");
            }).find("sft_dataset_name 'tatsu-lab/alpaca' is not a local file"),
            std::string::npos);
}

SftRecords records(std::initializer_list<const char*> lines) {
  SftRecords r;
  int n = 0;
  for (const char* l : lines) {
    r.records.push_back(nlohmann::ordered_json::parse(l));
    r.where.push_back("mem:" + std::to_string(++n));
  }
  return r;
}

TEST(SftDataset, PadsTruncatesAndMasks) {
  const auto tok = bytes();
  const auto squad = fixed_chat_format(ChatFormatName::Squad);
  // "Context:  Question: q Answer: ab" + eos = 33 tokens.
  const SftRecords rs = records({R"({"question": "q", "answer": "ab"})"});
  SftDataset short_ds(rs, *squad, *tok, {.seq_length = 40, .num_samples = 0, .seed = 1});
  std::vector<int32_t> s = short_ds.get(0);
  std::vector<uint8_t> m = short_ds.loss_mask(0);
  ASSERT_EQ(s.size(), 41u);
  ASSERT_EQ(m.size(), 41u);
  EXPECT_EQ(short_ds.truncated(), 0);
  EXPECT_EQ(std::count(m.begin(), m.end(), 1), 4);  // " ab" and eos
  EXPECT_TRUE(m[29] && m[30] && m[31] && m[32]);
  EXPECT_EQ(s[32], tok->eos());
  for (size_t i = 33; i < s.size(); ++i) EXPECT_FALSE(m[i]) << i;  // padding is out of the loss
  // 30 + 1 tokens keep the prompt and " a" of the answer.
  SftDataset cut(rs, *squad, *tok, {.seq_length = 30, .num_samples = 0, .seed = 1});
  EXPECT_EQ(cut.truncated(), 1);
  EXPECT_EQ(cut.get(0).size(), 31u);
  const auto cm = cut.loss_mask(0);
  EXPECT_EQ(std::count(cm.begin(), cm.end(), 1), 2);
  // 20 + 1 tokens keep the prompt only: a data set where no answer survives is an error.
  EXPECT_NE(test::error_of([&] {
              SftDataset(rs, *squad, *tok, {.seq_length = 20, .num_samples = 0, .seed = 1});
            }).find("no conversation keeps a response token within seq_length + 1 = 21 tokens (the longest has 33)"),
            std::string::npos);
}

TEST(SftDataset, EpochsAreSeededShufflesOfEveryRecord) {
  const auto tok = bytes();
  const auto fmt = fixed_chat_format(ChatFormatName::Alpaca);
  const SftRecords rs = records({R"({"prompt": "0", "response": "a"})", R"({"prompt": "1", "response": "b"})",
                                 R"({"prompt": "2", "response": "c"})", R"({"prompt": "3", "response": "d"})",
                                 R"({"prompt": "4", "response": "e"})"});
  SftDataset a(rs, *fmt, *tok, {.seq_length = 160, .num_samples = 12, .seed = 7});
  SftDataset b(rs, *fmt, *tok, {.seq_length = 160, .num_samples = 12, .seed = 7});
  SftDataset c(rs, *fmt, *tok, {.seq_length = 160, .num_samples = 12, .seed = 8});
  ASSERT_EQ(a.size(), 12);
  bool differs = false;
  for (int64_t e = 0; e < 2; ++e) {
    std::set<std::vector<int32_t>> seen;
    for (int64_t i = 0; i < 5; ++i) seen.insert(a.get(e * 5 + i));
    EXPECT_EQ(seen.size(), 5u) << "epoch " << e << " draws every record once";
  }
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(a.get(i), b.get(i));
    differs |= a.get(i) != c.get(i);
  }
  EXPECT_TRUE(differs) << "another seed, another order";
}

TEST(SftPacking, FirstFitDecreasing) {
  // Longest first: 9 -> bin 0, 7 -> bin 1, 5 -> bin 2, 4 -> bin 2, 3 -> bin 1, 2 -> a new bin 3.
  EXPECT_EQ(pack_first_fit_decreasing({5, 9, 3, 7, 2, 4}, 10),
            (std::vector<std::vector<int32_t>>{{1}, {3, 2}, {0, 5}, {4}}));
  EXPECT_EQ(pack_first_fit_decreasing({3, 3, 3}, 10), (std::vector<std::vector<int32_t>>{{0, 1, 2}}));
  EXPECT_NE(test::error_of([] {
              pack_first_fit_decreasing({3, 11}, 10);
            }).find("11 tokens cannot be packed into 10"),
            std::string::npos);
}

TEST(SftPacking, PackedSamplesHoldEveryConversationOnce) {
  const auto tok = bytes();
  const auto fmt = fixed_chat_format(ChatFormatName::ChatML);
  const SftRecords rs = records({R"({"prompt": "a", "response": "1"})",
                                 R"({"prompt": "bbbbbbbbbbbb", "response": "22"})",
                                 R"({"prompt": "c", "response": "333"})", R"({"prompt": "dddddd", "response": "4"})",
                                 R"({"prompt": "e", "response": "55555"})"});
  const SftDataset plain(rs, *fmt, *tok, {.seq_length = 139, .num_samples = 0, .seed = 5});
  const SftDataset packed(rs, *fmt, *tok, {.seq_length = 139, .num_samples = 0, .seed = 5, .pack = true});
  EXPECT_EQ(plain.sequences(), 5);
  EXPECT_EQ(packed.conversations(), 5);
  // Conversations of 74, 67, 66, 64 and 62 tokens into sequences of 140: 74 + 66, 67 + 64, 62.
  EXPECT_EQ(packed.sequences(), 3);
  std::multiset<std::string> conversations;
  int64_t trained = 0, packed_trained = 0;
  for (int64_t i = 0; i < plain.size(); ++i) {
    const auto m = plain.loss_mask(i);
    trained += std::count(m.begin(), m.end(), 1);
  }
  for (int64_t i = 0; i < packed.size(); ++i) {
    const auto s = packed.get(i);
    const auto m = packed.loss_mask(i);
    ASSERT_EQ(s.size(), 140u);
    packed_trained += std::count(m.begin(), m.end(), 1);
    const std::vector<int32_t> starts = packed.document_starts(i);
    for (size_t d = 0; d < starts.size(); ++d) {
      const std::string text(s.begin() + starts[d], s.end());
      conversations.insert(text.substr(0, text.find("<|im_end|>", text.find("assistant")) + 10));
    }
  }
  EXPECT_EQ(packed_trained, trained) << "the same tokens are trained, packed or not";
  ASSERT_EQ(conversations.size(), 5u);
  for (const char* r : {"user\na<", "user\nbbbbbbbbbbbb<", "user\nc<", "user\ndddddd<", "user\ne<"})
    EXPECT_EQ(std::count_if(conversations.begin(), conversations.end(),
                            [&](const std::string& c) {
                              return c.starts_with("<|im_start|>") && c.find(r) != std::string::npos;
                            }),
              1)
        << r;
  EXPECT_EQ(plain.document_starts(0), (std::vector<int32_t>{0}));
}

TEST(SftDataset, MicrobatchTargetsAreMinusOneOutsideTheResponses) {
  const auto tok = bytes();
  const auto fmt = fixed_chat_format(ChatFormatName::ChatML);
  const SftRecords rs = records({R"({"prompt": "hi", "response": "yo"})", R"({"prompt": "x", "response": "zz"})"});
  auto ds = std::make_shared<SftDataset>(rs, *fmt, *tok,
                                         SftDatasetOptions{.seq_length = 64, .num_samples = 0, .seed = 3});
  SampleSource src;
  src.dataset = ds;
  Microbatch mb;
  fill_microbatch(src, 0, 2, 64, mb);
  const std::vector<int32_t>&tokens = mb.tokens, &targets = mb.targets;
  EXPECT_FALSE(mb.docs.active()) << "without use_packed_attention";
  src.dataset_documents = true;  // use_packed_attention: each sample's one conversation, from 0
  Microbatch alone;
  fill_microbatch(src, 0, 2, 64, alone);
  EXPECT_TRUE(alone.docs.active());
  EXPECT_EQ(alone.docs.starts, (std::vector<std::vector<int32_t>>{{0}, {0}}));
  for (int64_t b = 0; b < 2; ++b) {
    const auto s = ds->get(b);
    const auto m = ds->loss_mask(b);
    std::string trained;
    for (int64_t t = 0; t < 64; ++t) {
      EXPECT_EQ(tokens[b * 64 + t], s[t]);
      EXPECT_EQ(targets[b * 64 + t], m[t + 1] ? s[t + 1] : -1) << b << " " << t;
      if (targets[b * 64 + t] >= 0) trained += char(targets[b * 64 + t]);
    }
    EXPECT_TRUE(trained == "yo<|im_end|>" || trained == "zz<|im_end|>") << trained;
  }
}

}  // namespace
}  // namespace primus::data
