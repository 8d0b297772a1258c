// The parts of a decoder block. A block reads
//
//   x2 = x  + attention(norm(x))        the attention part: GQA (with its options) or MLA
//   y  = x2 + feed_forward(norm(x2))    the feed-forward part: SwiGLU MLP or mixture of experts
//
// and owns only its two norms and residuals; everything between is a part's (model/attention_parts.h,
// model/feed_forward_parts.h). A part owns its parameters (registered in Megatron-Core's order),
// its F / B / W passes and their saves (its PartContext), what recompute may drop, and its decode
// step. A new variant of attention or feed-forward is a new part, not a branch in the block's
// passes.
//
// Rows. A part takes its normed input on this rank's rows (all rows, or under sequence
// parallelism this rank's N / tp) and returns its output on the same rows; the tensor-parallel
// gathers and reductions around its linears are its own (PartKit::tp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/documents.h"
#include "model/linears.h"
#include "model/model_spec.h"
#include "model/options.h"
#include "model/partition.h"
#include "model/tensor_parallel_rows.h"

namespace primus {

// How a part reads the model's tensors, wherever they live (the model's buffers, FSDP's units).
class ParamAccess {
 public:
  virtual ~ParamAccess() = default;
  virtual Tensor weight(int id) const = 0;  // the working weight, shaped (its unit acquired)
  virtual Tensor grad(int id) const = 0;    // the gradient (master dtype), shaped
  virtual Tensor master(int id) const = 0;  // the master values of a buffer (StoredParam::buffer)
};

// One microbatch as a pass sees it.
struct PassShape {
  int64_t batch = 0, seq = 0;  // seq: this rank's tokens per sequence (under cp its two chunks)
  double dloss = 1.0;          // backward: the objective's gradient w.r.t. the microbatch's mean loss
  const DocumentRows* docs = nullptr;  // packed documents (model/documents.h), or none
  // The attention rows of Llama 4's chunked layers (attention_chunk_size: packed documents and
  // chunks, model/documents.h), or none.
  const DocumentRows* chunked_docs = nullptr;
  // The rows' rotary positions when packed documents restart them, else null (model/rope.h).
  const std::vector<int32_t>* positions() const {
    return docs && docs->restarts_positions() ? &docs->positions : nullptr;
  }
};

// A part's saves between its passes; each part defines its own.
struct PartContext {
  virtual ~PartContext() = default;
};

// What the parts of one rank's model share: the op set, the dtypes, the layout, the weights, and
// the linears every part is made of (their GEMMs: model/linears.h, where FP8 is decided).
struct PartKit {
  const ModelSpec& spec;
  ops::Backend& be;
  DType act, stat;
  const ModelPartition& part;
  TensorParallelRows tp;  // the tp group's gather and reduce (identities with one rank)
  const ParamAccess& params;
  Linears& linears;  // a part declares each of its linear weights here when it registers it

  Tensor empty(const Shape& s) const { return be.empty(s, act); }
  Tensor stat_empty(const Shape& s) const { return be.empty(s, stat); }
  // y = x W^T (+ b) for W [out, in] (a column-parallel weight's shard); bias -1: none.
  Tensor linear(const Tensor& x, int weight, int bias = -1) const;
  // residual + in W^T (+ b) for a row-parallel W: the partial products summed over tp first (the
  // bias, replicated, added by tp rank 0 alone); bias -1: none.
  Tensor row_parallel_residual(const Tensor& in, int weight, const Tensor& residual, int bias = -1) const;
  // A replicated bias's gradient: db += column sums of dy, this rank's rows of the output gradient
  // (under sequence parallelism a part, summed over tp with the other replicated tensors).
  void bias_grad(const Tensor& dy, int bias) const;
  // dx = dy W (the input gradient of y = x W^T).
  Tensor linear_input_grad(const Tensor& dy, int weight) const;
  // dW += dy^T x.
  void linear_weight_grad(const Tensor& dy, const Tensor& x, int weight) const;
  // RMSNorm of x's rows with weight `w`; rstd receives the statistics.
  Tensor norm(const Tensor& x, int weight, Tensor& rstd) const;
};

class BlockPart {
 public:
  virtual ~BlockPart() = default;
  // The part's parameters (in registration order).
  virtual std::vector<int> param_ids() const = 0;
  virtual std::unique_ptr<PartContext> new_context() const = 0;
  // y = residual + part(h), h this rank's rows of the part's normed input. Computes whatever c
  // lacks: the whole forward from a new context, what drop() let go when the backward rebuilds
  // it. Returns y when want_output, else an undefined tensor.
  virtual Tensor forward(PartContext& c, const Tensor& h, const Tensor& residual, const PassShape& m,
                         bool want_output) = 0;
  // Lets go what recompute may rebuild (selective: the cheap parts; full: all the part can rebuild).
  virtual void drop(PartContext& c, Recompute r) const = 0;
  // The gradient of h (this rank's rows, summed over tp) from dy, the gradient of y (this rank's
  // rows), not counting the residual path; keeps in c what backward_weight reads (the linears'
  // inputs and output gradients, small weight gradients computed here such as a norm's,
  // model/norm_weight_grad.h) and lets go of the rest: the zero-bubble schedules hold c from B
  // to W, and their memory model is the ratio of the two (docs/pipeline_schedules.md).
  virtual Tensor backward_input(PartContext& c, const Tensor& dy, const PassShape& m) = 0;
  // Accumulates the part's weight gradients; empties c.
  virtual void backward_weight(PartContext& c) = 0;

  // ---- decoding one sequence on one rank ----
  // The width of a position's row in the part's cache (0: none).
  virtual int64_t cache_width() const { return 0; }
  // y for n new rows h at positions pos0 .. pos0 + n - 1; cache [capacity, cache_width()].
  virtual Tensor decode(Tensor& cache, const Tensor& h, const Tensor& residual, int64_t pos0) const = 0;
};

}  // namespace primus
