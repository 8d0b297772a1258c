// The two collectives that tensor parallelism puts around its linears, on [rows, C] activations:
// the decoder block's and the MoE block's split experts' (expert_tensor_parallel_size = tp).
//
//   gather   before a column-parallel linear: under sequence parallelism each tp rank holds rows
//            [r N/tp, (r+1) N/tp) and the linear needs all N; without it every rank holds all
//            rows already (identity)
//   reduce   after a row-parallel linear: the ranks' partial [N, C] outputs summed, all of it on
//            every rank, or under sequence parallelism this rank's rows only
//
// Both are identities without a group (one rank).
#pragma once

#include "core/tensor.h"
#include "kernels/backend.h"
#include "parallel/process_group.h"

namespace primus {

struct TensorParallelRows {
  ops::Backend* backend = nullptr;
  parallel::ProcessGroup* group = nullptr;  // the tp group; null: one rank
  bool sequence_parallel = false;

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  Tensor gather(const Tensor& local) const;
  Tensor reduce(Tensor partial) const;
  // The first of this rank's rows among all rows (0 without sequence parallelism).
  int64_t first_local_row(int64_t local_rows) const {
    return sequence_parallel && size() > 1 ? rank() * local_rows : 0;
  }
};

}  // namespace primus
