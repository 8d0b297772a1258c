// The watch's detectors as pure logic: robust statistics, loss spikes, stragglers, hangs.
#include <gtest/gtest.h>

#include <cmath>

#include "safe/detect.h"

using namespace primus::safe;

TEST(Detect, MedianAndMad) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(median({})));
  EXPECT_DOUBLE_EQ(mad({1, 2, 3, 4, 100}), 1);  // robust: the outlier does not move it
  // z of the outlier against the window: (100 - 3) / (1.4826 * 1)
  EXPECT_NEAR(robust_z(100, {1, 2, 3, 4, 100}), 97 / 1.4826, 1e-9);
}

TEST(Detect, SpikeOnlyForARealJump) {
  SpikeDetector d(50, 10, 6.0, 0.1);
  // A falling, slightly noisy loss: never a spike (falling is negative z).
  for (int i = 0; i < 40; ++i) EXPECT_FALSE(d.observe(5.0 - 0.05 * i + 0.01 * (i % 3))) << i;
  auto s = d.observe(9.0);
  ASSERT_TRUE(s.has_value());
  EXPECT_GT(s->z, 6);
  EXPECT_NEAR(s->median, 5.0 - 0.05 * 19.5, 0.02);  // median of the 40 values seen
  // The spike stays out of the window, so a second one is caught too; a normal value is not.
  EXPECT_TRUE(d.observe(9.5).has_value());
  EXPECT_FALSE(d.observe(3.1).has_value());
  EXPECT_FALSE(d.observe(NAN).has_value());  // NaN is the NaN policy's business
}

TEST(Detect, SpikeNeedsAWindowFirst) {
  SpikeDetector d(50, 10, 6.0, 0.1);
  for (int i = 0; i < 9; ++i) d.observe(1.0);
  EXPECT_FALSE(d.observe(50.0).has_value());  // only 9 samples: no verdict yet
}

TEST(Detect, StragglerAfterConsecutiveSlowChecks) {
  StragglerDetector d(1.5, 5, 3, 0.02);
  int found_at = -1;
  for (int it = 1; it <= 20 && found_at < 0; ++it) {
    d.add(0, it, 0.050);
    d.add(1, it, 0.200);  // 4x slower
    d.add(2, it, 0.052);
    auto s = d.check();
    if (!s.empty()) {
      ASSERT_EQ(s.size(), 1u);
      EXPECT_EQ(s[0].rank, 1);
      EXPECT_NEAR(s[0].median_s, 0.2, 1e-12);
      EXPECT_NEAR(s[0].peers_median_s, 0.051, 1e-12);
      found_at = it;
    }
  }
  // A full window (5 steps) and then 3 slow checks in a row.
  EXPECT_EQ(found_at, 7);
  for (int it = 21; it < 40; ++it) {  // reported once, not every step
    d.add(0, it, 0.05), d.add(1, it, 0.2), d.add(2, it, 0.05);
    EXPECT_TRUE(d.check().empty());
  }
}

TEST(Detect, NoStragglerAmongEqualsOrTinyDifferences) {
  StragglerDetector d(1.5, 5, 3, 0.02);
  for (int it = 1; it <= 30; ++it) {
    d.add(0, it, 0.010);
    d.add(1, it, 0.025);  // 2.5x, but only 15 ms more: below the absolute floor
    EXPECT_TRUE(d.check().empty());
  }
}

TEST(Detect, HangAfterTimeoutWithoutProgress) {
  HangDetector h(5.0);
  auto hb = [](int rank, int64_t beat, const char* phase = "step") {
    Heartbeat b;
    b.rank = rank;
    b.beat = beat;
    b.iteration = beat;
    b.phase = phase;
    return b;
  };
  EXPECT_TRUE(h.hung(100).empty());  // nothing seen yet: start-up is not a hang
  h.observe({{0, hb(0, 1)}, {1, hb(1, 1)}}, 0.0, 2);
  h.observe({{0, hb(0, 2)}, {1, hb(1, 1)}}, 3.0, 2);
  EXPECT_TRUE(h.hung(4.9).empty());
  auto hung = h.hung(5.5);  // rank 1 idle since 0.0, rank 0 since 3.0
  ASSERT_EQ(hung.size(), 1u);
  EXPECT_EQ(hung[0].rank, 1);
  EXPECT_NEAR(hung[0].idle_s, 5.5, 1e-9);
  // A rank that finished is never hung; a rank that never reported is, once the others have.
  HangDetector g(5.0);
  g.observe({{0, hb(0, 7, "done")}}, 0.0, 2);
  auto h2 = g.hung(10);
  ASSERT_EQ(h2.size(), 1u);
  EXPECT_EQ(h2[0].rank, 1);
  EXPECT_EQ(h2[0].phase, "none");
}
