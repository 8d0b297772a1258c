// The precision-aware optimizer's scaled states (optim/adamw.h; docs/optim.md#low-precision-optimizer-state):
// fp16 and FP8 E4M3 moments and the fp16 master, kept as Transformer Engine's FusedAdam keeps them.
// Each stored moment is the fp32 optimizer's moment of the same step times the segment's scale,
// rounded to the format (fp16: to nearest even, E4M3: to nearest even, saturating), read back times
// the dequantizing factor; the scale follows each step's amax. The oracles here are independent of
// the code under test: the CPU's F16C conversion for fp16, kernels/fp8.h's frexp-based round() for
// E4M3, and TE's formulas written out again.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/adam_state.h"
#include "kernels/fp8.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "support/adamw_steps.h"

using namespace primus;

namespace adamw_scaled_test {

uint32_t u32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// TE's scaling of a tensor (fused_adam.py _apply_scale), written out: the code of x is x * quant
// rounded to the format, its value code * dequant.
struct Te {
  float quant, dequant;
};
Te te_fp16(float amax) {
  const float s = amax / 32752.0f;  // torch.finfo(torch.float16).max / 2
  return {s > 0 ? 1.0f / s : 0.0f, s};
}
Te te_e4m3(float amax) {
  const float s = amax / 448.0f;
  if (s == 0) return {0, 0};  // TE: 0 * (1 / 0) = NaN; here zeros stay zeros (docs/optim.md)
  const float q = 1.0f / s;
  return {q, 1.0f / q};
}
float fp16_round(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }
float e4m3_round(float x) { return fp8::round(x, fp8::Format::E4M3); }

// The value TE stores for x in a tensor of scaling t.
float te_value(DType d, float x, const Te& t) {
  return d == DType::F16 ? fp16_round(x * t.quant) * t.dequant : e4m3_round(x * t.quant) * t.dequant;
}
Te te_scaling(DType d, float amax) { return d == DType::F16 ? te_fp16(amax) : te_e4m3(amax); }

float amax(const float* x, int64_t n) {
  float a = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return NAN;
    a = std::max(a, std::fabs(x[i]));
  }
  return a;
}

std::vector<float> scaled_gradient(int64_t n, int step, double spread = 4.0) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    g[size_t(i)] = float(std::sin(0.37 * double(i + 1) * double(step + 3)) * std::pow(10.0, double(i % 5) - spread));
  return g;
}

}  // namespace adamw_scaled_test

using namespace adamw_scaled_test;

// Six steps of a scaled-state optimizer, each against an fp32-state optimizer started from the
// same (dequantized) moments and parameters: every stored moment is TE's value of the fp32 moment
// with the scale of its segment's amax, bit for bit; the parameters are the fp32 optimizer's, bit
// for bit (the update reads the moments before they are stored); the largest code of a segment is
// the format's range (32752, 448), so the scale follows the amax every step.
TEST(AdamWScaled, EachStoredMomentIsTheFp32UpdateScaledAndRounded) {
  const int64_t n = 1000;
  const std::vector<ParamSegment> segs = {{"w", 0, 600, true}, {"b", 600, 300, false}, {"n", 900, 100, false}};
  const std::pair<DType, DType> kinds[] = {{DType::F16, DType::F16},
                                           {DType::F8E4M3, DType::F8E4M3},
                                           {DType::F8E4M3, DType::F16},
                                           {DType::F32, DType::F8E4M3},
                                           {DType::BF16, DType::F16}};
  for (const auto& [md, vd] : kinds) {
    SCOPED_TRACE(std::string("exp_avg ") + dtype_name(md) + ", exp_avg_sq " + dtype_name(vd));
    AdamW low(test::adamw_options(md, vd), n);
    std::vector<float> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[size_t(i)] = float(std::cos(double(i))) * 0.05f;
    int changed = 0;  // moments the storage changed: the test must see many
    test::step_beside_fp32(
        low, p, segs, 1e-3, 6, [&](int step) { return scaled_gradient(n, step); },
        [&](const test::StepBesideFp32& st) {
          for (const ParamSegment& s : segs) {
            for (int which = 0; which < 2; ++which) {
              const DType d = which == 0 ? md : vd;
              const float* want = (which == 0 ? st.fp32.exp_avg() : st.fp32.exp_avg_sq()) + s.offset;
              const float* got = (which == 0 ? st.exp_avg : st.exp_avg_sq).data() + s.offset;
              if (!scaled_state(d)) continue;  // fp32 / bf16: test_adamw.cpp, test_adamw_bf16.cpp
              const Te t = te_scaling(d, amax(want, s.numel));
              bool at_range = false;
              for (int64_t i = 0; i < s.numel; ++i) {
                ASSERT_EQ(u32(got[i]), u32(te_value(d, want[i], t)))
                    << (which ? "exp_avg_sq" : "exp_avg") << "[" << s.offset + i << "] step " << st.step << ": fp32 "
                    << want[i];
                const float code = d == DType::F16 ? fp16_round(want[i] * t.quant) : e4m3_round(want[i] * t.quant);
                at_range |= std::fabs(code) == (d == DType::F16 ? 32752.0f : 448.0f);
                changed += got[i] != want[i];
              }
              EXPECT_TRUE(at_range) << "the largest code of segment " << s.name << " is the format's range";
            }
          }
        });
    EXPECT_GT(changed, 1000);
  }
}

// One step by hand: beta1 0.5 (so that m = g / 2 exactly), gradients 1, -0.5 and 0.2 in one
// segment. E4M3: amax 0.5, s = 0.5 / 448, codes 0.5 s^-1 = 448, -224, and 0.1 s^-1 = 89.6, which
// E4M3 (8 apart between 64 and 128) rounds to 88; the values 448 d, -224 d, 88 d with d = 1 / (1 / s),
// about 0.5, -0.25 and 0.098214. fp16: s = 0.5 / 32752, codes 32752, -16376 and 6550.4, which fp16
// (4 apart between 4096 and 8192) rounds to 6552; values about 0.5, -0.25 and 0.100024.
TEST(AdamWScaled, OneStepByHand) {
  for (const DType d : {DType::F8E4M3, DType::F16}) {
    AdamWOptions o{0.5, 0.5, 1e-8, 0.0};
    o.exp_avg_dtype = d;
    AdamW a(o, 3);
    std::vector<float> p = {0, 0, 0};
    const float g[3] = {1.0f, -0.5f, 0.2f};
    a.step(p.data(), g, {{"w", 0, 3, false}}, 1e-3);
    const std::vector<float> m = test::adamw_moment(a, false);
    const float s = 0.5f / (d == DType::F16 ? 32752.0f : 448.0f);
    const float dq = d == DType::F16 ? s : 1.0f / (1.0f / s);
    const float codes[2][3] = {{448, -224, 88}, {32752, -16376, 6552}};
    const float approx[2][3] = {{0.5f, -0.25f, 0.0982143f}, {0.5f, -0.25f, 0.1000244f}};
    const int k = d == DType::F16;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(m[size_t(i)], codes[k][i] * dq) << dtype_name(d) << " exp_avg[" << i << "]";
      EXPECT_NEAR(m[size_t(i)], approx[k][i], 1e-6) << dtype_name(d) << " exp_avg[" << i << "]";
    }
  }
}

// TE's NaN and inf: a NaN (or inf) in a segment's updated moment makes its amax, so its scale, NaN
// (inf), and every value read back from the segment NaN (TE's fp16: codes x * 0 and factor NaN /
// inf; E4M3: x * NaN, x * 0 with factor 1/0); the other segments keep theirs. The parameters'
// update of that step reads the fp32 moments, so only the element with the NaN gradient turns
// NaN then; every parameter of the segment does at the next step. An all-zero segment keeps zero
// moments (E4M3's 0 * (1 / 0) is NaN in TE: docs/optim.md) and its parameters stay finite.
TEST(AdamWScaled, NanAndInfAsTransformerEngine) {
  for (const DType d : {DType::F16, DType::F8E4M3}) {
    for (const float bad : {NAN, INFINITY}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (std::isnan(bad) ? " NaN" : " inf"));
      AdamW a(test::adamw_options(d, d), 12);
      const std::vector<ParamSegment> segs = {{"a", 0, 4, true}, {"b", 4, 4, true}, {"zero", 8, 4, true}};
      std::vector<float> p(12, 0.5f);
      std::vector<float> g = {0.1f, bad, -0.2f, 0.3f, 0.1f, 0.2f, -0.3f, 0.4f, 0, 0, 0, 0};
      a.step(p.data(), g.data(), segs, 1e-3);
      const std::vector<float> m = test::adamw_moment(a, false), v = test::adamw_moment(a, true);
      for (int i = 0; i < 4; ++i) {
        EXPECT_TRUE(std::isnan(m[size_t(i)]) && std::isnan(v[size_t(i)])) << i;
        EXPECT_EQ(std::isnan(p[size_t(i)]), i == 1) << i;
      }
      for (int i = 4; i < 12; ++i) {
        EXPECT_TRUE(std::isfinite(m[size_t(i)]) && std::isfinite(v[size_t(i)]) && std::isfinite(p[size_t(i)])) << i;
        if (i >= 8) {
          EXPECT_EQ(m[size_t(i)], 0.0f) << i;
        }
      }
      g[1] = 0.2f;
      a.step(p.data(), g.data(), segs, 1e-3);
      for (int i = 0; i < 12; ++i) EXPECT_EQ(std::isnan(p[size_t(i)]), i < 4) << i;
    }
  }
}

// A checkpoint holds a scaled state's values in fp32; a load recomputes each segment's scale from
// them (TE's set_scaled_state) and stores the same codes. E4M3's dequantizing factor 1 / (1 / s)
// does not always survive that (the values' amax is 448 times the factor, rounded): this happens
// for some of these 1000 segments of random amaxes, and the load keeps the saved factor there, so
// the values read back and the step after are bit for bit those of the uninterrupted state.
TEST(AdamWScaled, LoadsBackBitForBit) {
  const int64_t segments = 1000, each = 4, n = segments * each;
  std::vector<ParamSegment> segs;
  for (int64_t s = 0; s < segments; ++s) segs.push_back({"t" + std::to_string(s), s * each, each, true});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-20.0f, 4.0f);
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t s = 0; s < segments; ++s) {
    const float scale = std::exp2(e(rng));
    for (int64_t i = 0; i < each; ++i) g[size_t(s * each + i)] = u(rng) * scale;
  }
  for (const auto& [md, vd] : {std::pair{DType::F8E4M3, DType::F8E4M3}, {DType::F16, DType::F16}}) {
    SCOPED_TRACE(dtype_name(md));
    AdamW a(test::adamw_options(md, vd), n);
    std::vector<float> p(static_cast<size_t>(n), 0.1f);
    for (int step = 0; step < 2; ++step) a.step(p.data(), g.data(), segs, 1e-3);
    const std::vector<float> m = test::adamw_moment(a, false), v = test::adamw_moment(a, true);
    AdamW b(test::adamw_options(md, vd), n);
    b.set_state(a.step_count(), m.data(), v.data(), &segs);
    const std::vector<float> m2 = test::adamw_moment(b, false), v2 = test::adamw_moment(b, true);
    int te_moves = 0;  // segments whose TE-recomputed factor would not give the saved values back
    for (int64_t s = 0; s < segments; ++s) {
      const float* x = m.data() + s * each;
      const Te t = te_scaling(md, amax(x, each));
      for (int64_t i = 0; i < each; ++i)
        if (te_value(md, x[i], t) != x[i]) {
          ++te_moves;
          break;
        }
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(u32(m2[size_t(i)]), u32(m[size_t(i)])) << "exp_avg[" << i << "]";
      ASSERT_EQ(u32(v2[size_t(i)]), u32(v[size_t(i)])) << "exp_avg_sq[" << i << "]";
    }
    if (md == DType::F8E4M3) {
      EXPECT_GT(te_moves, 0) << "the recomputed factor moved in no segment: nothing was tested";
    }
    std::printf("[ info     ] %s: TE's recomputed scale would move %d of %lld segments' values\n", dtype_name(md),
                te_moves, static_cast<long long>(segments));
    std::vector<float> pa = p, pb = p;
    a.step(pa.data(), g.data(), segs, 1e-3);
    b.step(pb.data(), g.data(), segs, 1e-3);
    const std::vector<float> ma = test::adamw_moment(a, false), mb = test::adamw_moment(b, false);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(u32(pa[size_t(i)]), u32(pb[size_t(i)])) << "param[" << i << "]";
      ASSERT_EQ(u32(ma[size_t(i)]), u32(mb[size_t(i)])) << "exp_avg[" << i << "]";
    }
  }
}

// An fp32 checkpoint loads into a scaled state as TE's load does (each segment's values times its
// recomputed scale, rounded), and a scaled state's values load exactly into fp32 and bf16 ones.
TEST(AdamWScaled, LoadsFromAndIntoOtherDtypes) {
  const std::vector<ParamSegment> segs = {{"w", 0, 5, true}, {"b", 5, 3, false}};
  const std::vector<float> m = {0.3f, -1e-3f, 2.5e-5f, 0.7f, -0.2f, 1e-6f, -3e-6f, 2e-7f};
  const std::vector<float> v = {1e-2f, 3e-4f, 0.0f, 5e-1f, 7e-3f, 1e-12f, 4e-11f, 9e-13f};
  for (const DType d : {DType::F16, DType::F8E4M3}) {
    AdamW a(test::adamw_options(d, d), 8);
    a.set_state(3, m.data(), v.data(), &segs);
    const std::vector<float> mm = test::adamw_moment(a, false), vv = test::adamw_moment(a, true);
    for (const ParamSegment& s : segs) {
      const Te tm = te_scaling(d, amax(m.data() + s.offset, s.numel));
      const Te tv = te_scaling(d, amax(v.data() + s.offset, s.numel));
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        EXPECT_EQ(u32(mm[size_t(i)]), u32(te_value(d, m[size_t(i)], tm))) << dtype_name(d) << " exp_avg " << i;
        EXPECT_EQ(u32(vv[size_t(i)]), u32(te_value(d, v[size_t(i)], tv))) << dtype_name(d) << " exp_avg_sq " << i;
      }
    }
    for (const DType to : {DType::F32, DType::BF16}) {
      AdamW b(test::adamw_options(to, to), 8);
      b.set_state(3, mm.data(), vv.data());
      const std::vector<float> back = test::adamw_moment(b, false);
      for (size_t i = 0; i < 8; ++i)
        EXPECT_EQ(back[i], to == DType::F32 ? mm[i] : bf16::from_float(mm[i]).to_float()) << i;
    }
  }
  AdamW a(test::adamw_options(DType::F16, DType::F32), 8);
  try {
    a.set_state(3, m.data(), v.data());
    FAIL() << "a scaled state loaded without its segments";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a load needs the segments"), std::string::npos) << e.what();
  }
  std::vector<float> p(8, 0.f), g(8, 0.1f);
  a.step(p.data(), g.data(), segs, 1e-3);
  try {
    a.step(p.data(), g.data(), {{"all", 0, 8, true}}, 1e-3);
    FAIL() << "the segments of a scaled state changed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keep one scale per segment"), std::string::npos) << e.what();
  }
}

// TE's fp16 master weights (main_params_dtype fp16): each step reads a segment's master as its
// parameters stored in fp16 with the scale of their amax (TE quantizes the master from the fp32
// update after every step; here the buffer keeps that fp32 update, so the next step quantizes the
// same values with the same scale), and stores the fp32 update, whose bf16 rounding is the working
// copy (TE's model weights). Against an fp32 optimizer stepping the fp16 values.
TEST(AdamWScaled, Fp16MasterIsTheScaledFp16ValueOfTheParameters) {
  const int64_t n = 700;
  const std::vector<ParamSegment> segs = {{"w", 0, 500, true}, {"b", 500, 200, false}};
  AdamW low(test::adamw_options(DType::F32, DType::F32, DType::F16), n),
      ref(test::adamw_options(DType::F32, DType::F32), n);
  std::vector<float> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = float(std::sin(double(i) * 0.7)) * (i < 500 ? 0.02f : 1.0f);
  std::vector<bf16> working(static_cast<size_t>(n));
  int moved = 0;
  for (int step = 1; step <= 4; ++step) {
    std::vector<float> pr = p;
    for (const ParamSegment& s : segs) {
      const Te t = te_fp16(amax(p.data() + s.offset, s.numel));
      for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
        pr[size_t(i)] = fp16_round(p[size_t(i)] * t.quant) * t.dequant;
        moved += pr[size_t(i)] != p[size_t(i)];
      }
    }
    const std::vector<float> g = scaled_gradient(n, step, 3.0);
    low.step(p.data(), g.data(), segs, 1e-2, working.data());
    ref.step(pr.data(), g.data(), segs, 1e-2);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(u32(p[size_t(i)]), u32(pr[size_t(i)])) << "param[" << i << "] step " << step;
      ASSERT_EQ(working[size_t(i)].bits, bf16::from_float(pr[size_t(i)]).bits) << "working[" << i << "]";
    }
  }
  EXPECT_GT(moved, 500) << "the fp16 master changed too few values to test it";
}

// The state's bytes: the codes' sizes, and one fp32 scale per segment and scaled moment.
TEST(AdamWScaled, StateBytes) {
  EXPECT_EQ(adamw_state_bytes_per_param(test::adamw_options(DType::F8E4M3, DType::F8E4M3)), 2);
  EXPECT_EQ(adamw_state_bytes_per_param(test::adamw_options(DType::F8E4M3, DType::F16)), 3);
  EXPECT_EQ(adamw_state_bytes(test::adamw_options(DType::F8E4M3, DType::F16), 1000, 7), 3000 + 7 * 8);
  EXPECT_EQ(adamw_state_bytes(test::adamw_options(DType::BF16, DType::F16), 1000, 7), 4000 + 7 * 4);
  FlatAdamW f(test::adamw_options(DType::F8E4M3, DType::F8E4M3),
              {{"w", 0, 10, true}, {"e", 10, 0, true}, {"b", 10, 6, false}}, 16, Device::CPU);
  EXPECT_EQ(f.state_bytes(), 32 + 2 * 8);
}

// The scalar rules against their oracles over many values: fp16 against the CPU's F16C conversion
// (every fp32 exponent, subnormal results, ties, overflow), and the fp16 values back.
TEST(AdamWScaled, Fp16ConversionIsIeee) {
  std::mt19937 rng(3);
  for (int k = 0; k < 200000; ++k) {
    const uint32_t b = uint32_t(rng());
    float x;
    std::memcpy(&x, &b, 4);
    if (std::isnan(x)) continue;
    const uint16_t want = _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(adam_state::f16_bits(x), want) << x;
    ASSERT_EQ(u32(adam_state::f16_value(want)), u32(_cvtsh_ss(want))) << want;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu)) continue;  // NaN
    const float x = _cvtsh_ss(uint16_t(h));
    ASSERT_EQ(adam_state::f16_bits(x), h);
    const float mid = std::nextafter(x, INFINITY);  // just above: rounds to h unless at a boundary
    ASSERT_EQ(adam_state::f16_bits(mid), _cvtss_sh(mid, _MM_FROUND_TO_NEAREST_INT)) << h;
  }
  EXPECT_TRUE(std::isnan(adam_state::f16_value(adam_state::f16_bits(NAN))));
}
