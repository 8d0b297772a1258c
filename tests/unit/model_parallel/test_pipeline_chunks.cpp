// Pipeline stages on one process: a model split into chunks (each its own LlamaModel, as on
// separate ranks, or several chunks in one model, as a V-shape rank holds them) passes
// activations and gradients by hand and must reproduce the whole model's loss and gradients.
#include <gtest/gtest.h>

#include <memory>

#include "kernels/cpu/cpu_backend.h"
#include "model_compare.h"

using namespace primus;
using namespace primus::testing;

namespace {

// Runs microbatches through stages[0..S) in order (F of all stages, then B and W backwards) and
// returns the summed loss. stage_of[k] = (model index, chunk index) of pipeline stage k.
double run_stages(std::vector<std::unique_ptr<LlamaModel>>& models,
                  const std::vector<std::pair<int, int>>& stage_of, const std::vector<MpBatch>& mbs) {
  double loss = 0;
  const double dloss = 1.0 / double(mbs.size());
  for (const MpBatch& mb : mbs) {
    std::vector<LlamaContext> ctx(models.size());
    for (size_t m = 0; m < models.size(); ++m)
      models[m]->begin_microbatch(ctx[m], mb.tokens.data(), mb.targets.data(), mb.b, mb.s);
    Tensor x;
    for (auto [m, c] : stage_of) x = models[m]->forward_chunk(ctx[m], c, x);
    loss += ctx[stage_of.back().first].loss;
    Tensor dy;
    for (size_t k = stage_of.size(); k-- > 0;) {
      auto [m, c] = stage_of[k];
      dy = models[m]->backward_input_chunk(ctx[m], c, dy, dloss);
    }
    for (auto [m, c] : stage_of) models[m]->backward_weight_chunk(ctx[m], c);
  }
  return loss / double(mbs.size());
}

double run_reference(LlamaModel& ref, const std::vector<MpBatch>& mbs) {
  double loss = 0;
  for (const MpBatch& mb : mbs) {
    LlamaContext c;
    loss += ref.forward(c, mb.tokens.data(), mb.targets.data(), mb.b, mb.s);
    ref.backward(c, 1.0 / double(mbs.size()));
  }
  return loss / double(mbs.size());
}

using Chunk = ModelPartition::Chunk;

}  // namespace

TEST(PipelineChunks, FourStagesOnFourModelsEqualTheWholeModel) {
  const ModelSpec spec = mp_spec(false, true);
  LlamaModel ref(spec, cpu::cpu_backend(), Precision::Fp64);
  ref.init_weights(5);
  std::vector<std::unique_ptr<LlamaModel>> models;
  std::vector<std::pair<int, int>> stage_of;
  for (int s = 0; s < 4; ++s) {
    ModelPartition p;
    p.chunks = {Chunk{s, 1, s == 0, s == 3}};
    models.push_back(std::make_unique<LlamaModel>(spec, cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, p));
    models.back()->init_weights(5);
    stage_of.push_back({s, 0});
  }
  const std::vector<MpBatch> mbs = {mp_batch(2, 5, spec.vocab_size, 1), mp_batch(2, 5, spec.vocab_size, 2)};
  const double want = run_reference(ref, mbs);
  const double got = run_stages(models, stage_of, mbs);
  EXPECT_NEAR(got, want, 1e-12 * std::fabs(want));
  for (auto& m : models) {
    expect_matches(m->params(), ref.params(), false, 0);  // same initial weights, by name
    expect_matches(m->params(), ref.params(), true, 1e-12);
  }
  EXPECT_LT(models[1]->params().numel(), ref.params().numel() / 3);  // a stage holds only its layers
}

TEST(PipelineChunks, VShapeRankHoldsTheFirstAndLastStage) {
  // pp 2, vpp 2 in V-shape: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
  const ModelSpec spec = mp_spec(false, false);
  LlamaModel ref(spec, cpu::cpu_backend(), Precision::Fp64);
  ref.init_weights(9);
  ModelPartition r0, r1;
  r0.chunks = {Chunk{0, 1, true, false}, Chunk{3, 1, false, true}};
  r1.chunks = {Chunk{1, 1, false, false}, Chunk{2, 1, false, false}};
  std::vector<std::unique_ptr<LlamaModel>> models;
  models.push_back(std::make_unique<LlamaModel>(spec, cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, r0));
  models.push_back(std::make_unique<LlamaModel>(spec, cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, r1));
  for (auto& m : models) m->init_weights(9);
  const std::vector<MpBatch> mbs = {mp_batch(1, 7, spec.vocab_size, 3), mp_batch(1, 7, spec.vocab_size, 4)};
  const double want = run_reference(ref, mbs);
  const double got = run_stages(models, {{0, 0}, {1, 0}, {1, 1}, {0, 1}}, mbs);
  EXPECT_NEAR(got, want, 1e-12 * std::fabs(want));
  for (auto& m : models) expect_matches(m->params(), ref.params(), true, 1e-12);
}

TEST(PipelineChunks, TiedEmbeddingReplicaOnTheLastStageSumsToTheWholeGradient) {
  const ModelSpec spec = mp_spec(true, false);
  LlamaModel ref(spec, cpu::cpu_backend(), Precision::Fp64);
  ref.init_weights(2);
  ModelPartition first, last;
  first.chunks = {Chunk{0, 2, true, false}};
  last.chunks = {Chunk{2, 2, false, true}};
  std::vector<std::unique_ptr<LlamaModel>> models;
  models.push_back(std::make_unique<LlamaModel>(spec, cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, first));
  models.push_back(std::make_unique<LlamaModel>(spec, cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, last));
  for (auto& m : models) m->init_weights(2);
  const std::vector<MpBatch> mbs = {mp_batch(2, 4, spec.vocab_size, 8)};
  run_stages(models, {{0, 0}, {1, 0}}, mbs);
  // Both stages hold the embedding (initialised alike); the sum of their gradients is the whole one.
  const std::string name = "embedding.word_embeddings.weight";
  const int a = models[0]->params().find(name), b = models[1]->params().find(name), r = ref.params().find(name);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  run_reference(ref, mbs);
  const int64_t n = ref.params().infos()[r].numel;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(models[0]->params().value<double>(a)[i], models[1]->params().value<double>(b)[i]);
    EXPECT_NEAR(models[0]->params().grad<double>(a)[i] + models[1]->params().grad<double>(b)[i], ref.params().grad<double>(r)[i], 1e-12);
  }
}

TEST(PipelineChunks, BadChunksAndInputsAreClearErrors) {
  const ModelSpec spec = mp_spec(false, false);
  ModelPartition p;
  p.chunks = {Chunk{3, 2, false, true}};
  EXPECT_THROW(LlamaModel(spec, cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, p), Error);
  p.chunks = {Chunk{1, 1, false, false}};
  LlamaModel mid(spec, cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, p);
  LlamaContext ctx;
  const MpBatch mb = mp_batch(1, 4, spec.vocab_size, 1);
  mid.begin_microbatch(ctx, mb.tokens.data(), mb.targets.data(), 1, 4);
  EXPECT_THROW(mid.forward_chunk(ctx, 0, Tensor::zeros({3, 16}, DType::F64)), Error);  // wrong rows
  EXPECT_THROW(mid.forward(ctx, mb.tokens.data(), mb.targets.data(), 1, 4), Error);   // not the whole model
  try {
    check_tensor_parallel(spec, 3);
    FAIL() << "tp 3 accepted for 4 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
}
