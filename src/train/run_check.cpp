#include "train/run_check.h"

#include "checkpoint/run_folder.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "plan/memory_estimate.h"
#include "plan/parallel_layout.h"

namespace primus::train {

LRScheduleOptions lr_schedule_options(const config::TrainingArgs& a) {
  LRScheduleOptions lo;
  lo.lr = a.lr;
  lo.min_lr = a.min_lr;
  lo.lr_warmup_init = a.lr_warmup_init;
  lo.lr_warmup_iters = a.lr_warmup_iters;
  lo.lr_decay_iters = a.lr_decay_iters;
  lo.lr_decay_style = a.lr_decay_style;
  lo.lr_wsd_decay_style = a.lr_wsd_decay_style;
  lo.lr_wsd_decay_iters = a.lr_wsd_decay_iters;
  return lo;
}

void check_run(const config::ExperimentConfig& cfg, int world_size, int ranks_on_host) {
  const config::TrainingArgs& a = cfg.train;
  const plan::ParallelLayout layout = plan::plan_layout(a, cfg.model_spec, world_size);
  (void)LRSchedule(lr_schedule_options(a));
  if (!a.tokenizer_type.empty()) {
    auto tok = data::build_tokenizer({a.tokenizer_type, a.tokenizer_model});
    if (tok->vocab_size() > cfg.model_spec.vocab_size)
      fail("tokenizer {} has {} tokens but the model's vocab_size is {}", a.tokenizer_model, tok->vocab_size(),
           cfg.model_spec.vocab_size);
  }
  // A `save` path that is a file (or cannot be created) fails here, not at the first save hours in.
  checkpoint::check_save_folder(cfg.checkpoint_dir(), "", {}, true);
  if (ranks_on_host > 0)
    plan::check_memory(plan::estimate_memory(cfg.model_spec, layout, a, a.bf16), ranks_on_host,
                       plan::host_available_bytes(), "this host's memory (MemAvailable)");
}

}  // namespace primus::train
