// The Llama model in bf16 mixed precision, on any op backend (kernels/backend.h): the CUDA
// backend on a GPU, the CPU reference backend in tests and on machines without one.
//
//   master weights   fp32, ParamStore on the backend's device (what the optimizer updates and
//                    checkpoints hold: the same names, shapes and layout as LlamaModel<float>)
//   working weights  bf16 copy of the master (one flat buffer, same offsets), read by every op;
//                    the fused AdamW refreshes it, sync_working_weights() after a load
//   activations      bf16; norm statistics, log-sum-exps, logits and the loss fp32
//   gradients        fp32, accumulated by the W passes straight into the ParamStore's buffer
//
// The passes and their order are LlamaModel's (model/llama.h): forward saves into a context,
// backward_input (B) then backward_weight (W) per layer, selective or full recompute, and the
// same weight-gradient hook so that data parallelism overlaps its bucket reductions with the
// backward. One process holds the whole model: tensor and pipeline parallelism stay with the fp32
// model for now. The GEMMs it runs are listed in model/llama_gemms.h.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/llama.h"
#include "model/model_spec.h"
#include "model/param_store.h"

namespace primus {

struct MixedLlamaOptions {
  Recompute recompute = Recompute::None;
  // The head keeps the microbatch's logits gradient (bf16 [N, vocab]) when it and the transient
  // fp32 logits fit this budget (N * vocab * 6 bytes); else it works in chunks of vocab_chunk
  // columns and recomputes the logits in B and in W.
  size_t logits_memory_budget = size_t(2) << 30;
  int64_t vocab_chunk = 16384;
};

struct MixedBlockContext {
  Tensor x;                                                   // block input (bf16 [N, C])
  Tensor h1, rstd1, qkv, attn, lse, x2, h2, rstd2, gate_up, act;  // forward saves
  Tensor dy, dqkv, dh1, dx2, dgate_up, dh2;                   // B outputs the W pass needs
};

struct MixedContext {
  int64_t batch = 0, seq = 0;
  float loss = 0;
  std::vector<int32_t> tokens, targets;  // host copies
  Tensor tokens_dev, targets_dev;        // int32 on the backend's device
  int64_t valid = 0;                     // targets >= 0
  Tensor embedded, dembedded;
  std::vector<MixedBlockContext> blocks;
  struct Head {
    Tensor x, hn, rstd, lse, dlogits, dhn;
    float grad_scale = 0;
  } head;
};

class MixedLlamaModel {
 public:
  MixedLlamaModel(const ModelSpec& spec, ops::Backend& backend, MixedLlamaOptions options = {});

  const ModelSpec& spec() const { return spec_; }
  ops::Backend& backend() const { return be_; }
  ParamStore<float>& params() { return params_; }
  const ParamStore<float>& params() const { return params_; }
  // The bf16 working copy: flat, laid out like params().values().
  Tensor& working_weights() { return work_; }
  void init_weights(uint64_t seed);  // the same values as LlamaModel<float>::init_weights
  void sync_working_weights();       // work = bf16(master), after loading or changing the master

  // Forward of one microbatch; returns its mean loss over tokens whose target is >= 0.
  float forward(MixedContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq);
  void backward_input(MixedContext& ctx, float dloss);  // B of every layer
  void backward_weight(MixedContext& ctx);              // W of every layer
  void backward(MixedContext& ctx, float dloss);        // B then W layer by layer: less memory

  using WeightGradHook = std::function<void(const std::vector<int>& param_ids)>;
  void set_weight_grad_hook(WeightGradHook hook) { hook_ = std::move(hook); }
  int weight_grad_passes(int param_id) const { return param_id == embedding_ && output_ == embedding_ ? 2 : 1; }
  int embedding_param() const { return embedding_; }
  int output_param() const { return output_; }
  // Whether the head keeps the logits gradient for rows = batch * seq (else it works in chunks).
  bool head_stores_logits(int64_t rows) const;

 private:
  struct Layer {
    int attn_norm, qkv_w, qkv_b = -1, proj_w, mlp_norm, fc1_w, fc2_w;
    std::vector<int> ids() const;
  };
  Tensor w(int id) const;  // working (bf16) weight, shaped
  Tensor g(int id) const;  // fp32 gradient, shaped
  Tensor act(const Shape& shape) const { return be_.empty(shape, DType::BF16); }
  Tensor stat(const Shape& shape) const { return be_.empty(shape, DType::F32); }
  ops::AttentionShape attention_shape(int64_t batch, int64_t seq) const;

  Tensor block_forward(const Layer& l, MixedBlockContext& c, const Tensor& x, int64_t batch, int64_t seq);
  void block_rebuild(const Layer& l, MixedBlockContext& c, int64_t batch, int64_t seq);
  Tensor block_backward_input(const Layer& l, MixedBlockContext& c, const Tensor& dy, int64_t batch, int64_t seq);
  void block_backward_weight(const Layer& l, MixedBlockContext& c);
  float head_forward(MixedContext& ctx, const Tensor& x);
  Tensor head_backward_input(MixedContext& ctx, float dloss);
  void head_backward_weight(MixedContext& ctx);
  // One vocabulary chunk's logits (fp32 [N, width]) of hn against output rows c0 .. c0+width.
  Tensor head_logits(const Tensor& hn, int64_t c0, int64_t width) const;
  void embedding_weight_pass(MixedContext& ctx);
  void weights_done(const std::vector<int>& ids) const {
    if (hook_) hook_(ids);
  }

  ModelSpec spec_;
  ops::Backend& be_;
  MixedLlamaOptions opt_;
  ParamStore<float> params_;
  Tensor work_;  // bf16 working weights
  std::vector<Layer> layers_;
  int embedding_ = -1, final_norm_ = -1, output_ = -1;
  Tensor rope_cos_, rope_sin_;  // fp32 on the device
  WeightGradHook hook_;
};

}  // namespace primus
