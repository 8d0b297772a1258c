#include "model/documents.h"

#include "core/context_parallel_rows.h"
#include "model/attention_flops.h"

#include <algorithm>

namespace primus {

DocumentRows document_rows(const PackedDocuments& docs, int64_t batch, int64_t seq, int cp, int cp_rank,
                           Device device, int64_t attention_chunk) {
  DocumentRows r;
  if (!docs.active() && attention_chunk <= 0) return r;
  const int64_t S = seq * cp;  // the whole sequence
  if (docs.active()) docs.check(batch, S);
  // Per whole-sequence position: its document's start.
  std::vector<int32_t> start(size_t(batch * S), 0);
  for (int64_t b = 0; b < batch && docs.active(); ++b) {
    const std::vector<int32_t>& st = docs.starts[size_t(b)];
    for (size_t d = 0; d < st.size(); ++d) {
      const int64_t end = d + 1 < st.size() ? st[d + 1] : S;
      std::fill(start.begin() + b * S + st[d], start.begin() + b * S + end, st[d]);
    }
  }
  // Where each position's attention starts: its document's (when separated), its chunk's.
  std::vector<int32_t> attend(size_t(batch * S), 0);
  if (docs.active() && docs.separate_attention) attend = start;
  if (attention_chunk > 0)
    for (int64_t i = 0; i < batch * S; ++i)
      attend[size_t(i)] = std::max(attend[size_t(i)], int32_t((i % S) / attention_chunk * attention_chunk));
  // This rank's rows as whole-sequence indices b * S + position.
  const std::vector<int64_t> rows = cp_sequence_rows(batch, S, cp, cp_rank);
  if (docs.active() && docs.restart_positions) {
    r.positions.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) r.positions[i] = int32_t(rows[i] % S - start[size_t(rows[i])]);
  }
  if ((docs.active() && docs.separate_attention) || attention_chunk > 0) {
    Tensor mine = Tensor::empty({int64_t(rows.size())}, DType::I32);
    for (size_t i = 0; i < rows.size(); ++i) mine.data<int32_t>()[i] = attend[size_t(rows[i])];
    r.doc_start = mine.to(device);
    if (cp > 1) {
      Tensor whole = Tensor::empty({batch * S}, DType::I32);
      std::copy(attend.begin(), attend.end(), whole.data<int32_t>());
      r.seq_doc_start = whole.to(device);
    }
  }
  return r;
}

ops::AttentionShape with_documents(ops::AttentionShape s, const Tensor& doc_start, int64_t key_pos0) {
  if (!doc_start.defined()) return s;
  s.doc_start = doc_start;
  s.key_pos0 = key_pos0;
  return s;
}

double documents_attention_flops(const ModelSpec& spec, const PackedDocuments& docs, int64_t batch, int64_t seq) {
  if (!docs.separate_attention || docs.starts.empty()) return double(batch) * attention_flops(spec, seq);
  docs.check(batch, seq);
  double f = 0;
  for (const std::vector<int32_t>& starts : docs.starts)
    for (size_t d = 0; d < starts.size(); ++d)
      f += attention_flops(spec, (d + 1 < starts.size() ? int64_t(starts[d + 1]) : seq) - starts[d]);
  return f;
}

}  // namespace primus
