// Context parallel on real ranks (mpirun -n 2 and -n 4): each rank builds the model with its cp
// group (and tp group) and a one-process reference; every rank feeds its two chunks of each
// sequence (context_parallel_rows), the loss must be the whole sequence's mean and every gradient,
// summed over the cp group (as data parallelism over dp x cp does in training), the reference's
// to 1e-11 relative (double precision: only the summation order differs). With packed documents
// (model/documents.h) too: the ring's blocks and the all-to-all's whole sequences keep attention
// inside each document and rotate each row at its position in its document. With multi-token
// prediction (model/mtp.cpp): the depths' tokens and targets shifted across the ranks' chunks, each
// depth's loss the whole sequence's mean.
#include <gtest/gtest.h>

#include "data/microbatch.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/context_parallel.h"
#include "model_compare.h"
#include "parallel/mpi_process_group.h"

using namespace primus;
using namespace primus::testing;

namespace {

struct Case {
  int cp, tp;
  CpComm comm;
  bool sp = false;
  Recompute recompute = Recompute::None;
  bool chunked_vocab = false;
  bool packed = false;  // documents packed into the sequences: separate attention, restarted positions
  int64_t mtp = 0;      // multi-token-prediction depths
};

void run_case(const Case& c) {
  auto& world = parallel::mpi_world();
  if (world.size() % (c.cp * c.tp) != 0) GTEST_SKIP() << "world " << world.size() << " for cp x tp " << c.cp * c.tp;
  // Ranks: tp fastest, then cp (the rank mesh's order); groups of cp x tp ranks check the same thing.
  const int r = world.rank(), group = r / (c.cp * c.tp), in_group = r % (c.cp * c.tp);
  auto tp = world.split(group * c.cp + in_group / c.tp, r, "tp");
  auto cp = world.split(group * c.tp + in_group % c.tp, r, "cp");
  ModelSpec spec = mp_spec(false, true, 2, 2);
  spec.num_attention_heads = 8;  // 2 heads and 1 group per rank under tp2 x a2a cp2
  spec.num_query_groups = 4;
  spec.max_position_embeddings = 32;
  spec.mtp_num_layers = c.mtp;
  spec.mtp_loss_scaling_factor = 0.7;
  LlamaOptions opt;
  opt.recompute = c.recompute;
  if (c.chunked_vocab) {
    opt.logits_memory_budget = 0;
    opt.vocab_chunk = 5;
  }
  LlamaModel ref(spec, cpu::cpu_backend(), Precision::Fp64, opt);
  ref.init_weights(3);
  ModelPartition part;
  part.tp_size = c.tp;
  part.tp_group = tp.get();
  part.sequence_parallel = c.sp;
  part.cp_size = c.cp;
  part.cp_group = cp.get();
  part.cp_comm = c.comm;
  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp64, opt, part);
  model.init_weights(3);

  const int64_t B = 2, S = 8 * c.cp;  // chunks of 4 tokens
  // Documents that cross chunks, one of a single row, one starting on a chunk boundary (so that
  // some ring blocks pair queries and keys of different documents only).
  PackedDocuments docs;
  if (c.packed) {
    docs.starts = {{0, 5, 6, int32_t(S / 2 + 1)}, {0, int32_t(S / 2)}};
    docs.restart_positions = docs.separate_attention = true;
  }
  for (uint64_t seed : {31, 32}) {
    const MpBatch mb = mp_batch(B, S, spec.vocab_size, seed);
    const auto tokens = data::context_parallel_rows(mb.tokens.data(), B, S, c.cp, cp->rank());
    const auto targets = data::context_parallel_rows(mb.targets.data(), B, S, c.cp, cp->rank());
    LlamaContext a, b;
    const double want = ref.forward(a, mb.tokens.data(), mb.targets.data(), B, S, &docs);
    const double got = model.forward(b, tokens.data(), targets.data(), B, S / c.cp, &docs);
    EXPECT_NEAR(got, want, 1e-12 * std::fabs(want));
    const std::vector<double> mtp_want = ref.mtp_losses(a), mtp_got = model.mtp_losses(b);
    ASSERT_EQ(mtp_got.size(), size_t(c.mtp));
    ASSERT_EQ(mtp_want.size(), size_t(c.mtp));
    for (size_t k = 0; k < mtp_got.size(); ++k)
      EXPECT_NEAR(mtp_got[k], mtp_want[k], 1e-12 * mtp_want[k]) << "depth " << k;
    ref.backward(a, 0.5);
    model.backward_input(b, 0.5);  // the split passes, as a zero-bubble schedule runs them
    model.backward_weight(b);
  }
  for (size_t id = 0; id < model.params().infos().size(); ++id) {
    const StoredParam& p = model.params().infos()[id];
    double* g = model.params().grad<double>(int(id));
    cp->all_reduce(g, p.numel, parallel::CommType::F64, parallel::ReduceOp::Sum);
    if (c.sp && p.tp_replicated) tp->all_reduce(g, p.numel, parallel::CommType::F64, parallel::ReduceOp::Sum);
  }
  expect_matches(model.params(), ref.params(), true, 1e-11);
}

}  // namespace

TEST(ContextParallel, Cp2Ring) { run_case({2, 1, CpComm::P2P}); }
TEST(ContextParallel, Cp2AllToAll) { run_case({2, 1, CpComm::A2A}); }
TEST(ContextParallel, Cp4Ring) { run_case({4, 1, CpComm::P2P}); }
TEST(ContextParallel, Cp4AllToAllSelectiveRecompute) { run_case({4, 1, CpComm::A2A, false, Recompute::Selective}); }
TEST(ContextParallel, Cp2Tp2SequenceParallelRing) { run_case({2, 2, CpComm::P2P, true}); }
TEST(ContextParallel, Cp2Tp2AllToAllFullRecomputeChunkedVocab) {
  run_case({2, 2, CpComm::A2A, false, Recompute::Full, true});
}

TEST(ContextParallel, Cp2RingPackedDocuments) { run_case({2, 1, CpComm::P2P, false, Recompute::None, false, true}); }
TEST(ContextParallel, Cp2AllToAllPackedDocuments) { run_case({2, 1, CpComm::A2A, false, Recompute::None, false, true}); }
TEST(ContextParallel, Cp4RingPackedDocuments) { run_case({4, 1, CpComm::P2P, false, Recompute::None, false, true}); }
TEST(ContextParallel, Cp2Tp2SequenceParallelRingPackedDocumentsSelectiveRecompute) {
  run_case({2, 2, CpComm::P2P, true, Recompute::Selective, false, true});
}

// Two depths: depth 1's tokens are two ahead, so each chunk's last two rows read the next chunk's.
TEST(ContextParallel, Cp2RingMtp) { run_case({2, 1, CpComm::P2P, false, Recompute::None, false, false, 2}); }
TEST(ContextParallel, Cp4AllToAllPackedDocumentsMtp) {
  run_case({4, 1, CpComm::A2A, false, Recompute::None, false, true, 2});
}
TEST(ContextParallel, Cp2Tp2SequenceParallelRingMtp) {
  run_case({2, 2, CpComm::P2P, true, Recompute::None, false, false, 1});
}

TEST(ContextParallel, BadLayoutsAreRefused) {
  auto& world = parallel::mpi_world();
  if (world.size() % 2 != 0) GTEST_SKIP();
  auto cp = world.split(world.rank() / 2, world.rank(), "cp");
  ModelPartition part;
  part.cp_size = 2;
  part.cp_group = cp.get();
  part.cp_comm = CpComm::A2A;
  // 4 heads, 1 query group: the group cannot be split over 2 ranks.
  try {
    LlamaModel model(mp_spec(false, false, 1, 1), cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, part);
    ADD_FAILURE() << "a2a with one query group over cp 2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cp_comm_type a2a"), std::string::npos) << e.what();
  }
  part.cp_comm = CpComm::P2P;
  LlamaModel model(mp_spec(false, false, 2, 1), cpu::cpu_backend(), Precision::Fp64, LlamaOptions{}, part);
  const MpBatch mb = mp_batch(1, 5, 12, 1);
  LlamaContext ctx;
  EXPECT_THROW(model.forward(ctx, mb.tokens.data(), mb.targets.data(), 1, 5), Error);  // odd share of a sequence
  EXPECT_THROW(data::context_parallel_rows(mb.tokens.data(), 1, 6, 2, 0), Error);              // 6 not a multiple of 4
}
