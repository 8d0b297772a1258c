// How much memory each rank of a training run needs, before anything is allocated: the trainer
// checks it against the machine (a model that cannot fit stops at once with the numbers and the
// keys to change, instead of allocating for a minute and dying with a bare std::bad_alloc), and
// `projection memory` reports it per pipeline rank.
//
// Each pipeline rank's partition of the real model is walked on the shape-only backend
// (plan/model_walk.h), which gives exactly what its passes hold. Around that:
//   parameters   the fp32 master weights in the model's flat layout (alignment gaps included),
//                and the working copy the ops read (bf16 runs); ZeRO-2 and FSDP keep the rank's
//                shard of both (train/sharded_weights.h's per-tensor row split), ZeRO-2 the whole
//                working copy besides
//   gradients    fp32, the master's layout (ZeRO-2 / FSDP: the shard)
//   optimizer    AdamW's two moments (in exp_avg_dtype / exp_avg_sq_dtype: 4, 2 or 1 bytes, and an
//                fp16 or fp8 moment's fp32 scale per tensor piece) of what the rank steps: everything (no_shard), its
//                shards of the gradient buckets (ZeRO-1: the buckets built as the trainer builds
//                them, parallel/data_parallel.h), its shard (ZeRO-2 / FSDP); under expert
//                parallelism with the plain or distributed optimizer, the experts' own packed
//                gradients (and under ZeRO-1 their values, buckets and state over edp,
//                train/expert_grads.h)
//   activations  what the rank's chunks hold at each op of its pipeline schedule: each chunk's F
//                keeps, B keeps less until W, W frees, and every pass has its own peak (all from
//                the walk), for the microbatches the schedule has in flight at that op; without a
//                pipeline one microbatch's forward and fused backward
//   buffers      what the model holds besides (the RoPE tables), the pipeline's posted receives
//                and the send in flight, the buckets' scratch (ZeRO-1), and under ZeRO-2 / FSDP
//                the units' whole gradients and (FSDP) gathered weights while the passes run
// Not counted: allocator fragmentation, framework overhead, the optimizer step's own transients.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "model/llama.h"
#include "model/model_spec.h"
#include "plan/model_walk.h"
#include "plan/parallel_layout.h"

namespace primus::plan {

struct MemoryEstimate {
  int pp_rank = 0;
  int64_t parameters = 0;      // tensor elements this rank holds (its shards of its chunks' tensors)
  double parameter_bytes = 0;  // master weights (or their shard)
  double working_bytes = 0;    // the working copy beside them (bf16 runs, ZeRO-2's whole copy)
  double gradient_bytes = 0, optimizer_bytes = 0, activation_bytes = 0, buffer_bytes = 0;
  double peak_in_flight = 0;  // microbatch-chunks holding activations at their peak
  double total_bytes() const {
    return parameter_bytes + working_bytes + gradient_bytes + optimizer_bytes + activation_bytes + buffer_bytes;
  }
  // Weights, gradients and optimizer state per parameter.
  double bytes_per_parameter() const;
  std::string describe() const;  // "1.2 GiB for 4.2M parameters on this rank (...): parameters ..."
};

// The estimate of pipeline rank `pp_rank` from its walk (plan/model_walk.h).
MemoryEstimate estimate_rank_memory(const RankRecord& walk, const ParallelLayout& layout,
                                    const config::TrainingArgs& args, config::DpSharding sharding, int pp_rank);
// Every pipeline rank's estimate (index = pp rank), under `sharding` (the layout's own by
// default, or another to compare).
std::vector<MemoryEstimate> estimate_memory_per_rank(const ModelSpec& spec, const ParallelLayout& layout,
                                                     const config::TrainingArgs& args, Precision precision,
                                                     config::DpSharding sharding);
// The most loaded rank's, under the layout's sharding. `mixed`: bf16 mixed precision, else fp32.
MemoryEstimate estimate_memory(const ModelSpec& spec, const ParallelLayout& layout, const config::TrainingArgs& args,
                               bool mixed);

// The host memory a checkpoint save takes on one rank (docs/checkpoints.md, Memory during a save):
// the rank writes the elements it owns (train/dp_strategy.h, DataParallelStrategy::shard_state:
// under no_shard its 1/(dp x cp) share of every tensor, the experts' of edp x cp; under ZeRO-1
// its optimizer shards; under ZeRO-2 / FSDP its rows; a tensor every tp rank holds whole split over
// tp as well), 12 bytes each (the value and two moments). Counted for rank 0 of its dp and tp
// groups (another rank's share differs by at most an element per tensor).
//   staging      the shard writer's buffer: min(kWriteBufferBytes, 12 bytes x elements)
//   sync         staging, plus, when the state is in device memory, the host copy of the elements
//                (12 bytes each) that the writer reads
//   async        sync plus the asynchronous save's own host copy (12 bytes per element), which it
//                holds until its write ends
// These are what a save reports as save_host_buffer_bytes (train/checkpoint_saves.h).
struct SaveMemory {
  int64_t elements = 0;  // elements this rank writes
  double staging_bytes = 0, sync_bytes = 0, async_bytes = 0;
};
// device_state: the model's state lives in device memory (a GPU run), so a save copies it to
// the host first.
SaveMemory estimate_save_memory(const RankRecord& walk, const ParallelLayout& layout, const config::TrainingArgs& args,
                                config::DpSharding sharding, bool device_state);

// Memory this process may use on the host: MemAvailable (/proc/meminfo), or the cgroup's
// memory.max when lower. 0 when unknown.
uint64_t host_available_bytes();

// Throws primus::Error when `ranks_here` ranks of `estimate` exceed `available_bytes` (of `where`,
// e.g. "host memory (MemAvailable)" or "GPU 0 memory"), naming the numbers and the keys that
// shrink the need. available_bytes 0: no check.
void check_memory(const MemoryEstimate& estimate, int ranks_here, uint64_t available_bytes, const std::string& where);

}  // namespace primus::plan
