// The host-side shape check of flash attention (kept out of the .cu files: fmt's compile-time
// format checks are host C++ the CUDA front end does not evaluate).
#include "kernels/cuda/flash_attention.h"

#include <fmt/format.h>

namespace primus::cuda {

std::string flash_attention_unsupported(const AttentionDims& d) {
  if (d.batch <= 0 || d.seq <= 0 || d.heads <= 0 || d.groups <= 0 || d.head_dim <= 0)
    return fmt::format("flash attention needs positive sizes (batch {}, seq {}, heads {}, groups {}, head_dim {})",
                       d.batch, d.seq, d.heads, d.groups, d.head_dim);
  if (d.head_dim != 64 && d.head_dim != 128)
    return fmt::format("flash attention supports head_dim 64 and 128, not {}", d.head_dim);
  if (d.heads % d.groups != 0)
    return fmt::format("flash attention needs heads ({}) divisible by query groups ({})", d.heads, d.groups);
  // Grid limits: batch is gridDim.y and tiles of 64 rows are gridDim.z (each at most 65535).
  if (d.batch > 65535) return fmt::format("flash attention supports batch <= 65535, not {}", d.batch);
  if (d.seq > int64_t(65535) * 64)
    return fmt::format("flash attention supports seq <= {}, not {}", int64_t(65535) * 64, d.seq);
  // Row strides are 32-bit in the kernels: (heads + 2*groups) * head_dim < 2^31 with room to spare.
  if (d.heads > 65535) return fmt::format("flash attention supports at most 65535 heads, not {}", d.heads);
  return "";
}

std::string attention_decode_unsupported(const AttentionDims& d) {
  if (d.batch != 1 || d.seq <= 0 || d.heads <= 0 || d.groups <= 0 || d.heads % d.groups != 0)
    return fmt::format("decoding attention needs one sequence and heads divisible by groups (batch {}, seq {}, "
                       "heads {}, groups {})",
                       d.batch, d.seq, d.heads, d.groups);
  if (d.head_dim % 32 != 0 || d.head_dim > 256)
    return fmt::format("decoding attention supports head_dim a multiple of 32 up to 256, not {}", d.head_dim);
  if (d.seq > 65535) return fmt::format("decoding attention supports up to 65535 positions, not {}", d.seq);
  return "";
}

}  // namespace primus::cuda
