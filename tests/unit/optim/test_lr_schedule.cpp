// Megatron's schedules at their key iterations: start, end of warmup, mid-decay, end, after.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "optim/lr_schedule.h"

using namespace primus;

namespace {
LRScheduleOptions base(const char* style) {
  LRScheduleOptions o;
  o.lr = 1e-3;
  o.min_lr = 1e-4;
  o.lr_warmup_iters = 10;
  o.lr_decay_iters = 110;
  o.lr_decay_style = style;
  return o;
}
std::string error_of(const LRScheduleOptions& o) {
  try {
    LRSchedule s(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(LRSchedule, WarmupIsLinearFromZero) {
  LRSchedule s(base("cosine"));
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);  // Megatron: the first step runs at lr_warmup_init
  EXPECT_DOUBLE_EQ(s.lr_at(1), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);
  auto o = base("linear");
  o.lr_warmup_init = 2e-4;
  EXPECT_DOUBLE_EQ(LRSchedule(o).lr_at(0), 2e-4);
  EXPECT_DOUBLE_EQ(LRSchedule(o).lr_at(5), 6e-4);
}

TEST(LRSchedule, Linear) {
  LRSchedule s(base("linear"));
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 1e-4 + 0.5 * 9e-4);  // halfway through decay
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 1e-4);
}

TEST(LRSchedule, Cosine) {
  LRSchedule s(base("cosine"));
  EXPECT_DOUBLE_EQ(s.lr_at(60), 1e-4 + 0.5 * 9e-4);  // cos(pi/2) = 0
  EXPECT_NEAR(s.lr_at(35), 1e-4 + 9e-4 * 0.5 * (std::cos(std::numbers::pi * 0.25) + 1), 1e-15);
  EXPECT_NEAR(s.lr_at(110), 1e-4, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(111), 1e-4);
}

TEST(LRSchedule, ConstantIgnoresDecay) {
  auto o = base("constant");
  o.lr_decay_iters = 0;  // not needed for constant
  LRSchedule s(o);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(100000), 1e-3);
}

TEST(LRSchedule, InverseSquareRoot) {
  LRSchedule s(base("inverse-square-root"));
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(40), 1e-3 * std::sqrt(10.0) / std::sqrt(40.0));  // = 5e-4
  EXPECT_DOUBLE_EQ(s.lr_at(109), std::max(1e-4, 1e-3 * std::sqrt(10.0 / 109.0)));
  EXPECT_DOUBLE_EQ(s.lr_at(200), 1e-4);
}

TEST(LRSchedule, WSD) {
  // Hold 1e-3 until iteration 110 - 20 = 90, then anneal to min_lr by 110.
  for (auto [style, mid] : {std::pair{"linear", 0.5}, std::pair{"cosine", 0.5},
                            std::pair{"exponential", 2 * std::pow(0.5, 0.5) - 1}, std::pair{"minus_sqrt", 1 - std::sqrt(0.5)}}) {
    auto o = base("WSD");
    o.lr_wsd_decay_style = style;
    o.lr_wsd_decay_iters = 20;
    LRSchedule s(o);
    EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3) << style;
    EXPECT_DOUBLE_EQ(s.lr_at(50), 1e-3) << style;
    EXPECT_DOUBLE_EQ(s.lr_at(90), 1e-3) << style;
    EXPECT_NEAR(s.lr_at(100), 1e-4 + mid * 9e-4, 1e-15) << style;
    EXPECT_NEAR(s.lr_at(110), 1e-4, 1e-15) << style;
    EXPECT_DOUBLE_EQ(s.lr_at(500), 1e-4) << style;
  }
}

TEST(LRSchedule, ErrorsNameTheField) {
  auto o = base("cosnie");
  EXPECT_NE(error_of(o).find("lr_decay_style: unknown style 'cosnie' (did you mean 'cosine'?)"), std::string::npos)
      << error_of(o);
  o = base("linear");
  o.min_lr = 1e-2;
  EXPECT_NE(error_of(o).find("min_lr"), std::string::npos);
  o = base("linear");
  o.lr_warmup_iters = 200;
  EXPECT_NE(error_of(o).find("lr_warmup_iters (200) must be smaller than lr_decay_iters (110)"), std::string::npos);
  o = base("linear");
  o.lr_decay_iters = 0;
  EXPECT_NE(error_of(o).find("lr_decay_iters must be positive"), std::string::npos);
  o = base("WSD");
  EXPECT_NE(error_of(o).find("lr_wsd_decay_iters must be positive"), std::string::npos);
  o.lr_wsd_decay_iters = 101;
  EXPECT_NE(error_of(o).find("lr_wsd_decay_iters (101)"), std::string::npos);
  o.lr_wsd_decay_iters = 5;
  o.lr_wsd_decay_style = "sqrt";
  EXPECT_NE(error_of(o).find("lr_wsd_decay_style"), std::string::npos);
  o = base("linear");
  o.lr = -1;
  EXPECT_NE(error_of(o).find("lr must be"), std::string::npos);
}
