#include "model/tensor_parallel_rows.h"

namespace primus {

Tensor TensorParallelRows::gather(const Tensor& local) const {
  if (size() == 1 || !sequence_parallel) return local;
  Tensor full = backend->empty({local.size(0) * size(), local.size(1)}, local.dtype());
  group->all_gather(local.raw(), full.raw(), local.numel(), parallel::comm_type_of(local.dtype()));
  return full;
}

Tensor TensorParallelRows::reduce(Tensor partial) const {
  if (size() == 1) return partial;
  const parallel::CommType t = parallel::comm_type_of(partial.dtype());
  if (!sequence_parallel) {
    group->all_reduce(partial.raw(), partial.numel(), t, parallel::ReduceOp::Sum);
    return partial;
  }
  Tensor local = backend->empty({partial.size(0) / size(), partial.size(1)}, partial.dtype());
  group->reduce_scatter(partial.raw(), local.raw(), local.numel(), t, parallel::ReduceOp::Sum);
  return local;
}

}  // namespace primus
