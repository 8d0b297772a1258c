// What part of the model a rank holds, and the groups it shares its layers with.
#pragma once

#include <cstdint>
#include <vector>

#include "model/options.h"
#include "parallel/process_group.h"

namespace primus {

struct ModelPartition {
  int tp_size = 1, tp_rank = 0;
  parallel::ProcessGroup* tp_group = nullptr;  // required when tp_size > 1
  bool sequence_parallel = false;
  struct Chunk {
    int64_t first_layer = 0, num_layers = 0;
    bool has_embedding = false, has_head = false;  // the first / the last pipeline stage
  };
  std::vector<Chunk> chunks;  // in chunk order; empty: one chunk with the whole model
  // Context parallel: this rank's place in the cp group (required when cp_size > 1).
  int cp_size = 1, cp_rank = 0;
  parallel::ProcessGroup* cp_group = nullptr;
  CpComm cp_comm = CpComm::P2P;
  // Expert parallel: this rank holds experts ep_rank*L .. ep_rank*L+L-1 of each MoE layer (L =
  // num_experts / ep_size); the ep group exchanges the tokens (required when ep_size > 1).
  int ep_size = 1, ep_rank = 0;
  parallel::ProcessGroup* ep_group = nullptr;
  // expert_tensor_parallel_size: 1 (every tp rank holds whole experts) or tp_size (each expert's
  // ffn, and the shared expert's, split over tp_group like the dense MLP's).
  int etp_size = 1;
};

}  // namespace primus
