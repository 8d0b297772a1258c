// Tensor and sequence parallel on real ranks (mpirun -n 2 and -n 4): each rank builds its shard
// of the model and a one-process reference; losses and every gradient element must agree to
// 1e-11 relative (double precision: only the summation order differs).
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "model_compare.h"
#include "parallel/mpi_process_group.h"

using namespace primus;
using namespace primus::testing;

namespace {

struct Case {
  int tp;
  bool sp, tied, bias;
  Recompute recompute;
  size_t logits_budget;  // 0: vocabulary chunks in the cross-entropy
  bool lora = false;     // LoRA adapters (B drawn non-zero), the base frozen
  double softcap = 0;    // final_logit_softcapping (Grok 2's), on each rank's vocabulary shard
};

void run_case(const Case& c) {
  auto& world = parallel::mpi_world();
  if (world.size() % c.tp != 0) GTEST_SKIP() << "world " << world.size() << " not divisible by tp " << c.tp;
  // tp groups of consecutive ranks; each group checks the same thing.
  auto tp = world.split(world.rank() / c.tp, world.rank(), "tp");
  ModelSpec spec = mp_spec(c.tied, c.bias, 4, 2);
  spec.final_logit_softcapping = c.softcap;
  LlamaOptions opt;
  opt.recompute = c.recompute;
  if (c.lora) {
    opt.lora.enabled = true;
    opt.lora.dim = 3;
    opt.lora.alpha = 6;
    opt.lora.b_init = LoraInit::Normal;
  }
  if (c.logits_budget == 0) {
    opt.logits_memory_budget = 0;
    opt.vocab_chunk = 2;  // several chunks per rank's 12 / tp columns
  }
  LlamaModel ref(spec, cpu::cpu_backend(), Precision::Fp64, opt);
  ref.init_weights(11);
  ModelPartition part;
  part.tp_size = c.tp;
  part.tp_group = tp.get();
  part.sequence_parallel = c.sp;
  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp64, opt, part);
  model.init_weights(11);
  expect_matches(model.params(), ref.params(), false, 0);  // a shard draws its global slice's values

  const std::vector<MpBatch> mbs = {mp_batch(2, 6, spec.vocab_size, 21), mp_batch(2, 6, spec.vocab_size, 22)};
  for (const MpBatch& mb : mbs) {
    LlamaContext a, b;
    const double want = ref.forward(a, mb.tokens.data(), mb.targets.data(), mb.b, mb.s);
    const double got = model.forward(b, mb.tokens.data(), mb.targets.data(), mb.b, mb.s);
    EXPECT_NEAR(got, want, 1e-12 * std::fabs(want));
    ref.backward(a, 0.5);
    model.backward_input(b, 0.5);  // the split passes, as a zero-bubble schedule runs them
    model.backward_weight(b);
  }
  // Sequence parallel: replicated tensors (norms) hold each rank's rows' share: sum over tp. The
  // adapter factor whole on every rank (tp_partial_grads) holds a partial sum with or without.
  if (c.sp || c.lora)
    for (size_t id = 0; id < model.params().infos().size(); ++id) {
      const StoredParam& p = model.params().infos()[id];
      if ((c.sp && p.tp_replicated) || p.tp_partial_grads) tp->all_reduce(model.params().grad<double>(int(id)), p.numel, parallel::CommType::F64,
                                          parallel::ReduceOp::Sum);
    }
  expect_matches(model.params(), ref.params(), true, 1e-11);
}

}  // namespace

TEST(TensorParallel, Tp2) { run_case({2, false, false, false, Recompute::None, size_t(512) << 20}); }
// LoRA: B sharded with a column-parallel base, A with a row-parallel one, the other factor whole.
TEST(TensorParallel, Tp2Lora) { run_case({2, false, false, false, Recompute::None, size_t(512) << 20, true}); }
TEST(TensorParallel, Tp2SequenceParallelLora) {
  run_case({2, true, false, false, Recompute::None, size_t(512) << 20, true});
}
TEST(TensorParallel, Tp2TiedWithBias) { run_case({2, false, true, true, Recompute::None, size_t(512) << 20}); }
TEST(TensorParallel, Tp2SequenceParallel) { run_case({2, true, false, false, Recompute::None, size_t(512) << 20}); }
TEST(TensorParallel, Tp2SequenceParallelFullRecomputeChunkedVocab) {
  run_case({2, true, false, true, Recompute::Full, 0});
}
TEST(TensorParallel, Tp4SequenceParallelSelectiveRecompute) {
  run_case({4, true, true, false, Recompute::Selective, size_t(512) << 20});
}
TEST(TensorParallel, Tp4ChunkedVocab) { run_case({4, false, false, false, Recompute::None, 0}); }
// The capped logits' loss combined over the vocabulary shards, stored and in chunks.
TEST(TensorParallel, Tp2FinalLogitSoftcap) {
  run_case({2, false, false, false, Recompute::None, size_t(512) << 20, false, 0.5});
  run_case({2, true, false, false, Recompute::None, 0, false, 0.5});
}

TEST(TensorParallel, SequenceParallelNeedsDivisibleTokens) {
  auto& world = parallel::mpi_world();
  if (world.size() % 2 != 0) GTEST_SKIP();
  auto tp = world.split(world.rank() / 2, world.rank(), "tp");
  ModelPartition part;
  part.tp_size = 2;
  part.tp_group = tp.get();
  part.sequence_parallel = true;
  LlamaModel model(mp_spec(false, false, 4, 1), cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, part);
  const MpBatch mb = mp_batch(1, 5, 12, 1);
  LlamaContext ctx;
  EXPECT_THROW(model.forward(ctx, mb.tokens.data(), mb.targets.data(), 1, 5), Error);  // 5 tokens over 2 ranks
}
