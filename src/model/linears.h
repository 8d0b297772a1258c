// The GEMMs of the model's linear layers, in one place: every linear of every block part (and
// MLA's projections) runs its three GEMMs through Linears, so how a linear computes is decided
// here, once, for every part, precision, backend and layout:
//
//   forward       D = alpha x W^T + beta C (+ bias)   W [out, in], x [rows, in]
//   input_grad    D = alpha dy W + beta C             dy [rows, out]
//   weight_grad   gW += alpha dy^T x                  gW in the master dtype
//
// in the activation dtype, or, for the linears that FP8 covers (docs/fp8.md), with FP8 operands:
// each operand quantized along the GEMM's reduction dimension by the recipe (Fp8Options), the
// product accumulated in fp32, the scales applied around it, through the op set's FP8 GEMM
// (gemm_fp8, grouped_gemm_fp8): tensor-scaled operands (delayed, tensorwise) hold FP8 values, the
// scales in alpha; block-scaled ones (blockwise, MXFP8) hold FP8 values times their blocks' inverse
// scales, with the blocks' scales beside them where the backend hands them out (docs/fp8.md). The
// CPU backends run gemm() on them (the exact emulation); CUDA runs cuBLASLt's FP8 GEMMs, tensor- or
// block-scaled, where the GPU and the problem allow it.
// Forward operands (x, W) use the forward format, gradients (dy) the backward one (hybrid: E4M3
// and E5M2). Delayed scaling keeps an amax history per linear and operand, advanced once per
// optimizer step (update_scales); the other recipes scale from the tensor itself.
//
// LoRA (LoraOptions, docs/posttraining.md#lora) lives here too, so that every linear of every part
// gets its adapters without a second copy of a layer: a linear W [out, in] that lora.target_modules
// names has A [dim, in] and B [out, dim] (Megatron-Bridge's adapter.linear_in / linear_out), and
//
//   forward       D += alpha s (x A^T) B^T                   s = lora.alpha / lora.dim
//   input_grad    D += alpha s (dy B) A
//   weight_grad   gA += alpha s (dy B)^T x,  gB += alpha s dy^T (x A^T);  W frozen: no gW
//
// recomputing the rank-dim products instead of saving them. With FP8 on, the base's GEMMs run in
// FP8 by the recipe (the weight gradient's is skipped) and the adapters' rank-dim products stay in
// the activation dtype, as Transformer Engine's base linear beside Megatron-Bridge's adapter does.
// With lora.dropout p > 0 (Megatron-Bridge's
// semantics): `pre` drops the adapter's input, x' = drop(x) in place of x in the forward, the
// input gradient's term drop(s (dy B) A) and gA, gB from x'; `post` drops the adapter's scaled
// output, D += drop(s (x A^T) B^T), and its backward uses drop(dy) in place of dy. drop keeps an
// element with probability 1 - p and scales it by 1 / (1 - p) (the op set's dropout); its mask is
// drawn from the microbatch's key (set_dropout_key, from the run's seed, the iteration and the
// microbatch) and the linear's name, and redrawn in the backward, so nothing more is saved and a
// resumed run draws the same masks. No key (evaluation, reference passes): no dropout. Under
// tensor parallelism the mask of a row-parallel linear's input and of a column-parallel linear's
// output is drawn over this rank's shard, so it is not one process's mask. Under tensor parallelism the adapter
// factor on the base's sharded side is sharded with it (a column-parallel W: B by rows, the same
// pieces; a row-parallel W: A by columns) and the other is whole on every tp rank, its gradient a
// partial sum over tp (StoredParam::tp_partial_grads): a row-parallel W's partial output carries
// s (x_r A_r^T) B^T into the tp reduction the part already does, a column-parallel W's partial
// input gradient s (dy_r B_r) A into its own. No collective is added.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/fp8.h"
#include "model/model_spec.h"  // ParamInfo
#include "model/options.h"     // Fp8Recipe, LoraOptions

namespace primus {

class ParamAccess;  // model/block_part.h
class ParamStore;   // model/param_store.h

struct Fp8Options {
  bool enabled = false;
  fp8::Format forward = fp8::Format::E4M3, backward = fp8::Format::E5M2;  // fp8: hybrid; e4m3: both E4M3
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  int margin = 0;                // delayed: scale = max / 2^margin / amax
  int amax_history_len = 1024;   // delayed
  fp8::AmaxAlgo amax_compute_algo = fp8::AmaxAlgo::Max;
  bool wgrad = true;             // fp8_wgrad: the weight gradient's GEMM in FP8 too
  int64_t bf16_layers_at_start = 0, bf16_layers_at_end = 0;  // first_last_layers_bf16
  bool output_layer = false;     // fp8_output_layer: the output layer's GEMMs in FP8 too (torchtitan's)
};

// Whether the output layer's FP8 quantization needs its whole operands, i.e. would change if the
// head ran in vocabulary chunks of `vocab_chunk` columns: current (tensorwise) scaling takes the
// amax of the whole tensor, and a chunk edge off a block edge splits blockwise's and MXFP8's blocks.
// Delayed scaling scales by its history and is the same in chunks.
bool fp8_head_needs_whole_logits(const Fp8Options& fp8, int64_t vocab_chunk);

// How a recipe scales a GEMM operand of an FP8 linear: a weight (W), or an activation or gradient
// (x, dy). Tensor scales (delayed, tensorwise), DeepSeek's 128 x 128 blocks for weights and 1 x 128
// tiles for the rest (blockwise), 1 x 32 MX blocks (mxfp8).
fp8::Granularity fp8_granularity(Fp8Recipe recipe, bool weight);

// The LoRA adapters of a model's tensor layout (model_parameter_layout: every rank's tensors, by
// global shape), named and shaped as Linears::add_adapters registers them: for each 2-D weight
// "<module>.weight" that lora.target_modules names, "<module>.adapter.linear_in.weight" [dim, in]
// and "<module>.adapter.linear_out.weight" [out, dim]. Empty without LoRA.
std::vector<std::pair<std::string, Shape>> lora_adapter_layout(const std::vector<ParamInfo>& layout,
                                                               const LoraOptions& lora);

// The LoRA dropout key of a training microbatch (Linears::set_dropout_key): the run's seed and
// the index of the microbatch's first sample in the run's stream of samples (a DPO pair's chosen
// side is sample 2 d of draw d, its rejected side takes that key mixed once more), so that a resumed run, or another data-parallel split
// of the same global batch, draws the same masks.
uint64_t lora_dropout_key(uint64_t seed, int64_t first_sample);

class Linears {
 public:
  Linears(ops::Backend& backend, DType activation, const Fp8Options& fp8, int64_t num_layers,
          const LoraOptions& lora = {});

  // Declares weight `weight` (named `name`, of decoder layer `layer`) a linear: FP8 covers it when
  // FP8 is on and the layer is not one of those kept in bf16 (first_last_layers_bf16 counts the
  // decoder's layers; a multi-token-prediction depth, layer num_layers + k, is never kept out, as
  // in Megatron); LoRA when lora.target_modules names it.
  void declare(int weight, const std::string& name, int64_t layer);
  // Declares the output layer's weight (the tied embedding's, or output_layer.weight) a linear: FP8
  // covers it when FP8 and fp8 output_layer are on (first_last_layers_bf16 counts decoder layers).
  void declare_output(int weight, const std::string& name);

  // ---- LoRA ----
  struct Adapter {
    int a = -1, b = -1;  // linear_in [dim, in], linear_out [out, dim]
    uint64_t salt = 0;   // the base weight's name hashed: its dropout masks' own stream
  };
  // The dropout key of the microbatch whose passes run next (LlamaModel sets it from the
  // context before each pass); none: the adapters run without dropout.
  void set_dropout_key(std::optional<uint64_t> key) { dropout_key_ = key; }
  const LoraOptions& lora() const { return lora_; }
  // Registers the adapters of the declared linears that lora.target_modules names, after every
  // part registered its weights (so that the trainable tensors follow the frozen ones in the
  // store); returns their ids. Nothing without LoRA.
  std::vector<int> add_adapters(ParamStore& params);
  // Where the passes read the adapters' weights and gradients (the model's units).
  void set_params(const ParamAccess* params) { params_ = params; }
  const Adapter* adapter(int weight) const;
  // The adapters of the given linears (a block's), in registration order.
  std::vector<int> adapters_of(const std::vector<int>& weights) const;
  bool fp8(int weight) const { return state_.count(weight) > 0; }
  const Fp8Options& fp8_options() const { return opt_; }
  // What FP8 covers, for the start-up log: the formats, the recipe and its scaling, how many of
  // the declared linears run in FP8 and which are kept out. Empty when FP8 is off.
  std::string describe_fp8() const;

  void forward(float alpha, const Tensor& x, const Tensor& W, int weight, float beta, const Tensor& C, Tensor& D,
               const Tensor& bias) const;
  void input_grad(float alpha, const Tensor& dy, const Tensor& W, int weight, float beta, const Tensor& C,
                  Tensor& D) const;
  void weight_grad(float alpha, const Tensor& dy, const Tensor& x, int weight, Tensor& gW) const;

  // Many linears' GEMMs of one kind as one grouped GEMM (the experts of an MoE block): problem i
  // is forward (D_i = A_i W_i^T, B_i = W_i), input_grad (D_i = A_i W_i) or weight_grad (D_i +=
  // A_i^T B_i, D_i = gW_i), W_i being weight weights[i]; each with FP8 operands when FP8 covers it.
  enum class Gemm : uint8_t { Forward, InputGrad, WeightGrad };
  void grouped(Gemm kind, const std::vector<Tensor>& A, const std::vector<Tensor>& B, const std::vector<int>& weights,
               std::vector<Tensor>& D) const;

  // ---- delayed scaling's state: per FP8 linear (in declaration order), its x, W and dy ----
  // The amaxes recorded since the last update ([linears x 3]), for the caller to reduce (max) over
  // the ranks that share the tensors; update_scales() takes them back and advances every history.
  std::vector<float> current_amaxes() const;
  void update_scales(const std::vector<float>& amaxes);
  // For checkpoints: per FP8 linear, "<weight name>.fp8_scaling" -> the histories and scales of
  // x, W and dy (3 x (amax_history_len + 1) values). load_state() takes what a checkpoint held and
  // returns the names it had to start fresh (absent, or of another history length).
  bool delayed() const { return opt_.enabled && opt_.recipe == Fp8Recipe::Delayed && !order_.empty(); }
  std::map<std::string, std::vector<float>> state() const;
  std::vector<std::string> state_names() const;
  std::vector<std::string> load_state(const std::map<std::string, std::vector<float>>& saved);
  // Forgets the amaxes recorded since the last update (evaluation's forwards, say).
  void clear_current_amaxes();

 private:
  enum Operand { X, W, Dy };
  struct Scales {
    std::string name;
    fp8::DelayedScale operand[3];
    int64_t slot = 0;  // its position in order_: its amaxes' accumulators are amax_acc_[3 slot + operand]
  };
  // dst = src quantized for a GEMM reducing over its columns or rows: 1 / its tensor scale (1 for
  // blocks), and the operand as the FP8 GEMM takes it (format, granularity, block scales).
  struct Quantized {
    float inverse_scale;
    ops::Backend::Fp8Operand operand;
  };
  Quantized quantize(const Tensor& src, Operand op, int weight, bool reduce_cols, Tensor& dst) const;
  // A GEMM's operands as it runs them: the given ones (alpha 1), or, when FP8 covers `weight`,
  // both quantized along the reduction dimension of `kind` with alpha the product of the inverse
  // scales, and what the FP8 GEMM needs to know of them. The one place where a linear's GEMM
  // decides its precision; gemm() runs what it decided.
  struct Operands {
    Tensor a, b;
    float alpha = 1.0f;
    std::optional<ops::Backend::Fp8Pair> fp8;
  };
  Operands operands(Gemm kind, const Tensor& a, const Tensor& b, int weight) const;
  void gemm(const Operands& o, bool trans_a, bool trans_b, float alpha, float beta, const Tensor& C, Tensor& D,
            const Tensor& bias) const;
  fp8::Format format(Operand op) const { return op == Dy ? opt_.backward : opt_.forward; }
  fp8::Granularity granularity(Operand op) const;
  void cover(int weight, const std::string& name);  // FP8 covers the linear
  // The adapter's terms of each GEMM kind (see the top of this file); a, b as grouped() takes them.
  void adapter_gemm(Gemm kind, float alpha, const Tensor& a, const Tensor& b, const Adapter& ad, Tensor& D) const;
  // t with LoRA's dropout applied under ad's mask (a new tensor); D += t dropped, in place of t.
  Tensor dropped(const Tensor& t, const Adapter& ad) const;
  void add_dropped(Tensor& t, const Adapter& ad, Tensor& D) const;

  ops::Backend& be_;
  DType act_;
  Fp8Options opt_;
  int64_t num_layers_;
  mutable std::map<int, Scales> state_;  // FP8 linears by weight id (amaxes recorded in const passes)
  // Delayed scaling: the amaxes of the quantizations since the last read, on the backend's device
  // ([linears x 3], folded there by quantize_fp8 without waiting for it); fold_pending() folds them
  // into each history's current entry, once per step (current_amaxes) rather than per quantization.
  mutable Tensor amax_acc_;
  const Tensor& amax_accumulator() const;
  void fold_pending() const;
  std::vector<int> order_;               // declaration order
  LoraOptions lora_;
  struct Declared {
    int weight;
    std::string name;
  };
  std::vector<Declared> declared_;       // every linear, for add_adapters
  std::map<int, Adapter> adapters_;      // by base weight id
  const ParamAccess* params_ = nullptr;
  std::optional<uint64_t> dropout_key_;
};

}  // namespace primus
