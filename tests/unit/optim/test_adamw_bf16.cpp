// The precision-aware optimizer's state (optim/adamw.h: exp_avg_dtype, exp_avg_sq_dtype,
// bf16_params): each stored bf16 moment is the fp32 optimizer's moment of the same step rounded to
// nearest even, the parameters are the fp32 optimizer's exactly (the update reads the moments
// before the rounding, as Transformer Engine's FusedAdam), the state is half the bytes, and a
// checkpoint's fp32 moments load rounded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "support/adamw_steps.h"

using namespace primus;

namespace {

float round_bf16(float x) { return bf16::from_float(x).to_float(); }

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// A deterministic gradient with a wide range of magnitudes (so that the rounding is exercised).
std::vector<float> gradient(int64_t n, int step) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    g[size_t(i)] = float(std::sin(0.37 * double(i + 1) * double(step + 3)) * std::pow(10.0, double(i % 7) - 4.0));
  return g;
}

using test::adamw_moment;
AdamWOptions options(DType m, DType v, bool bf16_params = false) {
  return test::adamw_options(m, v, bf16_params ? DType::BF16 : DType::F32);
}

}  // namespace

// Each step of the bf16-state optimizer against an fp32-state optimizer started from the same
// (bf16) moments and parameters: the stored moments are its moments rounded, bit for bit, and the
// parameters are its parameters, bit for bit.
TEST(AdamWBf16, EachStoredMomentIsTheFp32UpdateRounded) {
  const int64_t n = 1000;
  const std::vector<ParamSegment> segs = {{"w", 0, 600, true}, {"b", 600, 400, false}};
  for (const auto& [md, vd] :
       {std::pair{DType::BF16, DType::BF16}, {DType::BF16, DType::F32}, {DType::F32, DType::BF16}}) {
    AdamW low(options(md, vd), n);
    std::vector<float> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[size_t(i)] = float(std::cos(double(i))) * 0.05f;
    int rounded = 0;  // moments the rounding changed: the test must see some
    test::step_beside_fp32(
        low, p, segs, 1e-3, 6, [&](int step) { return gradient(n, step); },
        [&](const test::StepBesideFp32& s) {
          for (int64_t i = 0; i < n; ++i) {
            const float f_m = s.fp32.exp_avg()[i], f_v = s.fp32.exp_avg_sq()[i];
            const float want_m = md == DType::BF16 ? round_bf16(f_m) : f_m;
            const float want_v = vd == DType::BF16 ? round_bf16(f_v) : f_v;
            ASSERT_EQ(bits(s.exp_avg[size_t(i)]), bits(want_m)) << "exp_avg[" << i << "] step " << s.step;
            ASSERT_EQ(bits(s.exp_avg_sq[size_t(i)]), bits(want_v)) << "exp_avg_sq[" << i << "] step " << s.step;
            rounded += (md == DType::BF16 && s.exp_avg[size_t(i)] != f_m);
          }
        });
    if (md == DType::BF16) {
      EXPECT_GT(rounded, 1000);
    }
  }
}

// bf16 parameters (main_params_dtype bf16): every updated value is the fp32 update rounded.
TEST(AdamWBf16, Bf16ParametersAreTheUpdateRounded) {
  const int64_t n = 257;
  const std::vector<ParamSegment> segs = {{"w", 0, n, true}};
  AdamW low(options(DType::BF16, DType::BF16, true), n), ref(options(DType::BF16, DType::BF16), n);
  std::vector<float> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = round_bf16(float(i) * 1e-3f - 0.1f);
  for (int step = 1; step <= 4; ++step) {
    std::vector<float> pr = p;
    const std::vector<float> m = adamw_moment(low, false), v = adamw_moment(low, true);
    ref.set_state(low.step_count(), m.data(), v.data());
    const std::vector<float> g = gradient(n, step);
    low.step(p.data(), g.data(), segs, 1e-2);
    ref.step(pr.data(), g.data(), segs, 1e-2);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(p[size_t(i)]), bits(round_bf16(pr[size_t(i)]))) << i;
  }
}

// Half the bytes, and a checkpoint's fp32 moments load rounded to nearest even (ties to even).
TEST(AdamWBf16, StateIsHalfAndLoadsRounded) {
  EXPECT_EQ(adamw_state_bytes_per_param(options(DType::F32, DType::F32)), 8);
  EXPECT_EQ(adamw_state_bytes_per_param(options(DType::BF16, DType::F32)), 6);
  EXPECT_EQ(adamw_state_bytes_per_param(options(DType::BF16, DType::BF16)), 4);
  FlatAdamW a(options(DType::BF16, DType::BF16), {{"w", 0, 4, true}}, 4, Device::CPU);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even gives 1; 1 + 3 * 2^-8
  // is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even gives 1 + 2^-6.
  const float m[4] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 0.1f, -3.0e-20f};
  const float v[4] = {2.0f, 1e-30f, 0.5f, 7.0f};
  a.set_state(5, m, v);
  const std::vector<float> mm = a.exp_avg(), vv = a.exp_avg_sq();
  EXPECT_EQ(mm[0], 1.0f);
  EXPECT_EQ(mm[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(mm[2], round_bf16(0.1f));
  EXPECT_EQ(mm[3], round_bf16(-3.0e-20f));
  EXPECT_EQ(vv[1], round_bf16(1e-30f));
  EXPECT_EQ(a.step_count(), 5);
  // The checkpoint writer's view: copies holding the same values.
  std::vector<std::vector<float>> copies;
  const float* r = a.moment_range(false, 1, 3, copies);
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(r[0], mm[1]);
  EXPECT_EQ(r[2], mm[3]);
}

TEST(AdamWBf16, OtherDtypesAreRefusedByName) {
  try {
    AdamW a(options(DType::I32, DType::F32), 4);
    FAIL() << "int32 moments accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg_dtype int32 is not a state dtype"), std::string::npos) << e.what();
  }
  try {
    AdamWOptions o = options(DType::F32, DType::F32);
    o.main_params_dtype = DType::F8E4M3;
    AdamW a(o, 4);
    FAIL() << "fp8 parameters accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("main_params_dtype fp8_e4m3 is not a parameter dtype"), std::string::npos)
        << e.what();
  }
}
