// Soft-capped cross-entropy (Grok 2's final_logit_softcapping, kernels/softcap.h) at the op level:
// the fp64 CPU kernel's gradient against finite differences, the fp32 CPU kernel against the
// reference backend's definition, over vocabulary chunks of a shard (c0 offsets) with a masked row
// and a re-based max (tensor-parallel shards). The model-level checks are in test_model_grads.cpp
// and moe/test_moe_model.cpp; the bf16 backend's in bf16/test_bf16_ops.cpp, CUDA's in
// gpu/test_fused.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/grad_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/reference_backend.h"
#include "kernels/softcap.h"

using namespace primus;

namespace {

constexpr int64_t kRows = 4, kVocab = 9, kShard0 = 20;  // this shard holds ids 20 .. 28
const std::vector<int64_t> kChunks{0, 4, 9};

Tensor targets_tensor() {
  Tensor t = Tensor::empty({kRows}, DType::I32);
  const int32_t ids[kRows] = {kShard0 + 3, -1, kShard0 + 8, 5};  // masked; 5: another shard's id
  for (int64_t i = 0; i < kRows; ++i) t.data<int32_t>()[i] = ids[i];
  return t;
}

Tensor filled(const std::vector<double>& v, DType dt) {
  Tensor t = Tensor::empty({kRows, kVocab}, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::F64)
      t.data<double>()[i] = v[i];
    else
      t.data<float>()[i] = float(v[i]);
  }
  return t;
}

// The chunked loss (sum over unmasked rows of lse - target logit) and its lse, with a global max
// above the local one as from other vocabulary shards.
double chunked_loss(ops::Backend& be, const Tensor& logits, const Tensor& targets, double cap, Tensor& lse) {
  const DType dt = logits.dtype();
  Tensor m = Tensor::empty({kRows}, dt), s = m.clone(), zt = m.clone();
  be.ce_init(m, s, zt);
  for (size_t k = 0; k + 1 < kChunks.size(); ++k) {
    const Tensor z = logits.slice(1, kChunks[k], kChunks[k + 1] - kChunks[k]).clone();
    be.ce_chunk_forward(z, targets, kShard0 + kChunks[k], cap, m, s, zt);
  }
  Tensor g = m.clone();
  for (int64_t i = 0; i < kRows; ++i) {
    if (dt == DType::F64)
      g.data<double>()[i] += 0.5;
    else
      g.data<float>()[i] += 0.5f;
  }
  be.ce_merge_max(m, s, g);
  return be.ce_finish(m, s, zt, targets, lse);
}

Tensor chunked_dlogits(ops::Backend& be, const Tensor& logits, const Tensor& lse, const Tensor& targets, double cap) {
  Tensor d = Tensor::zeros({kRows, kVocab}, logits.dtype());
  for (size_t k = 0; k + 1 < kChunks.size(); ++k) {
    const int64_t w = kChunks[k + 1] - kChunks[k];
    Tensor z = logits.slice(1, kChunks[k], w).clone();
    be.ce_chunk_backward(z, lse, targets, kShard0 + kChunks[k], cap, z);  // in place
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t j = 0; j < w; ++j) {
        const size_t at = size_t(i * kVocab + kChunks[k] + j), from = size_t(i * w + j);
        if (logits.dtype() == DType::F64)
          d.data<double>()[at] = z.data<double>()[from];
        else
          d.data<float>()[at] = z.data<float>()[from];
      }
  }
  return d;
}

}  // namespace

// The loss of cap * tanh(z / cap) as written out, and its gradient against finite differences.
TEST(Softcap, CrossEntropyFp64MatchesFiniteDifferences) {
  const double cap = 2.0;
  std::vector<double> z = test::random_vector(size_t(kRows * kVocab), 3, 3.0);
  const Tensor targets = targets_tensor();
  auto loss = [&] {
    Tensor lse = Tensor::empty({kRows}, DType::F64);
    return chunked_loss(cpu::cpu_backend(), filled(z, DType::F64), targets, cap, lse);
  };
  // Written out: sum over rows whose target this shard holds or not (every unmasked row) of
  // lse(capped row) - capped target logit (0 when another shard holds the target).
  double expected = 0;
  for (int64_t i = 0; i < kRows; ++i) {
    const int32_t t = targets.data<int32_t>()[i];
    if (t < 0) continue;
    double s = 0;
    for (int64_t j = 0; j < kVocab; ++j) s += std::exp(cap * std::tanh(z[size_t(i * kVocab + j)] / cap));
    expected += std::log(s) - (t >= kShard0 ? cap * std::tanh(z[size_t(i * kVocab + t - kShard0)] / cap) : 0.0);
  }
  EXPECT_NEAR(loss(), expected, 1e-12);
  Tensor lse = Tensor::empty({kRows}, DType::F64);
  chunked_loss(cpu::cpu_backend(), filled(z, DType::F64), targets, cap, lse);
  const Tensor d = chunked_dlogits(cpu::cpu_backend(), filled(z, DType::F64), lse, targets, cap);
  test::expect_grad_matches("softcapped dlogits", z.data(), d.data<double>(), z.size(), loss, 1e-6, 1e-9);
}

// The fp32 kernel (tanh through fast_exp) against the reference backend's (std::tanh), cap 5 on
// logits of scale 8: tanh's curve and both saturated ends.
TEST(Softcap, CrossEntropyFp32MatchesReference) {
  const double cap = 5.0;
  const std::vector<double> z = test::random_vector(size_t(kRows * kVocab), 4, 8.0);
  const Tensor targets = targets_tensor(), logits = filled(z, DType::F32);
  cpu::ReferenceBackend ref;
  Tensor lse1 = Tensor::empty({kRows}, DType::F32), lse2 = lse1.clone();
  const double l1 = chunked_loss(cpu::cpu_backend(), logits, targets, cap, lse1);
  const double l2 = chunked_loss(ref, logits, targets, cap, lse2);
  EXPECT_NEAR(l1, l2, 1e-5 * std::fabs(l2));
  for (int64_t i = 0; i < kRows; ++i) EXPECT_NEAR(lse1.data<float>()[i], lse2.data<float>()[i], 1e-5) << i;
  const Tensor d1 = chunked_dlogits(cpu::cpu_backend(), logits, lse2, targets, cap);
  const Tensor d2 = chunked_dlogits(ref, logits, lse2, targets, cap);
  for (int64_t i = 0; i < kRows * kVocab; ++i) EXPECT_NEAR(d1.data<float>()[i], d2.data<float>()[i], 2e-6) << i;
  for (int64_t j = 0; j < kVocab; ++j) EXPECT_EQ(d1.data<float>()[kVocab + j], 0.0f);  // the masked row
  // Soft-capping changed the loss.
  Tensor lse3 = lse1.clone();
  EXPECT_GT(std::fabs(chunked_loss(ref, logits, targets, 0.0, lse3) - l2), 1.0);
}

TEST(Softcap, FastTanhIsAccurate) {
  for (float x = -50.f; x < 50.f; x += 0.0731f) ASSERT_NEAR(cpu::fast_tanh(x), std::tanh(x), 3e-7f) << x;
  EXPECT_EQ(cpu::fast_tanh(1e30f), 1.0f);
  EXPECT_EQ(cpu::fast_tanh(-1e30f), -1.0f);
  EXPECT_EQ(ops::softcap(3.0, 0.0), 3.0);  // cap 0: none
  EXPECT_EQ(ops::softcap_slope(3.0, 0.0), 1.0);
}
