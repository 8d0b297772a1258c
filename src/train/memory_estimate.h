// How much memory a rank of a training run will need, estimated from the model spec, the parallel
// layout and the training args before anything is allocated, and compared with what the machine
// has: a model that cannot fit stops at once with the numbers and the keys to change, instead of
// allocating for a minute and dying with a bare std::bad_alloc. Linear in num_layers (it walks
// the parameter layout's names), never in the parameters' sizes.
//
// Per parameter held by the rank:
//   fp32:  value 4 + gradient 4 + AdamW's two moments 8 (ZeRO-1 divides the moments by dp)
//   bf16 mixed precision: fp32 master 4 + bf16 working copy 2 + fp32 gradient 4 + moments 8
// Activations: the bytes a layer saves per token for its backward (docs/model_math.md; fp32, or
// bf16 under mixed precision; only the layer input with full recompute), times the tokens of the
// microbatches in flight (1 without a pipeline; up to pp on the first stage of 1F1B-like
// schedules, times vpp chunks), split by tp (an MoE block's saves only under sequence
// parallelism: otherwise every tp rank runs it on all rows). The rank checked is the most loaded
// pipeline stage.
// Parameters (the tp-split linears divided by tp, norms, MoE blocks and MLA down projections whole
// on every tp rank, routed experts divided by ep) and optimizer state are exact; activations are
// an estimate (workspace buffers,
// the logits chunk and allocator slack are not counted), so only a clear excess is refused.
#pragma once

#include <cstdint>
#include <string>

#include "config/experiment.h"
#include "model/model_spec.h"
#include "train/parallel_layout.h"

namespace primus::train {

struct MemoryEstimate {
  int64_t parameters = 0;  // held by the most loaded rank
  double bytes_per_parameter = 0;
  double parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0, activation_bytes = 0;
  double total_bytes() const { return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes; }
  std::string describe() const;  // "1.2 GiB: parameters 0.3 GiB, gradients ..., activations ..."
};

// `mixed`: bf16 mixed precision (the GPU path), else fp32.
MemoryEstimate estimate_memory(const ModelSpec& spec, const ParallelLayout& layout, const config::TrainingArgs& args,
                               bool mixed);

// Memory this process may use on the host: MemAvailable (/proc/meminfo), or the cgroup's
// memory.max when lower. 0 when unknown.
uint64_t host_available_bytes();

// Throws primus::Error when `ranks_here` ranks of `estimate` exceed `available_bytes` (of `where`,
// e.g. "host memory (MemAvailable)" or "GPU 0 memory"), naming the numbers and the keys that
// shrink the need. available_bytes 0: no check.
void check_memory(const MemoryEstimate& estimate, int ranks_here, uint64_t available_bytes, const std::string& where);

}  // namespace primus::train
