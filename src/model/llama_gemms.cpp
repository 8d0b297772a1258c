#include "model/llama_gemms.h"

#include <algorithm>
#include <string>

namespace primus {

namespace {

// The GEMMs of the layers in three lists, each linear added in forward order; the backward's
// lists run in reverse (the order the model runs them).
struct Passes {
  std::vector<LlamaGemm> f, b, w;
  // A linear y = x W^T with W [out, in] over `rows` rows: forward (fp32 out, adding onto a
  // residual), input gradient (adding into dx), weight gradient.
  void linear(const std::string& name, int64_t rows, int64_t out, int64_t in, int64_t fwd, int64_t count,
              bool fwd_f32 = false, bool residual = false, bool adds_grad = false, bool bias = false) {
    f.push_back({name + " forward", false, true, rows, out, in, fwd_f32, bias, residual, fwd});
    b.push_back({name + " input grad", false, false, rows, in, out, false, false, adds_grad, count});
    w.push_back({name + " weight grad", true, false, out, in, rows, true, false, true, count});
  }
  std::vector<LlamaGemm> in_order() const {
    std::vector<LlamaGemm> g = f;
    g.insert(g.end(), b.rbegin(), b.rend());
    g.insert(g.end(), w.rbegin(), w.rend());
    return g;
  }
};

}  // namespace

std::vector<LlamaGemm> llama_gemms(const ModelSpec& s, int64_t micro_batch, int64_t seq, int64_t vocab_chunk,
                                   bool recompute_forward, GemmLayout layout) {
  const int tp = std::max(layout.tp, 1);
  const int64_t N = micro_batch * seq, C = s.hidden_size, F = s.ffn_hidden_size / tp;
  const int64_t QS = s.attention_out_size() / tp, Q = s.qkv_size() / tp, V = s.vocab_size / tp;
  int64_t L = 0, Lm = 0;  // dense and MoE layers
  for (int64_t l = 0; l < s.num_layers; ++l) (s.is_moe_layer(l) ? Lm : L) += 1;
  const int64_t layers = L + Lm, again = recompute_forward ? 2 : 1;
  const bool residual = tp == 1;  // with tp ranks the residual is added after the partial sums' reduction
  Passes p;
  if (s.multi_latent_attention) {  // dh1 = kv_down's input gradient, then q_proj's or q_down's added
    const int64_t H = s.num_attention_heads / tp, Dq = s.qk_head_dim + s.qk_pos_emb_head_dim;
    if (s.q_lora_rank > 0) {
      p.linear("layer q_down", N, s.q_lora_rank, C, layers * again, layers, false, false, true);
      p.linear("layer q_up", N, H * Dq, s.q_lora_rank, layers * again, layers);
    } else {
      p.linear("layer q_proj", N, H * Dq, C, layers * again, layers, false, false, true);
    }
    p.linear("layer kv_down", N, s.kv_lora_rank + s.qk_pos_emb_head_dim, C, layers * again, layers);
    p.linear("layer kv_up", N, H * (s.qk_head_dim + s.v_head_dim), s.kv_lora_rank, layers * again, layers);
  } else {
    p.linear("layer qkv", N, Q, C, layers * again, layers, false, false, false, s.add_qkv_bias);
  }
  p.linear("layer proj", N, C, QS, layers * again, layers, false, residual);
  if (L > 0) {
    p.linear("layer fc1", N, 2 * F, C, L * again, L);
    p.linear("layer fc2", N, C, F, L * again, L, false, residual);
  }
  if (Lm > 0) {
    const int etp = tp > 1 ? std::max(layout.etp, 1) : 1, ep = std::max(layout.ep, 1);
    const bool split = etp > 1, sp = layout.sequence_parallel && tp > 1;  // experts split over tp
    const int64_t Nm = !split && sp ? N / tp : N, Nl = sp ? N / tp : N;  // routed rows; the router's gradient rows
    const int64_t E = s.num_experts, El = E / ep, Me = ep * Nm * s.moe_router_topk / E;
    const int64_t Fe = s.expert_ffn() / etp, Fs = s.moe_shared_expert_intermediate_size / etp;
    p.f.push_back({"moe router forward", false, true, Nm, E, C, true, false, false, Lm});
    p.b.push_back({"moe router input grad", false, false, Nl, C, E, false, false, true, Lm});
    p.w.push_back({"moe router weight grad", true, false, E, C, Nl, true, false, true, Lm});
    p.linear("moe expert fc1", Me, 2 * Fe, C, Lm * El, Lm * El);
    p.linear("moe expert fc2", Me, C, Fe, Lm * El, Lm * El);
    for (auto* v : {&p.f, &p.b})  // the weight gradients are one GEMM per expert
      for (size_t i = v->size() - 2; i < v->size(); ++i) (*v)[i].what += " (grouped)";
    if (Fs > 0) {
      p.linear("moe shared fc1", Nm, 2 * Fs, C, Lm, Lm, false, false, true);
      p.linear("moe shared fc2", Nm, C, Fs, Lm, Lm, false, !s.moe_shared_expert_gate);
      if (s.moe_shared_expert_gate) {  // its forward is a row dot, not a GEMM
        p.b.push_back({"moe shared gate input grad", false, false, Nl, C, 1, false, false, true, Lm});
        p.w.push_back({"moe shared gate weight grad", true, false, 1, C, Nl, true, false, true, Lm});
      }
    }
  }
  std::vector<LlamaGemm> g = p.in_order();
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
