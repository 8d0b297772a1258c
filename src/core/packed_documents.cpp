#include "core/packed_documents.h"

#include "core/error.h"

namespace primus {

void PackedDocuments::check(int64_t batch, int64_t seq) const {
  if (starts.empty()) return;
  if (int64_t(starts.size()) != batch)
    fail("packed documents: {} lists of document starts for a microbatch of {} sequences", starts.size(), batch);
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t>& s = starts[size_t(b)];
    if (s.empty() || s[0] != 0) fail("packed documents: sequence {} must list its first document at position 0", b);
    for (size_t i = 1; i < s.size(); ++i)
      if (s[i] <= s[i - 1] || s[i] >= seq)
        fail("packed documents: sequence {} lists document start {} after {}: starts must ascend within 0 .. {}", b,
             s[i], s[i - 1], seq - 1);
  }
}

}  // namespace primus
