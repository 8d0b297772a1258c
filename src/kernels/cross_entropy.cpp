// The op set's default cross-entropy of stored logits (kernels/backend.h): the chunk ops in order,
// which every backend has. A backend with a kernel that reads each row once overrides it.
#include "kernels/backend.h"

namespace primus::ops {

double Backend::ce_forward_backward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                    Tensor& lse, Tensor& dlogits) {
  const int64_t n = logits.size(0);
  Tensor m = empty({n}, lse.dtype()), s = empty({n}, lse.dtype()), zt = empty({n}, lse.dtype());
  ce_init(m, s, zt);
  ce_chunk_forward(logits, targets, c0, softcap, m, s, zt);
  const double total = ce_finish(m, s, zt, targets, lse);
  ce_chunk_backward(logits, lse, targets, c0, softcap, dlogits);
  return total;
}

}  // namespace primus::ops
