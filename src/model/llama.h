// The Llama-family decoder with explicit passes and no autograd (docs/architecture.md), written once
// against the op set (kernels/backend.h) for every precision, device and parallel layout:
//
//   forward(ctx, x)          saves into ctx what the backward needs
//   backward_input(ctx, dy)  the "B" op: gradient w.r.t. the layer input; keeps what W needs
//   backward_weight(ctx)     the "W" op: accumulates the weight gradients, then frees ctx
//
// A context is per microbatch, so a pipeline can keep several in flight and run B and W apart.
// One block computes, per token row (N = batch * seq rows), from its two parts (model/block_part.h):
//   x2 = x + attention(rmsnorm(x))       attention part: GQA (qkv, QK-norm, rope, core, proj) or MLA
//   y  = x2 + feed_forward(rmsnorm(x2))  feed-forward part: SwiGLU (fc1, silu(g) * u, fc2) or MoE
// The block owns the norms and residuals; each part its parameters, passes, saves and decode step.
//
// Precision (Precision below) is a property of the run, not of the code:
//   master weights   ParamStore (fp32; fp64 for the finite-difference tests): what the optimizer
//                    updates and checkpoints hold, the same names, shapes and layout in every
//                    precision and on every device
//   working weights  what the ops read: the master itself in fp32 and fp64; in bf16 a bf16 copy
//                    of it (one flat buffer, same offsets), refreshed by the optimizer step and by
//                    sync_working_weights() after a load
//   activations      the working dtype; statistics (rstd, log-sum-exps, logits, loss) fp32 (fp64)
//   gradients        the master dtype, accumulated by the W passes straight into the ParamStore
//
// Parallel layouts (ModelPartition). Tensor parallel follows Megatron: linear_qkv and linear_fc1
// are column-parallel (each rank holds its attention heads and query groups, and its slice of
// the gate and up rows), linear_proj and linear_fc2 row-parallel (their partial outputs are
// summed over tp), the embedding and output layer are vocabulary-parallel (the cross-entropy
// combines per-row max, sum of exponentials and target logit over tp). Multi-latent attention
// (model/mla.h) splits the same way: its up projections column-parallel by heads, its down
// projections and latent norms replicated, linear_proj row-parallel. With sequence parallel,
// the rows between those regions (norms, residuals) are split over tp: all-gather before a
// column-parallel linear, reduce-scatter after a row-parallel one. Pipeline parallel gives a
// rank one or more chunks, each a consecutive range of layers; the first stage's chunk holds the
// embedding and the last stage's the final norm, output layer and loss. The tp group's buffers
// live on the backend's device (MPI on the CPU, NCCL on GPUs).
//
// Context parallel (model/context_parallel.h) cuts each sequence in 2 x cp chunks; a rank holds
// chunks cp_rank and 2 cp - 1 - cp_rank (one early, one late: causal attention's work balanced),
// as its microbatch's rows in [chunk][batch][position] order. Every layer but attention is per
// token; rotary embedding uses the chunks' positions; attention reaches the other ranks' keys and
// values by a ring (p2p) or an all-to-all over heads (a2a); the loss is the mean over the whole
// sequence.
//
// Weights come from a WeightSource (model/weight_source.h) unit by unit: the model's own buffers
// by default, or FSDP's gathered shards (LlamaOptions::resident_weights false).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/attention_parts.h"
#include "model/block_part.h"
#include "model/feed_forward_parts.h"
#include "model/model_spec.h"
#include "model/norm_weight_grad.h"
#include "model/options.h"
#include "model/param_store.h"
#include "model/partition.h"
#include "model/tensor_parallel_rows.h"
#include "model/weight_source.h"
#include "parallel/process_group.h"

namespace primus {

// The working (activation) dtype of a run; the master weights are fp32, fp64 for Fp64.
enum class Precision : uint8_t { Fp32, Bf16, Fp64 };
DType activation_dtype(Precision p);
DType master_dtype(Precision p);
const char* precision_name(Precision p);  // "fp32", "bf16 mixed precision", "fp64"

struct LlamaOptions {
  Recompute recompute = Recompute::None;
  // The output layer keeps the microbatch's logits gradient when it (and, in bf16, the fp32
  // logits it comes from) fits in this budget: 3 GEMMs. Above it, it works in vocabulary chunks
  // of `vocab_chunk` columns and recomputes the logits in B and W (4 GEMMs, memory bounded by
  // N * vocab_chunk).
  size_t logits_memory_budget = size_t(512) << 20;
  int64_t vocab_chunk = 16384;
  // false: the model allocates no master weights, working copy or gradients of its own (params()
  // is the layout only); a WeightSource set before the first pass supplies them (FSDP).
  bool resident_weights = true;
  // FP8 linear layers (model/linears.h, docs/fp8.md); off by default.
  Fp8Options fp8;
  // LoRA adapters on the named linears, the rest frozen (model/linears.h); off by default.
  LoraOptions lora;
};

// Whether the head keeps the logits gradient for `rows` token rows against `vocab_local` output
// rows: when the logits (in the stat dtype) and, in bf16, their gradient fit
// logits_memory_budget (3 GEMMs), or when the FP8 output layer's quantization needs the whole
// logits (fp8_head_needs_whole_logits); else it works in chunks of options.vocab_chunk columns.
bool head_keeps_logits(const LlamaOptions& options, Precision precision, int64_t rows, int64_t vocab_local);


// Checks that spec can be split tp ways (heads, query groups, ffn and vocabulary divisible);
// throws primus::Error naming the rule that fails.
void check_tensor_parallel(const ModelSpec& spec, int tp_size);

// A block's saves: its input, residual and norms' statistics, its norms' output gradients (B ->
// W), and each part's own context.
struct BlockContext {
  Tensor x, rstd1, x2, rstd2;  // the block input (owned by the previous layer), the residual after attention
  // The norms' weight gradients, computed by B, added by W: B lets go of x, x2 and the statistics,
  // which only B and these gradients read (model/norm_weight_grad.h).
  NormWeightGrad gn1, gn2;
  std::unique_ptr<PartContext> attention, feed_forward;
};

// An output head's saves: the main model's (decoder.final_layernorm) or an MTP depth's (its
// final_layernorm), both through the shared output layer.
struct HeadContext {
  Tensor x, hn, rstd, lse, dlogits;  // B lets go of x and rstd (the norm's weight gradient is in gn)
  NormWeightGrad gn;                  // the final norm's weight gradient, from B, added by W
  Tensor normed;          // the norm's output on this rank's rows (hn is it gathered over tp)
  Tensor targets;         // int32 on the device, the targets the loss is against
  int norm = -1;          // the norm's weight
  double grad_scale = 0;  // dloss / valid tokens, set by the B pass
};

// One multi-token prediction depth's saves (docs/model_math.md#multi-token-prediction).
struct MtpContext {
  std::vector<int32_t> shard_tokens;  // the tokens k + 1 ahead, as this rank's vocabulary shard sees them
  Tensor shard_tokens_dev, targets_dev;
  int64_t valid = 0;                  // targets k + 1 ahead that are >= 0
  double loss = 0;                    // this depth's mean loss (unscaled)
  Tensor h, e, rstd_e, rstd_h, cat;   // the hidden and embedded inputs, [enorm(e), hnorm(h)]
  Tensor du, den, dhn, de;            // B -> W: the gradients of eh_proj's output, the norms' outputs, e
  BlockContext block;                 // the transformer layer (block.x: eh_proj's output)
  HeadContext head;
};

struct LlamaContext {
  int64_t batch = 0, seq = 0;
  double loss = 0;  // set by the forward of the chunk that holds the head
  std::vector<int32_t> tokens, targets;  // host, global vocabulary ids (targets may be empty)
  std::vector<int32_t> shard_tokens;     // tokens as this rank's vocabulary shard sees them (-1: another's)
  Tensor shard_tokens_dev, targets_dev;  // int32 on the backend's device
  int64_t valid = 0;                     // targets >= 0
  Tensor embedded, dembedded;            // the embedding's output, and the gradient reaching it
  std::vector<BlockContext> blocks;
  HeadContext head;
  DocumentRows docs;  // packed documents (model/documents.h); empty: none
  // LoRA dropout's key for this microbatch's passes (model/linears.h), stamped by
  // begin_microbatch from set_dropout_key(); none: no dropout (evaluation, reference passes).
  std::optional<uint64_t> dropout_key;
  std::vector<MtpContext> mtp;  // the MTP depths', on the rank with the head (model_spec.h)
  DocumentRows chunked_docs;  // the same with attention_chunk_size's chunks (Llama 4's local layers)
  // This microbatch as its blocks' passes see it (dloss: the backward's).
  PassShape pass_shape(double dloss = 1.0) const { return {batch, seq, dloss, &docs, &chunked_docs}; }
};

// The key/value cache of one sequence being decoded.
struct DecodeState {
  int64_t position = 0, capacity = 0;
  std::vector<Tensor> cache;  // per layer: [capacity, qkv size], the rotated qkv rows
};

class LlamaModel {
 public:
  LlamaModel(const ModelSpec& spec, ops::Backend& backend, Precision precision, LlamaOptions options = {},
             ModelPartition partition = {});
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Megatron's initialisation (N(0, std), output projections scaled by 1/sqrt(2 layers)); the
  // same values for any precision, device and layout. Resident weights only (a weight source
  // initialises its own, e.g. FSDP's shards through ParamStore::init).
  void init_weights(uint64_t seed);
  // work = working dtype (master), after loading or changing the master (a no-op in fp32/fp64).
  void sync_working_weights();

  const ModelSpec& spec() const { return spec_; }
  ops::Backend& backend() const { return be_; }
  Precision precision() const { return precision_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  // The linear layers' GEMMs and, under FP8, their scaling state (model/linears.h).
  Linears& linears() { return *linears_; }
  const Linears& linears() const { return *linears_; }
  // The weights the ops read, laid out like params().values(): the master itself, or its bf16 copy.
  Tensor& working_weights() { return work_; }
  bool has_separate_working_weights() const { return work_.dtype() != params_.dtype(); }

  // The units passes acquire (embedding, blocks, head, in parameter order) and the unit of each
  // parameter. set_weight_source: where the passes find them (nullptr: the model's own buffers,
  // which must then be resident). The source must outlive the model's passes.
  const std::vector<WeightUnit>& weight_units() const { return units_; }
  int unit_of(int param_id) const { return unit_of_[param_id]; }
  void set_weight_source(WeightSource* source);

  // Runs the forward pass of one microbatch; returns the mean loss over tokens whose target is
  // >= 0 (a negative target masks a token out). tokens and targets are [batch, seq]; under context
  // parallelism this rank's two chunks of each sequence ([2 chunks][batch][seq / 2]: seq is the
  // rank's share, 2 x cp x seq / 2 the whole length), and the loss is the whole sequence's mean.
  // docs: documents packed into the sequences (core/packed_documents.h: their starts in the whole
  // sequences, whatever the layout), attention kept inside each and/or positions restarting at
  // each; null or inactive: one document per sequence.
  double forward(LlamaContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                 const PackedDocuments* docs = nullptr);
  // dloss: gradient of the objective w.r.t. this microbatch's mean loss (1 / microbatches).
  void backward_input(LlamaContext& ctx, double dloss);  // B for every layer
  void backward_weight(LlamaContext& ctx);               // W for every layer
  void backward(LlamaContext& ctx, double dloss);        // B then W layer by layer: less memory

  // ---- one pipeline chunk at a time (the executor's StageRunner calls these) ----
  const ModelPartition& partition() const { return part_; }
  int num_chunks() const { return int(part_.chunks.size()); }
  // Checks and stores the microbatch's tokens and targets (targets may be null: inference) and its
  // packed documents (as forward()'s; null: none) in ctx.
  void begin_microbatch(LlamaContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                        int64_t seq, const PackedDocuments* docs = nullptr) const;
  // Rows of the activation a chunk receives and sends: batch * seq (seq: this rank's tokens per
  // sequence), divided by tp under sequence parallelism. Its dtype is the working dtype.
  int64_t activation_rows(int64_t batch, int64_t seq) const;
  DType activation_dtype() const { return act_; }
  // F of one chunk: `input` is ignored by the chunk with the embedding. Returns the chunk's
  // output, or an undefined Tensor for the chunk with the head (the loss goes to ctx.loss).
  Tensor forward_chunk(LlamaContext& ctx, int chunk, const Tensor& input);
  // B of one chunk: `dy` is ignored by the chunk with the head (it starts from dloss). Returns
  // the gradient of the chunk's input, or an undefined Tensor for the chunk with the embedding.
  Tensor backward_input_chunk(LlamaContext& ctx, int chunk, const Tensor& dy, double dloss);
  void backward_weight_chunk(LlamaContext& ctx, int chunk);

  // Logits (fp32, host [batch, vocab]) of the last position of each sequence, after a forward
  // without targets. One rank holding the whole model.
  Tensor last_logits(const LlamaContext& ctx) const;

  // ---- decoding with a key/value cache (one rank holding the whole model) ----
  DecodeState start_decoding(int64_t max_positions) const;
  // Feeds `tokens` at the next positions of the sequence; returns the fp32 logits (host, vocab
  // entries) of the position after the last one.
  std::vector<float> decode(DecodeState& state, const std::vector<int32_t>& tokens) const;

  // Called after every W pass of a block, of the head and of the embedding with the ids of the
  // tensors whose gradients it just accumulated: data parallelism starts a gradient bucket's
  // reduction once the last microbatch's W of all its tensors is done.
  using WeightGradHook = std::function<void(const std::vector<int>& param_ids)>;
  void set_weight_grad_hook(WeightGradHook hook) { weight_grad_hook_ = std::move(hook); }
  // How many times per microbatch the hook reports a tensor: 2 for a tied embedding that this
  // rank uses both as input and output layer, else 1.
  int weight_grad_passes(int param_id) const {
    return 1 + (param_id == embedding_ && output_ == embedding_) +
           (param_id == embedding_ && mtp_embedding_ == embedding_ && output_ != embedding_);
  }
  // The LoRA dropout key (model/linears.h) that begin_microbatch gives the microbatches it starts
  // from now on (the trainer sets one per training microbatch and clears it after); none: none.
  void set_dropout_key(std::optional<uint64_t> key) { dropout_key_ = key; }
  // Under LoRA only the adapters train: they follow every frozen tensor in the store, from flat
  // offset trainable_begin() (0 without LoRA: everything trains) and tensor first_trainable().
  bool frozen_base() const { return opt_.lora.enabled; }
  int64_t trainable_begin() const { return trainable_begin_; }
  int first_trainable() const { return first_trainable_; }
  // Whether tensor `param_id` trains (has a gradient and optimizer state): the one question the
  // data-parallel strategies ask of a tensor (train/dp_strategy.cpp, train/sharded_weights.cpp).
  bool trains(int param_id) const { return param_id >= first_trainable_; }
  int embedding_param() const { return embedding_; }  // -1 when this rank has none
  // The embedding the MTP depths read: embedding_param(), the tied output layer's replica, or (a last
  // pipeline stage, untied) a replica of its own; -1 without MTP on this rank. Kept equal to the
  // first stage's as the tied replica is (train/model_parallel_grads.h).
  int mtp_embedding_param() const { return mtp_embedding_; }
  // The MTP depths' mean losses of the last forward, unscaled, in depth order (empty without MTP).
  std::vector<double> mtp_losses(const LlamaContext& ctx) const;
  // Per depth, those losses summed over the forwards since reset_mtp_losses() (the trainer's log).
  const std::vector<double>& mtp_loss_sums() const { return mtp_loss_sums_; }
  void reset_mtp_losses() { mtp_loss_sums_.assign(mtp_.size(), 0.0); }
  int output_param() const { return output_; }        // -1 when this rank has no head
  // Whether the head keeps the logits gradient for `rows` rows (else it works in chunks).
  bool head_stores_logits(int64_t rows) const;

  // ---- mixture of experts (model/moe.h) ----
  // Per MoE block of this rank, in layer order: its statistics summed since the last reset
  // (tokens per expert over the microbatches' forwards, aux and z losses summed).
  using MoeLayerStats = primus::MoeLayerStats;
  const std::vector<MoeLayerStats>& moe_stats() const;
  void reset_moe_stats();
  // The aux-loss-free balancing step (moe_router_enable_expert_bias): each block's expert bias
  // moves by moe_router_bias_update_rate against its load; `tokens` per block as in moe_stats()
  // (the caller sums them over data-parallel ranks first). Updates master and working copies.
  void update_expert_biases(const std::vector<std::vector<int64_t>>& tokens);

 private:
  // A decoder layer: its two norms and its two parts.
  struct Block {
    int attn_norm = -1, mlp_norm = -1;
    std::unique_ptr<BlockPart> attention, feed_forward;
    std::vector<int> adapters;       // its linears' LoRA adapters (after every frozen tensor)
    std::vector<int> base_ids() const;  // its norms' and parts' tensors, registered together
    std::vector<int> ids() const;       // those and its adapters: what its W pass accumulates
  };
  // A multi-token prediction depth (model/mtp.cpp): its norms, eh_proj [C, 2C], one transformer
  // layer of the last decoder layer's kind, its final norm; the embedding and output layer shared.
  struct MtpDepth {
    int enorm = -1, hnorm = -1, eh_proj = -1, final_norm = -1;
    Block layer;
    std::vector<int> ids() const;  // everything its W pass accumulates, but the shared tensors
  };
  class Held;  // the units a pass holds acquired (llama.cpp)
  class Dropout;  // a pass's LoRA dropout key installed in the linears (llama.cpp)
  class ResidentWeights;
  class Params;  // the parts' view of the weights (ParamAccess)
  void check_partition();
  void register_parameters();

  Tensor w(int id) const;  // working weight, shaped (its unit acquired)
  int block_unit(size_t block) const { return unit_of_[blocks_[block].attn_norm]; }
  Tensor g(int id) const;  // gradient, shaped
  Tensor act(const Shape& shape) const { return be_.empty(shape, act_); }
  Tensor stat(const Shape& shape) const { return be_.empty(shape, stat_); }
  WeightSource& source() const { return *source_; }
  // The microbatch's loss sum and valid tokens summed over the cp group (identities without cp).
  void sum_over_context(double& total, int64_t& valid) const;

  // Tensor-parallel collectives on [rows, C] activations (identities with one rank): tp_rows_'s.
  Tensor gather_rows(const Tensor& local) const;
  Tensor reduce_partial(Tensor partial) const;

  // A block's passes: norm -> attention -> residual -> norm -> feed-forward -> residual.
  Tensor block_forward(const Block& b, BlockContext& c, const Tensor& x, const PassShape& m);
  // Reruns what recompute dropped (nothing without recompute).
  void block_rebuild(const Block& b, BlockContext& c, const PassShape& m);
  Tensor block_backward_input(const Block& b, BlockContext& c, const Tensor& dy, const PassShape& m);
  void block_backward_weight(const Block& b, BlockContext& c);
  Tensor block_decode(const Block& b, Tensor& cache, const Tensor& x, int64_t pos0) const;

  // Output layer: final norm (weight `norm`), logits in vocabulary chunks, cross-entropy against
  // `targets` (valid of them >= 0; summed over cp by the forward). Without targets (inference) the
  // forward stops after the norm.
  double head_forward(HeadContext& h, int norm, const Tensor& x, const Tensor& targets, bool has_targets,
                      int64_t& valid);
  double head_sharded_loss(HeadContext& h, const Tensor& targets);  // vocabulary chunks or tp shards
  // dloss: the objective's gradient w.r.t. the mean loss over `valid` tokens. dnormed (undefined: none): a
  // further gradient reaching the norm's output on this rank's rows (the MTP's, on the main head).
  Tensor head_backward_input(HeadContext& h, double dloss, int64_t valid, const Tensor& dnormed);
  void head_backward_weight(HeadContext& h);  // the norm and output layer; empties h
  void head_weight_pass(LlamaContext& ctx);  // the MTP's and the head's W with the weights they need held
  // Logits (stat dtype [N, width]) of hn against this rank's output rows c0 .. c0+width.
  Tensor head_logits(const Tensor& hn, int64_t c0, int64_t width) const;
  // fp32 host logits of the rows of hn (all the vocabulary), for inference.
  std::vector<float> full_logits(const Tensor& hn) const;
  // The logits gradient of one chunk, recomputed (chunked mode): softmax - onehot.
  Tensor head_chunk_dlogits(const HeadContext& h, int64_t c0, int64_t width) const;

  // Multi-token prediction (model/mtp.cpp), on the rank with the head: registration after it, the
  // shifted tokens and targets of a microbatch, F from the main head's normed output, B back to
  // the gradient of that output (undefined without MTP), W.
  void register_mtp();
  void mtp_begin(LlamaContext& ctx) const;
  void mtp_forward(LlamaContext& ctx);
  Tensor mtp_backward_input(LlamaContext& ctx, double dloss);
  void mtp_backward_weight(LlamaContext& ctx);
  void embedding_weight_pass(LlamaContext& ctx);
  void weights_done(const std::vector<int>& ids) const {
    if (weight_grad_hook_) weight_grad_hook_(ids);
  }

  ModelSpec spec_;
  ops::Backend& be_;
  Precision precision_;
  DType act_, stat_;
  LlamaOptions opt_;
  ModelPartition part_;
  std::optional<uint64_t> dropout_key_;
  TensorParallelRows tp_rows_;  // the tp group's gather and reduce (set once the partition is checked)
  ParamStore params_;
  Tensor work_;  // working weights: params_.values() itself, or its bf16 copy
  std::unique_ptr<Params> param_access_;
  std::unique_ptr<Linears> linears_;
  int64_t trainable_begin_ = 0;
  int first_trainable_ = 0;
  std::unique_ptr<PartKit> kit_;
  std::unique_ptr<AttentionParts> attention_parts_;
  std::unique_ptr<FeedForwardParts> feed_forward_parts_;
  std::vector<Block> blocks_;
  std::vector<std::pair<size_t, size_t>> chunk_blocks_;  // [begin, end) into blocks_ per chunk
  int64_t vocab_start_ = 0, vocab_local_ = 0;           // this rank's rows of the vocabulary
  int embedding_ = -1, final_norm_ = -1, output_ = -1;   // output_ == embedding_ when tied
  std::vector<MtpDepth> mtp_;                            // on the rank with the head
  int mtp_embedding_ = -1;
  std::vector<double> mtp_loss_sums_;
  mutable std::vector<MoeLayerStats> moe_stats_;        // moe_stats()'s copy of the parts'
  WeightGradHook weight_grad_hook_;
  std::vector<WeightUnit> units_;
  std::vector<int> unit_of_;                 // per parameter
  std::unique_ptr<WeightSource> resident_;   // the model's own buffers as a source
  WeightSource* source_ = nullptr;
};

}  // namespace primus
