// The documents of an attention call (kernels/backend.h, AttentionShape), as every backend's
// kernels read them.
#include "core/error.h"
#include "kernels/backend.h"

namespace primus::ops {

cpu::Documents documents_of(const AttentionShape& s, Device device) {
  if (!s.doc_start.defined()) return {nullptr, s.key_pos0};
  const Tensor& d = s.doc_start;
  PRIMUS_CHECK(d.dtype() == DType::I32 && d.numel() == s.batch * s.seq && d.device() == device,
               "attention document starts: int32 [{} x {}] on the {} expected, got {} {} on the {}", s.batch, s.seq,
               device_name(device), dtype_name(d.dtype()), d.shape_str(), device_name(d.device()));
  return {d.data<int32_t>(), s.key_pos0};
}

}  // namespace primus::ops
