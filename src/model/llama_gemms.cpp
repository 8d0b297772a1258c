#include "model/llama_gemms.h"

#include <algorithm>

namespace primus {

std::vector<LlamaGemm> llama_gemms(const ModelSpec& s, int64_t micro_batch, int64_t seq, int64_t vocab_chunk,
                                   bool recompute_forward, int tp) {
  const int64_t N = micro_batch * seq, C = s.hidden_size, F = s.ffn_hidden_size / tp, QS = s.q_size() / tp;
  const int64_t Q = s.qkv_size() / tp, L = s.num_layers, V = s.vocab_size / tp;
  const int64_t fwd = L * (recompute_forward ? 2 : 1);
  const bool residual = tp == 1;  // with tp ranks the residual is added after the partial sums' reduction
  std::vector<LlamaGemm> g = {
      {"layer qkv forward", false, true, N, Q, C, false, s.add_qkv_bias, false, fwd},
      {"layer proj forward", false, true, N, C, QS, false, false, residual, fwd},
      {"layer fc1 forward", false, true, N, 2 * F, C, false, false, false, fwd},
      {"layer fc2 forward", false, true, N, C, F, false, false, residual, fwd},
      {"layer fc2 input grad", false, false, N, F, C, false, false, false, L},
      {"layer fc1 input grad", false, false, N, C, 2 * F, false, false, false, L},
      {"layer proj input grad", false, false, N, QS, C, false, false, false, L},
      {"layer qkv input grad", false, false, N, C, Q, false, false, false, L},
      {"layer fc2 weight grad", true, false, C, F, N, true, false, true, L},
      {"layer fc1 weight grad", true, false, 2 * F, C, N, true, false, true, L},
      {"layer proj weight grad", true, false, C, QS, N, true, false, true, L},
      {"layer qkv weight grad", true, false, Q, C, N, true, false, true, L},
  };
  const int64_t vc = std::min(vocab_chunk, V);
  const int64_t full = V / vc, rest = V % vc;
  const bool chunked = vc < V;
  auto head = [&](int64_t width, int64_t chunks) {
    if (chunks == 0) return;
    g.push_back({"head logits", false, true, N, width, C, true, false, false, chunks * (chunked ? 3 : 1)});
    g.push_back({"head input grad", false, false, N, C, width, true, false, true, chunks});
    g.push_back({"head weight grad", true, false, width, C, N, true, false, true, chunks});
  };
  head(vc, full);
  head(rest, rest ? 1 : 0);
  return g;
}

}  // namespace primus
