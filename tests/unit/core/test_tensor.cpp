#include <gtest/gtest.h>

#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"

using namespace primus;

TEST(Tensor, AlignedContiguousStorage) {
  Tensor t = Tensor::zeros({3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.strides(), (Shape{5, 1}));
  EXPECT_EQ(t.nbytes(), 60u);
}

TEST(Tensor, SliceSharesStorageAndCopyRespectsStrides) {
  Tensor t = Tensor::empty({4, 3});
  float* p = t.data<float>();
  for (int i = 0; i < 12; ++i) p[i] = static_cast<float>(i);
  Tensor col = t.slice(1, 1, 2);  // columns 1..2, non-contiguous
  EXPECT_FALSE(col.is_contiguous());
  Tensor c = col.clone();
  ASSERT_TRUE(c.is_contiguous());
  const float* q = c.data<float>();
  EXPECT_EQ(q[0], 1.f);
  EXPECT_EQ(q[1], 2.f);
  EXPECT_EQ(q[2], 4.f);
  EXPECT_EQ(q[7], 11.f);
  Tensor rows = t.slice(0, 2, 2);
  rows.data<float>()[0] = 100.f;  // writes through to t
  EXPECT_EQ(p[6], 100.f);
}

TEST(Tensor, ViewInfersAndRejectsMismatch) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.view({6, -1}).shape(), (Shape{6, 4}));
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.data<double>(), Error);
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(bf16::from_float(1.0f).to_float(), 1.0f);
  // 1 + 2^-8 lies exactly between two bf16 values; ties go to the even one (1.0).
  EXPECT_EQ(bf16::from_float(1.0f + 0x1.0p-8f).to_float(), 1.0f);
  EXPECT_EQ(bf16::from_float(1.0f + 0x1.8p-8f).to_float(), 1.0f + 0x1.0p-7f);
}

TEST(Rng, DeterministicAndIndexable) {
  Rng a(42), b(42), c(43);
  EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(Rng(42).next_u64(), c.next_u64());
  Rng d(7);
  double s = 0, s2 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double x = d.normal_at(i);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.03);
  EXPECT_NEAR(s2 / n, 1.0, 0.03);
}
