// Every expected value here is worked out by hand from the formats' definitions (kernels/fp8.h):
// E4M3 has quanta 2^(e-3) in the binade [2^e, 2^(e+1)) and 2^-9 below 2^-6; E5M2 2^(e-2) and 2^-16.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>
#include <xmmintrin.h>

#include "kernels/fp8.h"

namespace primus::fp8 {
namespace {

TEST(Fp8, E4M3RoundsToNearestEvenAndSaturates) {
  const Format f = Format::E4M3;
  EXPECT_EQ(round(448.0f, f), 448.0f);
  EXPECT_EQ(round(449.0f, f), 448.0f);       // past the largest finite value: saturated
  EXPECT_EQ(round(1e9f, f), 448.0f);
  EXPECT_EQ(round(INFINITY, f), 448.0f);     // satfinite
  EXPECT_EQ(round(-INFINITY, f), -448.0f);
  EXPECT_TRUE(std::isnan(round(NAN, f)));
  EXPECT_EQ(round(432.0f, f), 448.0f);       // 13.5 quanta of 32: the tie goes to 14 (even)
  EXPECT_EQ(round(400.0f, f), 384.0f);       // 12.5 quanta: to 12
  EXPECT_EQ(round(1.0625f, f), 1.0f);        // halfway between 1 (mantissa 000) and 1.125 (001)
  EXPECT_EQ(round(1.1875f, f), 1.25f);       // halfway between 1.125 (001) and 1.25 (010)
  EXPECT_EQ(round(1.07f, f), 1.125f);
  EXPECT_EQ(round(-3.3f, f), -3.25f);
  EXPECT_EQ(round(250.0f, f), 256.0f);
  // Subnormals: quanta of 2^-9.
  const float sub = std::ldexp(1.0f, -9);
  EXPECT_EQ(round(sub, f), sub);
  EXPECT_EQ(round(0.5f * sub, f), 0.0f);        // a tie between 0 and 1 quantum: 0
  EXPECT_EQ(round(1.5f * sub, f), 2.0f * sub);  // between 1 and 2: 2
  EXPECT_EQ(round(2.5f * sub, f), 2.0f * sub);  // between 2 and 3: 2
  EXPECT_EQ(round(0.75f * sub, f), sub);
  EXPECT_EQ(round(7.0f * sub, f), 7.0f * sub);  // the largest subnormal
  EXPECT_TRUE(std::signbit(round(-0.0f, f)));
  EXPECT_TRUE(std::signbit(round(-0.1f * sub, f)));  // rounds to -0
}

TEST(Fp8, E4M3Bits) {
  const Format f = Format::E4M3;
  EXPECT_EQ(encode(448.0f, f), 0x7E);  // 0 1111 110
  EXPECT_EQ(encode(-3.25f, f), 0xC5);  // 1 1000 101: 1.625 x 2^1
  EXPECT_EQ(encode(std::ldexp(1.0f, -9), f), 0x01);
  EXPECT_EQ(encode(7.0f * std::ldexp(1.0f, -9), f), 0x07);
  EXPECT_EQ(encode(std::ldexp(1.0f, -6), f), 0x08);  // the smallest normal
  EXPECT_EQ(encode(1.0f, f), 0x38);
  EXPECT_EQ(encode(NAN, f), 0x7F);
  EXPECT_EQ(decode(0x7E, f), 448.0f);
  EXPECT_EQ(decode(0xC5, f), -3.25f);
  EXPECT_EQ(decode(0x01, f), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(decode(0x7F, f)));
  EXPECT_TRUE(std::isnan(decode(0xFF, f)));
  for (int b = 0; b < 256; ++b) {  // every value survives the round trip
    const float v = decode(uint8_t(b), f);
    if (std::isnan(v)) continue;
    EXPECT_EQ(encode(v, f), uint8_t(b)) << b;
    EXPECT_EQ(round(v, f), v) << b;
  }
}

TEST(Fp8, E5M2RoundsSaturatesAndKeepsInfinityInItsBits) {
  const Format f = Format::E5M2;
  EXPECT_EQ(round(57344.0f, f), 57344.0f);
  EXPECT_EQ(round(61440.0f, f), 57344.0f);
  EXPECT_EQ(round(INFINITY, f), 57344.0f);
  EXPECT_EQ(round(1.125f, f), 1.0f);   // between 1.0 (00) and 1.25 (01)
  EXPECT_EQ(round(1.375f, f), 1.5f);   // between 1.25 (01) and 1.5 (10)
  const float sub = std::ldexp(1.0f, -16);
  EXPECT_EQ(round(0.5f * sub, f), 0.0f);
  EXPECT_EQ(round(1.5f * sub, f), 2.0f * sub);
  EXPECT_EQ(encode(57344.0f, f), 0x7B);  // 0 11110 11
  EXPECT_EQ(decode(0x7C, f), INFINITY);
  EXPECT_EQ(decode(0xFC, f), -INFINITY);
  EXPECT_TRUE(std::isnan(decode(0x7D, f)));
  EXPECT_EQ(decode(0x01, f), sub);
  for (int b = 0; b < 256; ++b) {
    const float v = decode(uint8_t(b), f);
    if (std::isnan(v) || std::isinf(v)) continue;
    EXPECT_EQ(encode(v, f), uint8_t(b)) << b;
  }
}

// The vectorized rounding gives round()'s bits for every kind of input.
TEST(Fp8, ArrayRoundingMatchesScalarRounding) {
  std::vector<float> x = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 448.0f, 449.0f, 57344.0f, 61440.0f, 1e-45f, -1e-30f,
                          std::ldexp(1.0f, -9), std::ldexp(1.5f, -9), std::ldexp(1.0f, -16), std::ldexp(1.5f, -17)};
  uint64_t r = 88172645463325252ull;
  for (int i = 0; i < 200000; ++i) {  // every exponent, random mantissas and signs
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const uint32_t bits = uint32_t(r);
    float v;
    std::memcpy(&v, &bits, sizeof v);
    x.push_back(v);
  }
  for (Format f : {Format::E4M3, Format::E5M2}) {
    std::vector<float> out(x.size());
    round_array(x.data(), 1.0f, 1.0f, int64_t(x.size()), f, out.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = round(x[i], f);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[i])) << x[i];
        continue;
      }
      uint32_t a, b;
      std::memcpy(&a, &want, 4);
      std::memcpy(&b, &out[i], 4);
      ASSERT_EQ(a, b) << format_name(f) << " " << x[i] << ": " << want << " vs " << out[i];
    }
  }
}

TEST(Fp8, ScalesFromAmax) {
  EXPECT_FLOAT_EQ(scale_from_amax(10.0f, 448.0f, false), 44.8f);
  EXPECT_EQ(scale_from_amax(10.0f, 448.0f, true), 32.0f);  // 44.8's power of two below
  EXPECT_EQ(scale_from_amax(0.0f, 448.0f, false), 1.0f);
  EXPECT_EQ(scale_from_amax(INFINITY, 448.0f, false), 1.0f);
  EXPECT_EQ(scale_from_amax(NAN, 448.0f, true), 1.0f);
  EXPECT_EQ(scale_from_amax(1e-40f, 448.0f, false), FLT_MAX);  // the quotient overflows
  EXPECT_EQ(scale_from_amax(1e-40f, 448.0f, true), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_of(1.0f), 127);
  EXPECT_EQ(e8m0_of(1.5f), 128);  // rounded up
  EXPECT_EQ(e8m0_of(3.0f), 129);
  EXPECT_EQ(e8m0_of(0.5f), 126);
  EXPECT_EQ(e8m0_of(0.0f), 0);
  EXPECT_EQ(e8m0_of(NAN), 0xFF);
  EXPECT_EQ(e8m0_value(127), 1.0f);
  EXPECT_EQ(e8m0_value(122), 1.0f / 32.0f);
}

TEST(Fp8, TensorScalingGivesTheFp8ValuesAndTheAmax) {
  const std::vector<float> x = {1.0f, -2.0f, 500.0f};
  std::vector<float> out(3);
  EXPECT_EQ(quantize(x.data(), 1, 3, Format::E4M3, Granularity::Tensor, true, 0.5f, out.data()), 500.0f);
  EXPECT_EQ(out, (std::vector<float>{0.5f, -1.0f, 256.0f}));  // 250 rounds to 256 (quanta of 16)
  const std::vector<float> y = {1.0f, NAN};
  EXPECT_TRUE(std::isnan(quantize(y.data(), 1, 2, Format::E4M3, Granularity::Tensor, true, 1.0f, out.data())));
}

// A row of 130: a tile of 128 and a ragged tile of 2, each with its own power-of-two scale.
TEST(Fp8, BlockwiseTilesAlongTheReductionWithRaggedEdges) {
  std::vector<float> x(130, 0.1f);
  x[0] = 3.0f;
  x[2] = 1e-5f;
  x[128] = 0.001f;
  x[129] = -0.0005f;
  std::vector<float> out(130);
  EXPECT_EQ(quantize(x.data(), 1, 130, Format::E4M3, Granularity::Tile1x128, true, 0, out.data()), 3.0f);
  // Tile 1: amax 3, scale 448 / 3 = 149.3 -> 128; 0.1 x 128 = 12.8 -> 13.
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], 13.0f / 128.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -16));  // 0.00128: 0.66 of a subnormal quantum 2^-9 -> 1, / 128
  // Tile 2: amax 0.001, scale 448000 -> 2^18; 262.144 -> 256 (quanta of 32), -131.072 -> -128.
  EXPECT_EQ(out[128], 256.0f / 262144.0f);
  EXPECT_EQ(out[129], -128.0f / 262144.0f);
  // The same values as a column, tiled along the rows.
  std::vector<float> col(130);
  EXPECT_EQ(quantize(x.data(), 130, 1, Format::E4M3, Granularity::Tile1x128, false, 0, col.data()), 3.0f);
  EXPECT_EQ(col, out);
  // Tiled along the other dimension, every element is its own tile and keeps 3 mantissa bits:
  // 1e-5 alone has scale 4.48e7 -> 2^25, 335.5 -> 320 (quanta of 32).
  std::vector<float> own(130);
  quantize(x.data(), 1, 130, Format::E4M3, Granularity::Tile1x128, false, 0, own.data());
  EXPECT_EQ(own[2], 320.0f * std::ldexp(1.0f, -25));
}

TEST(Fp8, Blocks128x128) {
  // 130 x 130: four blocks; the last row and column belong to the ragged ones.
  std::vector<float> x(130 * 130, 1.0f), out(x.size());
  x[0] = 100.0f;              // block (0, 0): amax 100, scale 4.48 -> 4
  x[129 * 130 + 129] = 0.3f;  // block (1, 1), a 2 x 2 corner: amax 1, scale 448 -> 256
  quantize(x.data(), 130, 130, Format::E4M3, Granularity::Block128, true, 0, out.data());
  EXPECT_EQ(out[0], 96.0f);    // 400 is 12.5 quanta of 32: the tie goes to 12, 384 / 4
  EXPECT_EQ(out[1], 1.0f);     // 4 exact
  EXPECT_EQ(out[128], 1.0f);   // block (0, 1): amax 1, scale 256, exact
  EXPECT_EQ(out[129 * 130 + 129], 80.0f / 256.0f);  // 76.8 is 9.6 quanta of 8: 10
}

TEST(Fp8, Mxfp8BlocksOf32WithE8M0Scales) {
  std::vector<float> x(40, 1.0f), out(40);
  x[0] = 10.0f;
  x[1] = 0.3f;
  for (int i = 32; i < 40; ++i) x[size_t(i)] = 0.0f;
  quantize(x.data(), 1, 40, Format::E4M3, Granularity::Mx32, true, 0, out.data());
  // amax 10: 10 / 448 = 0.0223 rounds up to 2^-5, so the elements are x * 32: 320, 9.6 -> 10, 32.
  EXPECT_EQ(out[0], 10.0f);
  EXPECT_EQ(out[1], 10.0f / 32.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[35], 0.0f);  // an all-zero block
}

// Under flush-to-zero (as training runs), an all-zero block's E8M0 scale 2^-127 is a denormal:
// its elements must stay 0, not become 0 / 0.
TEST(Fp8, AllZeroBlocksStayZeroUnderFlushToZero) {
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040);  // FTZ and DAZ
  std::vector<float> x(64, 0.0f), out(64, 1.0f);
  for (Granularity g : {Granularity::Mx32, Granularity::Tile1x128, Granularity::Block128})
    for (bool rc : {true, false}) {
      quantize(x.data(), 8, 8, Format::E5M2, g, rc, 0, out.data());
      for (float v : out) ASSERT_EQ(v, 0.0f) << granularity_name(g) << " " << rc;
    }
  _mm_setcsr(csr);
}

TEST(Fp8, DelayedScalingRollsItsHistory) {
  DelayedScale d(3);
  d.record(2.0f);
  d.record(1.0f);
  EXPECT_EQ(d.history, (std::vector<float>{2, 0, 0}));
  d.update(AmaxAlgo::Max, 448.0f);
  EXPECT_EQ(d.scale, 224.0f);
  EXPECT_EQ(d.history, (std::vector<float>{0, 0, 2}));
  d.record(4.0f);
  d.update(AmaxAlgo::MostRecent, 448.0f);
  EXPECT_EQ(d.scale, 112.0f);
  EXPECT_EQ(d.history, (std::vector<float>{0, 2, 4}));
  d.update(AmaxAlgo::Max, 448.0f);  // the max of the history: 4
  EXPECT_EQ(d.scale, 112.0f);
  EXPECT_EQ(d.history, (std::vector<float>{0, 4, 0}));
  d.update(AmaxAlgo::Max, 224.0f);  // a margin of 1
  EXPECT_EQ(d.scale, 56.0f);
  EXPECT_EQ(d.history, (std::vector<float>{0, 0, 0}));  // the 4 has rolled out
  d.update(AmaxAlgo::Max, 448.0f);  // nothing recorded: the scale stays
  EXPECT_EQ(d.scale, 56.0f);
  d.record(NAN);
  d.update(AmaxAlgo::MostRecent, 448.0f);  // not finite: kept
  EXPECT_EQ(d.scale, 56.0f);
  d.record(1e-40f);
  d.update(AmaxAlgo::MostRecent, 448.0f);
  EXPECT_EQ(d.scale, FLT_MAX);
}

}  // namespace
}  // namespace primus::fp8
