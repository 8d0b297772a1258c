// What one rank does for one microbatch, as the projection counts it: for every pass (F, B, W)
// of a decoder layer, of the embedding and of the head, the ops of the op set with their shapes,
// FLOPs and bytes, the tensor-parallel collectives on the way, and the bytes of activations the
// pass keeps or needs for a moment. This is a model of LlamaModel's passes (model/llama.cpp),
// step for step: when the model changes how it computes or what it saves, this file follows
// (the projection-against-measurement table in docs/profiling.md shows when it has not).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/llama.h"
#include "model/model_spec.h"

namespace primus::projection {

enum class OpPass : uint8_t { F, B, W };

// One op of the op set at a shape. gemm: D [m, n] = op(A) op(B), inner k; trans_a marks a weight
// gradient (D in the master dtype, accumulated), trans_b a forward (y = x W^T). Others: rows x
// cols (attention: batch, seq, heads, groups, head_dim in a..e).
struct OpSpec {
  std::string op;  // the backend op: "gemm", "rmsnorm_forward", "attention_backward", ...
  int64_t a = 0, b = 0, c = 0, d = 0, e = 0;
  bool trans_a = false, trans_b = false, out_stat = false, accumulate = false, inverse = false;
  bool causal = false;       // attention blocks of context parallel: the diagonal block
  DType dtype = DType::F32;  // the activation dtype
  double flops = 0, bytes = 0;
  std::string key() const;   // identical ops share a measured time
};

// A collective on the tensor-parallel group inside a pass, or a transfer on the context-parallel
// group. A ring step's transfer runs while the ops [hide_first, hide_end) of the pass compute:
// only what outlasts them is exposed.
struct CommSpec {
  std::string op;  // "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"
  double bytes = 0;  // the whole buffer, as the trace counts it
  bool cp = false;   // on the context-parallel group (else tensor-parallel)
  bool ep = false;   // on the expert-parallel group
  int hide_first = 0, hide_end = 0;
};

struct PassWork {
  std::vector<OpSpec> ops;
  std::vector<CommSpec> comms;
  double flops() const;
};

// One layer's (or end's) three passes and memory.
struct PartWork {
  std::string name;  // "layer", "embedding", "head"
  PassWork f, b, w;
  // Bytes this part keeps from its F to its B, from its B to its W, and its peak inside B over
  // what it kept after F (the rebuilt context, the B outputs, the temporaries, before they go).
  double kept_after_f = 0, kept_after_b = 0, peak_in_b = 0, peak_in_f = 0;
};

struct WorkloadShape {
  int64_t micro_batch_size = 1, seq_length = 0;
  int tp = 1;
  bool sequence_parallel = false;
  int cp = 1;            // context parallel: a rank holds seq_length / cp tokens of each sequence
  bool cp_a2a = false;   // cp_comm_type a2a (else p2p, ring attention)
  int ep = 1;            // expert parallel: a rank holds num_experts / ep experts of each MoE layer
  bool ep_allgather = false;  // moe_token_dispatcher_type allgather (else alltoall)
  int etp = 1;  // expert_tensor_parallel_size: 1 (whole experts) or tp (each expert's ffn split over tp)
  Recompute recompute = Recompute::None;
  Precision precision = Precision::Fp32;
  LlamaOptions options;  // the head's logits budget and vocabulary chunk
};

// A decoder layer; `moe`: with the MoE block (model/moe.h) in place of the MLP. Routing is taken
// as balanced (every expert gets tokens x topk / experts rows): the op count and the rows a rank
// computes and keeps do not depend on the balance, the GEMMs' shapes do.
PartWork layer_work(const ModelSpec& spec, const WorkloadShape& w, bool moe = false);
PartWork embedding_work(const ModelSpec& spec, const WorkloadShape& w);
PartWork head_work(const ModelSpec& spec, const WorkloadShape& w);

// Parameters of one rank's share of a layer, the embedding or the head under tp (the sharded
// tensors divided, norms whole).
int64_t layer_parameters(const ModelSpec& spec, int tp, bool moe = false, int ep = 1, int etp = 1);
int64_t layer_tensors(const ModelSpec& spec, bool moe = false, int ep = 1);
int64_t embedding_parameters(const ModelSpec& spec, int tp);
int64_t head_parameters(const ModelSpec& spec, int tp);  // final norm and (untied) output layer

}  // namespace primus::projection
