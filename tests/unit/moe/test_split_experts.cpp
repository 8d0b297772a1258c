// Split experts (expert_tensor_parallel_size = tp, model/moe.h) on real ranks (mpirun -n 2): the
// tp ranks' partial outputs are summed row by row, so they must route every token alike. They do
// from the same logits; a rank whose router computes other logits is an error on every rank,
// naming the setting, instead of a silent sum of unrelated rows.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "parallel/mpi_process_group.h"

using namespace primus;

namespace {

ModelSpec tiny_moe() {
  ModelSpec s;
  s.name = "tiny-split-moe";
  s.num_layers = 1;
  s.hidden_size = 8;
  s.ffn_hidden_size = 8;
  s.num_attention_heads = 2;
  s.vocab_size = 8;
  s.max_position_embeddings = 8;
  s.init_method_std = 0.4;
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 4;
  s.moe_router_topk = 2;
  return s;
}

TEST(SplitExperts, TensorParallelRanksThatRouteDifferentlyAreAnError) {
  auto& world = parallel::mpi_world();
  ModelPartition part;
  part.tp_size = world.size();
  part.tp_group = &world;
  part.etp_size = world.size();
  LlamaModel m(tiny_moe(), cpu::cpu_backend(), Precision::Fp32, LlamaOptions(), part);
  m.init_weights(3);
  std::vector<int32_t> tokens(16), targets(16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 8), targets[i] = int32_t((i + 3) % 8);
  LlamaContext c;
  EXPECT_NO_THROW(m.forward(c, tokens.data(), targets.data(), 2, 8)) << "the same logits route alike";

  // Every rank but the first negates its copy of the router: its choices are the others' reversed.
  int router = -1;
  for (size_t t = 0; t < m.params().infos().size(); ++t)
    if (m.params().infos()[t].name == "decoder.layers.0.mlp.router.weight") router = int(t);
  ASSERT_GE(router, 0);
  if (world.rank() > 0) {
    const StoredParam& p = m.params().infos()[size_t(router)];
    float* w = m.params().values().data<float>() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) w[i] = -w[i];
    m.sync_working_weights();
  }
  try {
    m.forward(c, tokens.data(), targets.data(), 2, 8);
    ADD_FAILURE() << "rank " << world.rank() << ": different routings were summed";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("routed a microbatch's tokens differently"), std::string::npos) << what;
    EXPECT_NE(what.find("expert_tensor_parallel_size"), std::string::npos) << what;
  }
}

}  // namespace
