// Packed SFT trains as unpacked SFT: the same conversations, one per sequence or packed first-fit
// decreasing with use_packed_attention (tests/support/sft_packed_batches.h: the real SftDataset
// and microbatch fill), all in one microbatch, give the same loss and the same gradients: to fp32
// resolution on the CPU fp32 backend, to bf16 resolution on the CPU bf16 backend. Packing without
// use_packed_attention (attention across the conversations) does not (the check can fail).
#include <gtest/gtest.h>

#include <cmath>

#include "../bf16/skip_without_bf16.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "support/relative_error.h"
#include "support/sft_packed_batches.h"
#include "support/tiny_spec.h"

using namespace primus;

namespace {

constexpr int kConversations = 8;
constexpr int64_t kUnpackedSeq = 255, kPackedSeq = 511;  // every conversation fits 256 tokens

ModelSpec sft_spec() {  // vocabulary 259: the byte-level tokenizer's
  return test::tiny_llama_spec("test-sft-packing", 259, kPackedSeq, 0.1);
}

struct Result {
  double loss = 0;
  std::vector<float> grads;
};

Result loss_and_grads(ops::Backend& be, Precision p, const test::SftBatch& b, bool across = false) {
  LlamaModel m(sft_spec(), be, p);
  m.init_weights(7);
  m.params().zero_grad();
  LlamaContext ctx;
  PackedDocuments docs = b.mb.docs;
  if (across) docs.separate_attention = docs.restart_positions = false;
  Result r;
  r.loss = m.forward(ctx, b.mb.tokens.data(), b.mb.targets.data(), b.batch, b.seq, docs.active() ? &docs : nullptr);
  m.backward(ctx, 1.0);
  const float* g = m.params().grads().data<float>();
  r.grads.assign(g, g + m.params().numel());
  return r;
}

void expect_packed_equals_unpacked(ops::Backend& be, Precision p, double tol) {
  const test::SftBatch alone = test::sft_packing_batch(kConversations, false, kUnpackedSeq);
  const test::SftBatch packed = test::sft_packing_batch(kConversations, true, kPackedSeq);
  ASSERT_EQ(alone.batch, kConversations);
  ASSERT_LT(packed.batch, alone.batch) << "the conversations share sequences";
  const Result a = loss_and_grads(be, p, alone), b = loss_and_grads(be, p, packed);
  EXPECT_NEAR(b.loss, a.loss, tol * a.loss);
  EXPECT_LT(test::relative_l2_error(b.grads, a.grads), tol);
  if (p == Precision::Fp32) {
    const Result across = loss_and_grads(be, p, packed, true);
    EXPECT_GT(std::fabs(across.loss - a.loss), 1e-3 * a.loss) << "attention across the conversations differs";
  }
}

}  // namespace

TEST(SftPacking, PackedEqualsOnePerSequenceInFp32) {
  expect_packed_equals_unpacked(cpu::cpu_backend(), Precision::Fp32, 2e-6);
}

TEST(SftPacking, PackedEqualsOnePerSequenceOnTheCpuBf16Backend) {
  SKIP_WITHOUT_BF16();
  cpu::Bf16Backend be;
  expect_packed_equals_unpacked(be, Precision::Bf16, 1e-2);
}
