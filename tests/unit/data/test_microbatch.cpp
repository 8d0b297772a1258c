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
  std::vector<int32_t> tokens, targets;
  fill(2, tokens, targets);
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
  std::vector<int32_t> tokens, targets;
  fill_microbatch(src, 3, 1, 4, tokens, targets);
  EXPECT_EQ(targets, (std::vector<int32_t>{301, 302, -1, 304}));
}

TEST(Microbatch, ContextParallelRanksTakeTwoBalancedChunksThatCoverEverySequence) {
  const int64_t seq = 16, mbs = 2;
  const int cp = 2;
  SampleSource src;
  src.dataset = std::make_shared<Counting>(100, seq);
  std::vector<int32_t> all;
  for (int r = 0; r < cp; ++r) {
    std::vector<int32_t> tokens, targets;
    microbatches_from(src, 0, {0, 1, mbs, seq, cp, r})(0, tokens, targets);
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
  std::vector<int32_t> tokens, targets;
  SampleSource wrong;
  wrong.dataset = std::make_shared<Counting>(10, 4);
  EXPECT_THROW(fill_microbatch(wrong, 0, 1, 8, tokens, targets), Error);
}
