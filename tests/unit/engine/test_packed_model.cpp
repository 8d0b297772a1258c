// Packed documents through the one model (core/packed_documents.h, model/documents.h): documents
// packed into one sequence with attention kept inside each and positions restarting at each
// (reset_attention_mask + reset_position_ids) train exactly as the same documents one per
// sequence. The data is built so that the two are the same problem: every document has the same
// length and ends with the eod token, whose target is masked (eod_mask_loss), so each row sees the
// same tokens at the same positions with the same target, in the same row order. Three AdamW steps:
// every loss and the final weights agree to fp32 resolution (CPU fp32), to bf16 resolution on the
// CPU bf16 backend. A packed microbatch whose documents only restart positions, or only separate
// attention, differs from both (each flag does something).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "../bf16/skip_without_bf16.h"
#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/attention_flops.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "support/relative_error.h"
#include "support/tiny_spec.h"

using namespace primus;

namespace {

constexpr int64_t kDocs = 3, kLen = 40;  // 40: documents that do not start on a 64-row tile

ModelSpec tiny_spec() { return test::tiny_llama_spec("test-packed", 61, kDocs * kLen, 0.1); }

// kDocs documents of kLen tokens, each ending with eod (the last id): tokens and targets of the
// documents one after the other (targets the next token within the document, -1 at the eod).
struct Documents {
  std::vector<int32_t> tokens, targets;
};
Documents make_documents(int64_t vocab, uint64_t seed) {
  Documents d;
  const Rng rng(seed);
  const int32_t eod = int32_t(vocab - 1);
  for (int64_t k = 0; k < kDocs; ++k) {
    std::vector<int32_t> doc;
    for (int64_t i = 0; i + 1 < kLen; ++i) doc.push_back(int32_t(rng.at(uint64_t(k * kLen + i)) % uint64_t(eod)));
    doc.push_back(eod);
    for (int64_t i = 0; i < kLen; ++i) {
      d.tokens.push_back(doc[size_t(i)]);
      d.targets.push_back(i + 1 < kLen ? doc[size_t(i + 1)] : -1);
    }
  }
  return d;
}

struct Training {
  std::vector<double> losses;
  std::vector<float> weights;
};

// Three AdamW steps on two alternating microbatches of documents: one per sequence (packed
// false: batch kDocs of kLen) or packed into one sequence (batch 1 of kDocs * kLen) with `docs`'
// flags.
Training train(ops::Backend& be, Precision precision, bool packed, bool restart_positions, bool separate_attention,
               const ModelSpec& spec = tiny_spec()) {
  LlamaModel m(spec, be, precision);
  m.init_weights(5);
  const std::vector<ParamSegment> segs = segments_of(m.params());
  const AdamWOptions ao{0.9, 0.95, 1e-8, 0.1};
  AdamW adam(ao, m.params().numel());
  FlatAdamW flat(ao, segs, m.params().numel(), Device::CPU);
  PackedDocuments docs;
  docs.starts = {{}};
  for (int64_t k = 0; k < kDocs; ++k) docs.starts[0].push_back(int32_t(k * kLen));
  docs.restart_positions = restart_positions;
  docs.separate_attention = separate_attention;
  const Documents data[2] = {make_documents(spec.vocab_size, 1), make_documents(spec.vocab_size, 2)};
  Training r;
  for (int it = 0; it < 3; ++it) {
    const Documents& d = data[it % 2];
    m.params().zero_grad();
    LlamaContext ctx;
    r.losses.push_back(packed ? m.forward(ctx, d.tokens.data(), d.targets.data(), 1, kDocs * kLen, &docs)
                              : m.forward(ctx, d.tokens.data(), d.targets.data(), kDocs, kLen));
    m.backward(ctx, 1.0);
    if (precision == Precision::Fp32)
      adam.step(m.params().values().data<float>(), m.params().grads().data<float>(), segs, 1e-2);
    else
      flat.step(m.params().values(), m.params().grads(), &m.working_weights(), 1e-2);
  }
  const float* w = m.params().values().data<float>();
  r.weights.assign(w, w + m.params().numel());
  return r;
}

void expect_same_training(const Training& packed, const Training& alone, double tol) {
  for (size_t i = 0; i < alone.losses.size(); ++i)
    EXPECT_NEAR(packed.losses[i], alone.losses[i], tol * alone.losses[i]) << "step " << i + 1;
  EXPECT_LT(test::relative_l2_error(packed.weights, alone.weights), tol) << "weights after 3 steps";
}

}  // namespace

TEST(PackedModel, PackedDocumentsTrainAsOnePerSequenceInFp32) {
  cpu::CpuBackend& be = cpu::cpu_backend();
  const Training alone = train(be, Precision::Fp32, false, false, false);
  const Training packed = train(be, Precision::Fp32, true, true, true);
  expect_same_training(packed, alone, 2e-6);
  // Without separate attention the packed sequence is another problem. (Restarting positions
  // alone changes little: rotary scores depend on the distance between positions only, so a
  // document shifted as a whole attends alike up to rounding; DocumentRows' positions are checked
  // below.)
  const Training mixed = train(be, Precision::Fp32, true, true, false);
  EXPECT_GT(std::fabs(mixed.losses[0] - alone.losses[0]), 1e-3 * alone.losses[0]);
}

// The rows' document starts and rotary positions, one process and cp 2 (rank 1 holds chunks 1
// and 2 of 4, [chunk][batch][position]).
TEST(PackedModel, DocumentRowsFollowTheContextParallelChunks) {
  PackedDocuments docs;
  docs.starts = {{0, 3, 6}, {0, 5}};
  docs.restart_positions = docs.separate_attention = true;
  const DocumentRows one = document_rows(docs, 2, 8, 1, 0, Device::CPU);
  EXPECT_EQ(one.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 0, 1, 2}));
  const std::vector<int32_t> starts(one.doc_start.data<int32_t>(), one.doc_start.data<int32_t>() + 16);
  EXPECT_EQ(starts, (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 6, 6, 0, 0, 0, 0, 0, 5, 5, 5}));
  EXPECT_FALSE(one.seq_doc_start.defined());
  const DocumentRows cp = document_rows(docs, 2, 4, 2, 1, Device::CPU);
  // Chunk 1 (positions 2, 3) of both sequences, then chunk 2 (positions 4, 5).
  EXPECT_EQ(cp.positions, (std::vector<int32_t>{2, 0, 2, 3, 1, 2, 4, 0}));
  const std::vector<int32_t> cp_starts(cp.doc_start.data<int32_t>(), cp.doc_start.data<int32_t>() + 8);
  EXPECT_EQ(cp_starts, (std::vector<int32_t>{0, 3, 0, 0, 3, 3, 0, 5}));
  EXPECT_EQ(cp.seq_doc_start.numel(), 16);
  docs.separate_attention = false;
  EXPECT_FALSE(document_rows(docs, 2, 8, 1, 0, Device::CPU).separates_attention());
}

// Llama 4's chunked attention (attention_chunk_size 4) as documents: each row's start is the
// larger of its packed document's and its chunk's; the rotary positions stay the documents'; with
// no packed documents (or documents that only restart positions) the chunks alone.
TEST(PackedModel, AttentionChunksJoinThePackedDocuments) {
  PackedDocuments docs;
  docs.starts = {{0, 3, 6}, {0, 5}};
  docs.restart_positions = docs.separate_attention = true;
  const DocumentRows one = document_rows(docs, 2, 8, 1, 0, Device::CPU, 4);
  EXPECT_EQ(one.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 0, 1, 2}));
  const std::vector<int32_t> starts(one.doc_start.data<int32_t>(), one.doc_start.data<int32_t>() + 16);
  EXPECT_EQ(starts, (std::vector<int32_t>{0, 0, 0, 3, 4, 4, 6, 6, 0, 0, 0, 0, 4, 5, 5, 5}));
  const DocumentRows cp = document_rows(docs, 2, 4, 2, 1, Device::CPU, 4);
  const std::vector<int32_t> cp_starts(cp.doc_start.data<int32_t>(), cp.doc_start.data<int32_t>() + 8);
  EXPECT_EQ(cp_starts, (std::vector<int32_t>{0, 3, 0, 0, 4, 4, 4, 5}));
  const std::vector<int32_t> seq_starts(cp.seq_doc_start.data<int32_t>(), cp.seq_doc_start.data<int32_t>() + 16);
  EXPECT_EQ(seq_starts, starts);
  for (bool restart_only : {false, true}) {
    PackedDocuments d = docs;
    d.starts = {{0, 3, 6}};
    if (restart_only) d.separate_attention = false;
    const DocumentRows chunks = document_rows(restart_only ? d : PackedDocuments(), 1, 8, 1, 0, Device::CPU, 3);
    const std::vector<int32_t> c(chunks.doc_start.data<int32_t>(), chunks.doc_start.data<int32_t>() + 8);
    EXPECT_EQ(c, (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 6, 6}));
    EXPECT_EQ(chunks.restarts_positions(), restart_only);
  }
}

// Multi-latent attention (model/mla.h): its rotary parts rotate at the restarted positions too.
TEST(PackedModel, PackedDocumentsTrainAsOnePerSequenceWithMla) {
  ModelSpec spec = tiny_spec();
  spec.num_query_groups = 0;
  spec.multi_latent_attention = true;
  spec.q_lora_rank = 12;
  spec.kv_lora_rank = 10;
  spec.qk_head_dim = 6;
  spec.qk_pos_emb_head_dim = 4;
  spec.v_head_dim = 8;
  cpu::CpuBackend& be = cpu::cpu_backend();
  const Training alone = train(be, Precision::Fp32, false, false, false, spec);
  const Training packed = train(be, Precision::Fp32, true, true, true, spec);
  expect_same_training(packed, alone, 2e-6);
}

TEST(PackedModel, PackedDocumentsTrainAsOnePerSequenceOnTheCpuBf16Backend) {
  SKIP_WITHOUT_BF16();
  cpu::Bf16Backend be;
  const Training alone = train(be, Precision::Bf16, false, false, false);
  const Training packed = train(be, Precision::Bf16, true, true, true);
  expect_same_training(packed, alone, 1e-2);
}

TEST(PackedModel, DocumentStartsThatDoNotFitTheMicrobatchAreRefused) {
  const ModelSpec spec = tiny_spec();
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(1);
  const std::vector<int32_t> tokens(kLen, 1);
  PackedDocuments docs;
  docs.separate_attention = true;
  for (const std::vector<std::vector<int32_t>>& bad :
       {std::vector<std::vector<int32_t>>{{0, 10}, {0}},  // two lists for one sequence
        std::vector<std::vector<int32_t>>{{3, 10}},       // not starting at 0
        std::vector<std::vector<int32_t>>{{0, 10, 10}},   // not ascending
        std::vector<std::vector<int32_t>>{{0, kLen}}}) {  // past the end
    docs.starts = bad;
    LlamaContext ctx;
    EXPECT_THROW(m.forward(ctx, tokens.data(), tokens.data(), 1, kLen, &docs), Error);
  }
}

// FLOPs of packed documents (model/documents.h documents_attention_flops): the sum of each
// document's causal attention, less than the whole sequence's and equal to the documents one per
// sequence; without separate attention the whole sequence's; model_stats's attention share at a
// sequence length is the same rule.
TEST(PackedFlops, PackedDocumentsCountTheirOwnAttention) {
  const ModelSpec spec = test::tiny_llama_spec("flops", 11, 64, 0.3, {.hidden = 32, .ffn = 48});
  const int64_t seq = 24;
  PackedDocuments docs;
  docs.starts = {{0, 10, 18}, {0}};
  docs.separate_attention = true;
  const double packed = documents_attention_flops(spec, docs, 2, seq);
  const double whole = 2 * attention_flops(spec, seq);
  EXPECT_DOUBLE_EQ(packed, attention_flops(spec, 10) + attention_flops(spec, 8) + attention_flops(spec, 6) +
                               attention_flops(spec, seq));
  EXPECT_LT(packed, whole);
  docs.separate_attention = false;  // positions restart, attention spans the sequence
  docs.restart_positions = true;
  EXPECT_EQ(documents_attention_flops(spec, docs, 2, seq), whole);
  const ModelStats st = model_stats(spec, seq);
  const ModelStats longer = model_stats(spec, 2 * seq);  // only the attention share grows with the length
  EXPECT_NEAR(longer.flops_per_token - st.flops_per_token,
              attention_flops(spec, 2 * seq) / double(2 * seq) - attention_flops(spec, seq) / double(seq),
              1e-6 * st.flops_per_token);
}
