// The documents and sinks of an attention call (kernels/backend.h, AttentionShape), as every
// backend's kernels read them.
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

const void* sinks_of(const AttentionShape& s, Device device, DType stat) {
  if (!s.sinks.defined()) return nullptr;
  const Tensor& k = s.sinks;
  PRIMUS_CHECK(k.dtype() == stat && k.numel() == s.heads && k.device() == device,
               "attention sinks: {} [{}] on the {} expected, got {} {} on the {}", dtype_name(stat), s.heads,
               device_name(device), dtype_name(k.dtype()), k.shape_str(), device_name(k.device()));
  return k.raw();
}

void refuse_window_and_sinks(const AttentionShape& s, const char* op) {
  PRIMUS_CHECK(s.window < 0 && !s.sinks.defined(),
               "{}: sliding-window attention and attention sinks are not supported here (context parallelism "
               "splits the sequence; gpt-oss's attention runs with context_parallel_size 1)", op);
}

}  // namespace primus::ops
