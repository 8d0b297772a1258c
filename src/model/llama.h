// The Llama-family decoder with explicit passes and no autograd (see DESIGN.md):
//
//   forward(ctx, x)          saves into ctx what the backward needs
//   backward_input(ctx, dy)  the "B" op: gradient w.r.t. the layer input; keeps what W needs
//   backward_weight(ctx)     the "W" op: accumulates the weight gradients, then frees ctx
//
// A context is per microbatch, so a pipeline can keep several in flight and run B and W apart.
// One block computes, per token row (N = batch * seq rows):
//   h1 = rmsnorm(x)            qkv = h1 Wqkv^T (+b), rope(q, k)     o = attention(qkv)
//   x2 = x + o Wo^T            h2 = rmsnorm(x2)   gu = h2 W13^T     a = silu(g) * u
//   y  = x2 + a W2^T
// T is float for training and double for the finite-difference tests.
//
// Parallel layouts (ModelPartition). Tensor parallel follows Megatron: linear_qkv and linear_fc1
// are column-parallel (each rank holds its attention heads and query groups, and its slice of
// the gate and up rows), linear_proj and linear_fc2 row-parallel (their partial outputs are
// summed over tp), the embedding and output layer are vocabulary-parallel (the cross-entropy
// combines per-row max, sum of exponentials and target logit over tp). With sequence parallel,
// the rows between those regions (norms, residuals) are split over tp: all-gather before a
// column-parallel linear, reduce-scatter after a row-parallel one. Pipeline parallel gives a
// rank one or more chunks, each a consecutive range of layers; the first stage's chunk holds the
// embedding and the last stage's the final norm, output layer and loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/attention.h"
#include "model/model_spec.h"
#include "model/param_store.h"
#include "parallel/process_group.h"

namespace primus {

// Megatron's recompute_granularity. selective recomputes the cheap, memory-hungry parts (the
// attention core, SwiGLU and the norms) from saved inputs; full keeps only each block's input
// and re-runs the whole block before its backward.
enum class Recompute : uint8_t { None, Selective, Full };
Recompute parse_recompute(const std::string& s);  // "", "none", "selective", "full"

struct LlamaOptions {
  Recompute recompute = Recompute::None;
  // The output layer keeps the microbatch's logits gradient when it fits in this budget (3 GEMMs);
  // above it, it works in vocabulary chunks of `vocab_chunk` columns and recomputes the logits
  // in the backward (4 GEMMs, memory bounded by N * vocab_chunk).
  size_t logits_memory_budget = size_t(512) << 20;
  int64_t vocab_chunk = 8192;
};

// What part of the model this rank holds, and the group it shares its layers with.
struct ModelPartition {
  int tp_size = 1, tp_rank = 0;
  parallel::ProcessGroup* tp_group = nullptr;  // required when tp_size > 1
  bool sequence_parallel = false;
  struct Chunk {
    int64_t first_layer = 0, num_layers = 0;
    bool has_embedding = false, has_head = false;  // the first / the last pipeline stage
  };
  std::vector<Chunk> chunks;  // in chunk order; empty: one chunk with the whole model
};

// Checks that spec can be split tp ways (heads, query groups, ffn and vocabulary divisible);
// throws primus::Error naming the rule that fails.
void check_tensor_parallel(const ModelSpec& spec, int tp_size);

template <typename T>
struct BlockContext {
  Tensor x;                                           // block input (owned by the previous layer)
  Tensor h1, rstd1, qkv, attn, lse, x2, h2, rstd2, gate_up, act;  // forward saves
  Tensor dy, dqkv, dh1, dx2, dgate_up, dh2;           // B-pass outputs the W pass needs
  void clear() { *this = BlockContext(); }
};

template <typename T>
struct HeadContext {
  Tensor x, hn, rstd, lse, dlogits, dhn;
  const int32_t* targets = nullptr;
  int64_t valid = 0;  // tokens whose target is not ignored (< 0)
  T grad_scale = 0;   // dloss / valid, set by the B pass
};

template <typename T>
struct LlamaContext {
  int64_t batch = 0, seq = 0;
  T loss = 0;  // set by the forward of the chunk that holds the head
  std::vector<int32_t> tokens, targets;
  Tensor embedded;
  std::vector<BlockContext<T>> blocks;
  HeadContext<T> head;
  Tensor dembedded;  // gradient reaching the embedding, kept for its W pass
};

template <typename T>
class TransformerBlock {
 public:
  TransformerBlock(const ModelSpec& spec, int64_t layer, ParamStore<T>& params, Recompute recompute,
                   const ModelPartition& part);
  // x [N, hidden] -> y [N, hidden]
  Tensor forward(BlockContext<T>& ctx, const Tensor& x, int64_t batch, int64_t seq, const T* cos, const T* sin);
  Tensor backward_input(BlockContext<T>& ctx, const Tensor& dy, int64_t batch, int64_t seq, const T* cos,
                        const T* sin);
  void backward_weight(BlockContext<T>& ctx);
  std::vector<int> param_ids() const;  // the ParamStore ids of this block's tensors

 private:
  void rebuild(BlockContext<T>& ctx, int64_t batch, int64_t seq, const T* cos, const T* sin);
  cpu::AttentionShape attention_shape(int64_t batch, int64_t seq) const;

  const ModelSpec& spec_;
  ParamStore<T>& p_;
  Recompute recompute_;
  const ModelPartition& part_;
  int64_t heads_, groups_;  // this rank's attention heads and query groups
  int attn_norm_, qkv_w_, qkv_b_ = -1, proj_w_, mlp_norm_, fc1_w_, fc2_w_;
};

template <typename T>
class LlamaModel {
 public:
  explicit LlamaModel(const ModelSpec& spec, LlamaOptions options = {}, ModelPartition partition = {});
  void init_weights(uint64_t seed);

  const ModelSpec& spec() const { return spec_; }
  ParamStore<T>& params() { return params_; }
  const ParamStore<T>& params() const { return params_; }

  // Runs the forward pass of one microbatch; returns the mean loss over tokens whose target is
  // >= 0 (a negative target masks a token out). tokens and targets are [batch, seq].
  T forward(LlamaContext<T>& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq);
  // dloss: gradient of the objective w.r.t. this microbatch's mean loss (1 / microbatches).
  void backward_input(LlamaContext<T>& ctx, T dloss);  // B for every layer
  void backward_weight(LlamaContext<T>& ctx);          // W for every layer
  void backward(LlamaContext<T>& ctx, T dloss);        // B then W layer by layer: less memory

  // Logits of the last position of each sequence, for generation: [batch, vocab]. One rank only.
  Tensor last_logits(LlamaContext<T>& ctx) const;

  // ---- one pipeline chunk at a time (the executor's StageRunner calls these) ----
  const ModelPartition& partition() const { return part_; }
  int num_chunks() const { return int(part_.chunks.size()); }
  // Stores the microbatch's tokens and targets (targets may be null) in ctx.
  void begin_microbatch(LlamaContext<T>& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                        int64_t seq);
  // Rows of the activation a chunk receives and sends: batch * seq, divided by tp under
  // sequence parallelism.
  int64_t activation_rows(int64_t batch, int64_t seq) const;
  // F of one chunk: `input` is ignored by the chunk with the embedding. Returns the chunk's
  // output, or an undefined Tensor for the chunk with the head (the loss goes to ctx.loss).
  Tensor forward_chunk(LlamaContext<T>& ctx, int chunk, const Tensor& input);
  // B of one chunk: `dy` is ignored by the chunk with the head (it starts from dloss). Returns
  // the gradient of the chunk's input, or an undefined Tensor for the chunk with the embedding.
  Tensor backward_input_chunk(LlamaContext<T>& ctx, int chunk, const Tensor& dy, T dloss);
  void backward_weight_chunk(LlamaContext<T>& ctx, int chunk);

  // Called after every W pass of a block, of the head and of the embedding with the ids of the
  // tensors whose gradients it just accumulated: data parallelism starts a gradient bucket's
  // reduction once the last microbatch's W of all its tensors is done.
  using WeightGradHook = std::function<void(const std::vector<int>& param_ids)>;
  void set_weight_grad_hook(WeightGradHook hook) { weight_grad_hook_ = std::move(hook); }
  // How many times per microbatch the hook reports a tensor: 2 for a tied embedding that this
  // rank uses both as input and output layer, else 1.
  int weight_grad_passes(int param_id) const {
    return param_id == embedding_ && output_ == embedding_ ? 2 : 1;
  }
  int embedding_param() const { return embedding_; }  // -1 when this rank has none
  int output_param() const { return output_; }        // -1 when this rank has no head

 private:
  // Output layer: final norm, logits, cross-entropy.
  T head_forward(HeadContext<T>& h, const Tensor& x, const int32_t* targets);
  Tensor head_backward_input(HeadContext<T>& h, T dloss);
  void head_backward_weight(HeadContext<T>& h);
  bool head_stores_logits(int64_t rows) const;
  void embedding_weight_pass(LlamaContext<T>& ctx);
  const T* output_weight() const;
  T* output_weight_grad() const;

  ModelSpec spec_;
  LlamaOptions opt_;
  ModelPartition part_;
  std::vector<std::pair<size_t, size_t>> chunk_blocks_;  // [begin, end) into blocks_ per chunk
  int64_t vocab_start_ = 0, vocab_local_ = 0;           // this rank's rows of the vocabulary
  ParamStore<T> params_;
  std::vector<std::unique_ptr<TransformerBlock<T>>> blocks_;
  int embedding_ = -1, final_norm_ = -1, output_ = -1;  // output_ == embedding_ when tied
  Tensor rope_cos_, rope_sin_;
  WeightGradHook weight_grad_hook_;
  void weights_done(const std::vector<int>& ids) const {
    if (weight_grad_hook_) weight_grad_hook_(ids);
  }
};

extern template class LlamaModel<float>;
extern template class LlamaModel<double>;

}  // namespace primus
