// split_layers: Megatron's even and uneven (decoder_first/last_pipeline_num_layers) splits, and
// which layers each (rank, chunk) of a schedule holds.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "pipeline/partition.h"
#include "pipeline/schedules/registry.h"
#include "split_checks.h"

using namespace primus;
using namespace primus::pipeline;

namespace {

using test::counts;
using test::expect_contiguous;

// The error's text contains every one of `parts`.
void expect_error(auto&& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected primus::Error";
  } catch (const Error& e) {
    for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

Schedule make(const std::string& algorithm, int pp, int m = 8) {
  ScheduleRequest req;
  req.pp = pp;
  req.microbatches = m;
  return generate(algorithm, req);
}

}  // namespace

TEST(SplitLayers, EvenSplit) {
  auto s = split_layers(8, 4, 1);
  EXPECT_EQ(s, (std::vector<LayerRange>{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  auto v = split_layers(16, 4, 2);
  ASSERT_EQ(v.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(v[i], (LayerRange{2 * i, 2}));
  EXPECT_EQ(split_layers(5, 1, 1), (std::vector<LayerRange>{{0, 5}}));
  // V-shape even split: same per-stage counts in model order.
  EXPECT_EQ(split_layers(16, 4, 2, 0, 0, Placement::VShape), v);
}

TEST(SplitLayers, EvenSplitNeedsDivisibility) {
  expect_error([] { split_layers(10, 4, 1); },
               {"num_layers 10", "pipeline_model_parallel_size 4", "decoder_first_pipeline_num_layers"});
  // Divisible by pp but not by pp * vpp: Megatron's layers-per-rank % vpp rule.
  expect_error([] { split_layers(12, 4, 2); },
               {"num_layers 12", "4 x 2 = 8", "decoder_last_pipeline_num_layers"});
}

TEST(SplitLayers, FirstAndLastStages) {
  // 10 layers on 4 ranks: 1 on the first, 3 on the last, the middle 6 split over 2 ranks.
  auto s = split_layers(10, 4, 1, 1, 3);
  EXPECT_EQ(counts(s), (std::vector<int64_t>{1, 3, 3, 3}));
  expect_contiguous(s, 10);
  // Only the first set: the other 9 over the other 3 ranks (the last rank is a middle one).
  EXPECT_EQ(counts(split_layers(10, 4, 1, 1, 0)), (std::vector<int64_t>{1, 3, 3, 3}));
  // Only the last set.
  EXPECT_EQ(counts(split_layers(11, 4, 1, 0, 2)), (std::vector<int64_t>{3, 3, 3, 2}));
  // pp 2 with both set: nothing in the middle, the two must add up.
  EXPECT_EQ(counts(split_layers(7, 2, 1, 3, 4)), (std::vector<int64_t>{3, 4}));
}

TEST(SplitLayers, FirstAndLastWithVirtualChunksFollowMegatronOffsets) {
  // 14 layers, pp 4, vpp 2, first rank 2 layers (1 per chunk), last rank 4 (2 per chunk), middle
  // 8 over 2 ranks (4 each, 2 per chunk). Megatron's get_transformer_layer_offset gives, for
  // stage = vp_stage * pp + pp_rank, offsets 0 1 3 5 | 7 8 10 12.
  auto s = split_layers(14, 4, 2, 2, 4);
  EXPECT_EQ(counts(s), (std::vector<int64_t>{1, 2, 2, 2, 1, 2, 2, 2}));
  std::vector<int64_t> offsets;
  for (auto& r : s) offsets.push_back(r.first_layer);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1, 3, 5, 7, 8, 10, 12}));
  expect_contiguous(s, 14);
}

TEST(SplitLayers, VShapeFirstRankHoldsBothEnds) {
  // V-shape: rank 0 holds stage 0 and stage 7, so decoder_first_pipeline_num_layers sizes both.
  auto s = split_layers(14, 4, 2, 2, 0, Placement::VShape);
  EXPECT_EQ(counts(s), (std::vector<int64_t>{1, 2, 2, 2, 2, 2, 2, 1}));
  expect_contiguous(s, 14);
  // and the last rank (pp-1) holds the turn, stages 3 and 4.
  EXPECT_EQ(counts(split_layers(10, 4, 2, 0, 4, Placement::VShape)),
            (std::vector<int64_t>{1, 1, 1, 2, 2, 1, 1, 1}));
}

TEST(SplitLayers, UnevenErrors) {
  expect_error([] { split_layers(14, 4, 2, 3, 0); },
               {"decoder_first_pipeline_num_layers = 3", "divisible by virtual_pipeline_model_parallel_size 2"});
  expect_error([] { split_layers(14, 4, 2, 2, 3); },
               {"decoder_last_pipeline_num_layers = 3", "virtual_pipeline_model_parallel_size 2"});
  expect_error([] { split_layers(10, 4, 1, 2, 1); }, {"7 layers left", "not divisible by the 2 middle"});
  expect_error([] { split_layers(10, 4, 2, 2, 2); },
               {"each middle pipeline rank would hold 3 layers", "virtual_pipeline_model_parallel_size 2"});
  expect_error([] { split_layers(6, 4, 1, 3, 3); }, {"take all 6 layers", "other 2 pipeline rank"});
  expect_error([] { split_layers(6, 4, 1, 4, 3); }, {"exceed num_layers 6"});
  expect_error([] { split_layers(8, 2, 1, 3, 4); }, {"must equal num_layers 8"});
  expect_error([] { split_layers(8, 1, 1, 8, 0); }, {"pipeline_model_parallel_size >= 2"});
  expect_error([] { split_layers(8, 4, 1, -1, 0); }, {"decoder_first_pipeline_num_layers must be positive"});
  expect_error([] { split_layers(0, 2, 1); }, {"num_layers must be at least 1"});
  expect_error([] { split_layers(8, 0, 1); }, {"pipeline_model_parallel_size must be at least 1"});
  expect_error([] { split_layers(8, 2, 0); }, {"virtual_pipeline_model_parallel_size must be at least 1"});
  expect_error([] { split_layers(12, 2, 3, 0, 0, Placement::VShape); }, {"exactly 2 chunks"});
}

TEST(SplitLayers, WhatEachRankHoldsUnderASchedule) {
  // Looped, vpp 2 (interleaved): rank r holds stages r and pp + r.
  Schedule il = make("interleaved-1f1b", 2);
  auto s = split_layers(il, 8);
  EXPECT_EQ(rank_layers(il, s, 0), (std::vector<LayerRange>{{0, 2}, {4, 2}}));
  EXPECT_EQ(rank_layers(il, s, 1), (std::vector<LayerRange>{{2, 2}, {6, 2}}));
  // V-shape: rank 0 holds the first and the last stage.
  Schedule v = make("zbv", 2);
  auto sv = split_layers(v, 6, 2, 0);  // rank 0: 1 + 1, rank 1: 2 + 2
  EXPECT_EQ(rank_layers(v, sv, 0), (std::vector<LayerRange>{{0, 1}, {5, 1}}));
  EXPECT_EQ(rank_layers(v, sv, 1), (std::vector<LayerRange>{{1, 2}, {3, 2}}));
  EXPECT_EQ(layers_of(v, sv, 1, 1), (LayerRange{3, 2}));
  // Every schedule's ranks together hold every layer once.
  for (const std::string& name : algorithm_names()) {
    Schedule sc = make(name, 4);
    auto split = split_layers(sc, 8 * sc.vpp);
    std::vector<int> seen(8 * sc.vpp, 0);
    for (int r = 0; r < sc.pp; ++r)
      for (auto& lr : rank_layers(sc, split, r))
        for (int64_t l = lr.first_layer; l < lr.first_layer + lr.num_layers; ++l) ++seen[l];
    for (int c : seen) EXPECT_EQ(c, 1) << name;
  }
  expect_error([&] { layers_of(v, split_layers(6, 3, 1), 0, 0); }, {"3 stages", "'zbv' has 4"});
  expect_error([&] { layers_of(v, sv, 2, 0); }, {"rank 2 is out of range"});
  expect_error([&] { layers_of(v, sv, 0, 2); }, {"chunk 2 is out of range"});
}

TEST(PipelineLayout, MegatronsNotationUnrolls) {
  // Primus's qwen3_235B_A22B examples: 94 layers over 16 stages, 5 on the first and last.
  const std::vector<int64_t> qwen = parse_pipeline_layout("Et*5|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*6|t*5,L");
  ASSERT_EQ(qwen.size(), 16u);
  EXPECT_EQ(qwen.front(), 5);
  EXPECT_EQ(qwen.back(), 5);
  int64_t total = 0;
  for (int64_t n : qwen) total += n;
  EXPECT_EQ(total, 94);
  // Groups, commas for the eye, several digits.
  EXPECT_EQ(parse_pipeline_layout("Ettt|(tt|)*2,t*10L"), (std::vector<int64_t>{3, 2, 2, 10}));
  EXPECT_EQ(parse_pipeline_layout("EtL"), (std::vector<int64_t>{1}));
  EXPECT_EQ(split_layers(std::vector<int64_t>{3, 2, 2, 10}, 17),
            (std::vector<LayerRange>{{0, 3}, {3, 2}, {5, 2}, {7, 10}}));
}

TEST(PipelineLayout, WhatIsNotALayoutIsNamed) {
  expect_error([] { parse_pipeline_layout("t*4|t*4,L"); }, {"start with the embedding (E)"});
  expect_error([] { parse_pipeline_layout("Et*4|t*4"); }, {"end with the loss (L)"});
  expect_error([] { parse_pipeline_layout("Et*4|Et*4L"); }, {"embedding (E) more than once"});
  expect_error([] { parse_pipeline_layout("Et*4L|t*4L"); }, {"loss (L) more than once"});
  expect_error([] { parse_pipeline_layout("Et*4|t*3m|L"); }, {"multi-token prediction layer (m)"});
  expect_error([] { parse_pipeline_layout("Etm|t*3L"); }, {"multi-token prediction layer (m) before the last stage"});
  int64_t mtp = 0;
  EXPECT_EQ(parse_pipeline_layout("Et*2|t*2mmL", mtp), (std::vector<int64_t>{2, 2}));  // the depths beside the loss
  EXPECT_EQ(mtp, 2);
  EXPECT_EQ(pipeline_layout_mtp_layers("Et|(tt|)*2,tmL"), 1);
  EXPECT_EQ(pipeline_layout_mtp_layers("Et|tL"), 0);
  expect_error([] { parse_pipeline_layout("Et*4|x*4L"); }, {"the letter 'x'"});
  expect_error([] { parse_pipeline_layout("E|t*4|t*4L"); }, {"stage 0 holds no transformer layer"});
  expect_error([] { parse_pipeline_layout("Et*99999999L"); }, {"more than 1048576 letters"});
  expect_error([] { parse_pipeline_layout("E(t*2000|)*1000t*1000L"); }, {"more than 1048576 letters"});
  expect_error([] { split_layers(std::vector<int64_t>{3, 2}, 6); }, {"places 5 transformer layers", "num_layers 6"});
}
