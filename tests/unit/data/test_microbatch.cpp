// The micro-batch loader (data/microbatch.h): which samples a rank's microbatches hold, the
// inputs/targets shift, eod masking, and the context-parallel rows.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "data/microbatch.h"

using namespace primus;
using namespace primus::data;

namespace {

// Sample i is i*100, i*100 + 1, ..., i*100 + seq (seq + 1 tokens): every token names its sample.
class Counting final : public SampleDataset {
 public:
  Counting(int64_t n, int64_t seq) : n_(n), seq_(seq) {}
  int64_t size() const override { return n_; }
  std::vector<int32_t> get(int64_t i) const override {
    std::vector<int32_t> s(size_t(seq_ + 1));
    for (int64_t j = 0; j <= seq_; ++j) s[size_t(j)] = int32_t(i * 100 + j);
    return s;
  }

 private:
  int64_t n_, seq_;
};

}  // namespace

TEST(Microbatch, ARanksMicrobatchesAreItsSliceOfTheGlobalBatch) {
  const int64_t seq = 8, mbs = 2;
  SampleSource src;
  src.dataset = std::make_shared<Counting>(1000, seq);
  // dp rank 1 of a global batch starting at sample 40, 3 microbatches per dp rank: its microbatch
  // 2 is the global batch's microbatch 1 * 3 + 2 = 5, samples 40 + 10 and 40 + 11.
  const MicrobatchFill fill = microbatches_from(src, 40, {1, 3, mbs, seq, 1, 0});
  Microbatch mb;
  fill(2, mb);
  const std::vector<int32_t>&tokens = mb.tokens, &targets = mb.targets;
  EXPECT_FALSE(mb.docs.active());
  ASSERT_EQ(tokens.size(), size_t(mbs * seq));
  EXPECT_EQ(tokens[0], 5000);
  EXPECT_EQ(targets[0], 5001);  // the next token
  EXPECT_EQ(tokens[size_t(seq)], 5100);
  EXPECT_EQ(targets[size_t(2 * seq - 1)], 5100 + seq);
}

TEST(Microbatch, EodMaskingDropsTheTargetsAfterTheEodToken) {
  SampleSource src;
  src.dataset = std::make_shared<Counting>(10, 4);
  src.eod_mask = 302;  // sample 3's third token
  Microbatch mb;
  fill_microbatch(src, 3, 1, 4, mb);
  EXPECT_EQ(mb.targets, (std::vector<int32_t>{301, 302, -1, 304}));
}

// Megatron's split (get_ltor_masks_and_position_ids): a document begins after each eod input
// token, except after the last position; the eod belongs to the document it ends. Under context
// parallelism every rank keeps the whole sequences' starts.
TEST(Microbatch, ResetKeysSplitDocumentsAfterEachEodInputToken) {
  const int64_t seq = 8;
  SampleSource src;
  src.dataset = std::make_shared<Counting>(10, seq);
  src.eod = 2;  // sample 0 holds 0 .. 8: eod at input position 2
  src.reset_attention_mask = true;
  Microbatch mb;
  fill_microbatch(src, 0, 1, seq, mb);
  EXPECT_TRUE(mb.docs.active() && mb.docs.separate_attention && !mb.docs.restart_positions);
  EXPECT_EQ(mb.docs.starts, (std::vector<std::vector<int32_t>>{{0, 3}}));
  src.eod = 7;  // the last input position: nothing follows it
  src.reset_attention_mask = false;
  src.reset_position_ids = true;
  fill_microbatch(src, 0, 1, seq, mb);
  EXPECT_EQ(mb.docs.starts, (std::vector<std::vector<int32_t>>{{0}}));
  EXPECT_TRUE(mb.docs.restart_positions);
  EXPECT_EQ(documents_after_eod({5, 1, 5, 5, 5, 2}, 2, 3, 5), (std::vector<std::vector<int32_t>>{{0, 1}, {0, 1, 2}}));
  // cp 2: the rows are split, the documents are the whole sequence's.
  src.eod = 5;
  microbatches_from(src, 0, {0, 1, 1, seq, 2, 1})(0, mb);
  EXPECT_EQ(mb.tokens.size(), size_t(seq / 2));
  EXPECT_EQ(mb.docs.starts, (std::vector<std::vector<int32_t>>{{0, 6}}));
}

TEST(Microbatch, ContextParallelRanksTakeTwoBalancedChunksThatCoverEverySequence) {
  const int64_t seq = 16, mbs = 2;
  const int cp = 2;
  SampleSource src;
  src.dataset = std::make_shared<Counting>(100, seq);
  std::vector<int32_t> all;
  for (int r = 0; r < cp; ++r) {
    Microbatch mb;
    microbatches_from(src, 0, {0, 1, mbs, seq, cp, r})(0, mb);
    const std::vector<int32_t>&tokens = mb.tokens, &targets = mb.targets;
    ASSERT_EQ(tokens.size(), size_t(mbs * seq / cp));
    // Rank r's first chunk is chunk r, its second chunk 2 cp - 1 - r (4 tokens each).
    EXPECT_EQ(tokens[0], r * 4);
    EXPECT_EQ(tokens[size_t(mbs * 4)], (2 * cp - 1 - r) * 4);
    EXPECT_EQ(targets[0], r * 4 + 1);
    all.insert(all.end(), tokens.begin(), tokens.end());
  }
  std::vector<int32_t> whole;
  for (int b = 0; b < mbs; ++b)
    for (int64_t j = 0; j < seq; ++j) whole.push_back(int32_t(b * 100 + j));
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, whole);
  EXPECT_THROW(context_parallel_rows(whole.data(), 1, 6, 2, 0), Error);  // 6 is not a multiple of 2 x 2
}

TEST(Microbatch, MockSamplesAreAFunctionOfTheSeedAndASampleOfAnotherLengthIsAnError) {
  SampleSource a{nullptr, 50, 8, 7, -1}, b{nullptr, 50, 8, 7, -1};
  EXPECT_EQ(a.get(3), b.get(3));
  EXPECT_NE(a.get(3), a.get(4));
  Microbatch mb;
  SampleSource wrong;
  wrong.dataset = std::make_shared<Counting>(10, 4);
  EXPECT_THROW(fill_microbatch(wrong, 0, 1, 8, mb), Error);
}
