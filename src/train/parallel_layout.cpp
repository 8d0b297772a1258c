#include "train/parallel_layout.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "model/llama.h"
#include "pipeline/schedules/registry.h"

namespace primus::train {

parallel::ParallelSizes ParallelLayout::sizes() const {
  parallel::ParallelSizes s;
  s.tensor_model_parallel_size = tp;
  s.pipeline_model_parallel_size = pp;
  s.context_parallel_size = cp;
  return s;
}

std::string ParallelLayout::describe() const {
  std::string out = fmt::format("world {} = tp {} x pp {} x dp {}", world_size, tp, pp, dp);
  if (sequence_parallel) out += " (sequence parallel)";
  if (schedule)
    out += fmt::format("; {} over {} stages ({} chunk{} per rank)", schedule->algorithm, pp * vpp, vpp,
                       vpp > 1 ? "s" : "");
  out += fmt::format("; {} microbatch{} per dp rank", microbatches_per_rank, microbatches_per_rank > 1 ? "es" : "");
  return out;
}

ParallelLayout plan_layout(const config::TrainingArgs& a, const ModelSpec& spec, int world_size) {
  ParallelLayout L;
  L.world_size = world_size;
  auto positive = [](int64_t v, const char* key) {
    if (v < 1) fail("{} must be at least 1, got {}", key, v);
    return int(v);
  };
  L.tp = positive(a.tensor_model_parallel_size, "tensor_model_parallel_size");
  L.pp = positive(a.pipeline_model_parallel_size, "pipeline_model_parallel_size");
  L.cp = positive(a.context_parallel_size, "context_parallel_size");
  positive(a.expert_model_parallel_size, "expert_model_parallel_size");
  if (a.virtual_pipeline_model_parallel_size < 0)
    fail("virtual_pipeline_model_parallel_size must not be negative, got {}", a.virtual_pipeline_model_parallel_size);
  if (L.cp > 1) fail("context_parallel_size {}: context parallelism is not implemented yet (use 1)", L.cp);
  if (a.expert_model_parallel_size > 1)
    fail("expert_model_parallel_size {}: this model has no experts (dense Llama); use 1",
         a.expert_model_parallel_size);
  const int mp = L.tp * L.pp * L.cp;
  if (world_size % mp != 0)
    fail("tensor_model_parallel_size ({}) x pipeline_model_parallel_size ({}) x context_parallel_size ({}) = {} "
         "must divide the number of ranks ({}); data parallel takes the rest",
         L.tp, L.pp, L.cp, mp, world_size);
  L.dp = world_size / mp;
  check_tensor_parallel(spec, L.tp);

  L.sequence_parallel = a.sequence_parallel && L.tp > 1;
  if (a.sequence_parallel && L.tp == 1)
    log::warn("sequence_parallel has no effect with tensor_model_parallel_size 1; running without it");
  if (L.sequence_parallel && (a.micro_batch_size * a.seq_length) % L.tp != 0)
    fail("sequence_parallel splits micro_batch_size x seq_length = {} tokens over tensor_model_parallel_size {}: "
         "not divisible",
         a.micro_batch_size * a.seq_length, L.tp);
  if (a.global_batch_size % (a.micro_batch_size * L.dp) != 0)
    fail("global_batch_size ({}) must be a multiple of micro_batch_size ({}) x data-parallel size ({}) = {}",
         a.global_batch_size, a.micro_batch_size, L.dp, a.micro_batch_size * L.dp);
  L.microbatches_per_rank = a.global_batch_size / (a.micro_batch_size * L.dp);

  const int64_t vpp_asked = a.virtual_pipeline_model_parallel_size;
  if (L.pp == 1) {
    if (vpp_asked > 1)
      fail("virtual_pipeline_model_parallel_size {} needs pipeline_model_parallel_size > 1", vpp_asked);
    if (a.decoder_first_pipeline_num_layers > 0 || a.decoder_last_pipeline_num_layers > 0)
      fail("decoder_first/last_pipeline_num_layers need pipeline_model_parallel_size > 1");
    L.stages = pipeline::split_layers(spec.num_layers, 1, 1);
    return L;
  }
  if (L.microbatches_per_rank > 0x7fffffff) fail("too many microbatches per rank: {}", L.microbatches_per_rank);
  pipeline::ScheduleRequest req;
  req.pp = L.pp;
  req.microbatches = int(L.microbatches_per_rank);
  req.vpp = int(vpp_asked);
  try {
    L.schedule = pipeline::generate(a.pipeline_schedule, req);
  } catch (const Error& e) {
    fail("pipeline_schedule {} with pipeline_model_parallel_size {} and {} microbatches per data-parallel rank "
         "(global_batch_size / (micro_batch_size x dp)): {}",
         a.pipeline_schedule, L.pp, L.microbatches_per_rank, e.what());
  }
  L.vpp = L.schedule->vpp;
  L.stages = pipeline::split_layers(*L.schedule, spec.num_layers, a.decoder_first_pipeline_num_layers,
                                    a.decoder_last_pipeline_num_layers);
  return L;
}

}  // namespace primus::train
