#include "train/pipeline_memory.h"

#include "core/error.h"
#include "pipeline/simulator.h"
#include "plan/model_walk.h"

namespace primus::train {

PipelineMemoryMeter::PipelineMemoryMeter(const ModelSpec& spec, const plan::ParallelLayout& L,
                                         const config::TrainingArgs& a, Precision precision, int pp_rank)
    : pp_rank_(pp_rank) {
  PRIMUS_CHECK(L.schedule.has_value(), "the pipeline memory meter needs a pipeline schedule");
  pipeline::Costs costs;
  costs.stages = L.stage_costs;
  costs.activation_after_b = L.activation_after_b;
  const pipeline::SimResult sim = pipeline::simulate(*L.schedule, costs);
  // One stage's activation: a chunk of a vpp-chunk rank counts 1 / vpp of it in the simulator, so
  // the rank's chunks together hold one (their mean bytes times vpp).
  const plan::RankRecord rec = plan::walk_rank(spec, plan::rank_shape(spec, L, a, precision, pp_rank));
  double stage = rec.microbatch_bytes;
  for (const plan::ChunkRecord& c : rec.chunks) stage += c.kept_after_f;
  predicted_ = sim.per_rank[size_t(pp_rank)].peak_activations * stage;
}

PipelineMemoryMeter::Report PipelineMemoryMeter::report(parallel::ProcessGroup& pp) {
  Report r;
  r.measured.assign(size_t(pp.size()), 0.0);
  r.simulated.assign(size_t(pp.size()), 0.0);
  r.measured[size_t(pp_rank_)] = peak_;
  r.simulated[size_t(pp_rank_)] = predicted_;
  pp.all_reduce(r.measured);
  pp.all_reduce(r.simulated);
  peak_ = 0;
  return r;
}

}  // namespace primus::train
