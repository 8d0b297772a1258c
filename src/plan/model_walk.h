// The shape-only walk (docs/architecture.md, "The shape-only backend"): the real model
// (model/llama.h) built for one rank's partition on the shape-only backend (kernels/meta) with
// recording process groups (parallel/recording_process_group.h), and one microbatch run through
// its F, B and W passes. Nothing is computed and nothing is allocated; what comes out is what the
// real passes do on that rank:
//   - every op of each pass with its shapes, dtypes, FLOPs and bytes (kernels/op_call.h), and the
//     parameter it reads or writes;
//   - every collective and transfer of each pass with its group and bytes, and the ops that run
//     while it is in flight (a ring step's transfer overlaps that step's attention blocks);
//   - the bytes the passes hold: what the model holds before any pass, what a chunk keeps from
//     its F to its B and from its B to its W, and the peaks inside each pass (the meta device's
//     counters, exactly what the real tensors would take).
// The projection's workload, the memory estimate, the GEMM list of `benchmark gemm --shapes-from`
// and the per-layer costs of pipeline_balance auto all come from here.
//
// A rank stands for its tensor-, context- and expert-parallel peers (they do the same work under
// balanced routing): it is walked as rank 0 of each group. MoE routing is the walk's RouterLoad.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "kernels/meta/meta_backend.h"
#include "kernels/op_call.h"
#include "model/llama.h"
#include "model/param_store.h"
#include "model/weight_source.h"
#include "parallel/recording_process_group.h"
#include "plan/parallel_layout.h"

namespace primus::plan {

// One rank's place in a run: what the walk builds and feeds.
struct RankShape {
  int64_t micro_batch_size = 1;
  int64_t seq_length = 0;  // the whole sequence; a context-parallel rank holds seq_length / cp of it
  Precision precision = Precision::Fp32;
  LlamaOptions options;  // recompute and the head's logits budget (the walk's weights are resident)
  int tp = 1;
  bool sequence_parallel = false;
  int cp = 1;
  CpComm cp_comm = CpComm::P2P;
  int ep = 1, etp = 1;
  // This rank's chunks in chunk order; empty: one chunk with the whole model.
  std::vector<ModelPartition::Chunk> chunks;
  // false: one chunk run as the trainer runs it without a pipeline (forward, then the fused
  // backward, LlamaModel::backward); true: each chunk's F, B and W apart, as a pipeline runs them.
  bool pipeline = false;
  ops::RouterLoad load;  // MoE routing (balanced by default)
};

// A rank of a planned layout with the run's micro batch, sequence, precision and recompute: the
// chunks of pipeline rank `pp_rank` (model_chunks), or none when pp_rank < 0 (the caller's).
RankShape rank_shape(const ModelSpec& spec, const ParallelLayout& layout, const config::TrainingArgs& args,
                     Precision precision, int pp_rank = -1);

// What one pass did.
struct PassRecord {
  std::vector<ops::OpCall> ops;
  std::vector<int> params;  // per op: the parameter it reads or writes (OpCall::weight), -1 for none
  // Collectives and transfers; issued / waited are indices into ops (the ops in [issued, waited)
  // ran while it was in flight).
  std::vector<parallel::CommCall> comms;
  double flops() const;
};

// One chunk of the rank, one microbatch. Bytes are the meta device's, relative to what the rest of
// the rank held before the chunk's F (its input activation counts as the chunk's).
struct ChunkRecord {
  ModelPartition::Chunk chunk;
  PassRecord f, b, w;  // without a pipeline b holds the fused backward (B and W of each layer in turn), w nothing
  double kept_after_f = 0, kept_after_b = 0;
  double peak_f = 0, peak_b = 0, peak_w = 0;
};

struct RankRecord {
  RankShape shape;
  std::vector<ChunkRecord> chunks;
  // The rank's parameters (names, shapes, offsets in the flat layout) and weight units.
  std::vector<StoredParam> params;
  std::vector<WeightUnit> units;
  int64_t param_numel = 0;  // the flat layout's elements, alignment gaps included
  // LoRA (LlamaModel::trains): the tensors from first_trainable, flat elements from trainable_begin,
  // train; the rest are frozen (0 and 0 without LoRA).
  int first_trainable = 0;
  int64_t trainable_begin = 0;
  DType master = DType::F32, activation = DType::F32;
  // What the model holds before any pass: its weights (master, gradients, working copy), and the
  // rest (the RoPE tables).
  double weight_bytes = 0, model_bytes = 0;
  // The activation a chunk receives and sends: [rows, hidden] (model/llama.h activation_rows).
  Shape message;
  // What begin_microbatch puts on the device (token ids and targets), held from a microbatch's
  // first F to its last W.
  double microbatch_bytes = 0;
  double seconds = 0;  // the walk's own wall time
  // "decoder.layers.3.self_attention.linear_qkv.weight" of a PassRecord param id, "" for -1.
  const std::string& param_name(int id) const;
};

// Builds the rank's model on the shape-only backend and walks one microbatch. Throws
// primus::Error for a model or partition the real model refuses (the same messages).
RankRecord walk_rank(const ModelSpec& spec, const RankShape& shape);

// Every pipeline rank of a layout walked (index = pp rank). Ranks whose chunks hold the same
// kinds of layers (dense or MoE, model_spec.h is_moe_layer) in the same places, and the same
// ends, run the same passes: such a partition is walked once and its record shared (its
// parameter names are then the first such rank's). The model's construction (its RoPE tables
// for every position) dominates a walk, so this keeps a 16-stage projection to a few walks.
std::vector<RankRecord> walk_ranks(const ModelSpec& spec, const ParallelLayout& layout,
                                   const config::TrainingArgs& args, Precision precision,
                                   const ops::RouterLoad& load = {});

}  // namespace primus::plan
