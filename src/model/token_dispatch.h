// Expert parallelism's token dispatch (Megatron-Core's MoE token dispatchers): the expert-parallel
// group's ranks each hold num_experts / ep of the experts (rank r the experts r*L .. r*L+L-1), and
// route their own tokens with the whole router. The permuted rows of a rank (its kept choices,
// grouped by global expert) travel to the rank that holds the expert, are computed there, and
// travel back, so everything around the expert GEMMs (routing, weights, unpermute) stays local.
//
//   token side   this rank's permuted rows, grouped by global expert (offsets over all experts)
//   expert side  the rows of every rank for this rank's experts, grouped by local expert and, in
//                an expert, by source rank; its offsets run over all experts (the others empty),
//                so the expert GEMM loop over offsets is the same as without expert parallelism
//
// Two ways over the ProcessGroup (MPI on the CPU, NCCL on GPUs), the same rows either way:
//   alltoall   the counts all-gathered, then one all_to_all of the rows each rank sends each
//              other rank (padded to the largest such count), and the mirror back
//   allgather  every rank's token-side rows all-gathered (padded to the largest rank), each rank
//              picks its experts' rows; back by a reduce-scatter of the outputs written at the
//              rows' places (zeros elsewhere), so each rank receives its own rows, exactly
// The backward uses the same plan: dispatch the output gradient's rows, combine the input's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "parallel/process_group.h"

namespace primus {

enum class TokenDispatch : uint8_t { AllGather, AllToAll };
TokenDispatch parse_token_dispatch(const std::string& s);  // "allgather" | "alltoall"

// One microbatch's exchange: every rank's row count per global expert.
struct DispatchPlan {
  std::vector<int64_t> counts;          // [ep][num_experts], row-major
  std::vector<int64_t> expert_offsets;  // num_experts + 1: the expert side's grouping
  int64_t token_rows = 0, expert_rows = 0;
};

class TokenDispatcher {
 public:
  // ep: the expert-parallel group (its rank r holds experts r*L .. r*L+L-1, L = num_experts / ep).
  TokenDispatcher(parallel::ProcessGroup& ep, ops::Backend& backend, int64_t num_experts, TokenDispatch type);

  // Collective over ep: token_offsets (num_experts + 1) group this rank's token-side rows.
  DispatchPlan plan(const std::vector<int64_t>& token_offsets) const;
  // Token side (plan.token_rows rows; undefined when 0) to expert side; collective.
  Tensor dispatch(const DispatchPlan& p, const Tensor& token_rows, int64_t width, DType dtype) const;
  // Expert side back to the token side; collective.
  Tensor combine(const DispatchPlan& p, const Tensor& expert_rows, int64_t width, DType dtype) const;

  int ep_size() const { return ep_.size(); }
  int ep_rank() const { return ep_.rank(); }
  int64_t local_experts() const { return local_; }
  TokenDispatch type() const { return type_; }

 private:
  int64_t count(const DispatchPlan& p, int src, int64_t e) const { return p.counts[size_t(src * E_ + e)]; }
  // First row of rank src's token side that goes to rank dst, and how many.
  int64_t token_first(const DispatchPlan& p, int src, int dst) const;
  int64_t to_rank(const DispatchPlan& p, int src, int dst) const;
  int64_t piece_rows(const DispatchPlan& p) const;
  int64_t rank_rows(const DispatchPlan& p) const;

  parallel::ProcessGroup& ep_;
  ops::Backend& be_;
  int64_t E_, local_;
  TokenDispatch type_;
};

}  // namespace primus
