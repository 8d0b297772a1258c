// Learning-rate schedules with Megatron-LM's names and formulas (OptimizerParamScheduler.get_lr):
// linear warmup from lr_warmup_init to lr over lr_warmup_iters, then decay to min_lr by
// lr_decay_iters in the chosen style, and min_lr after that.
#pragma once

#include <cstdint>
#include <string>

namespace primus {

struct LRScheduleOptions {
  double lr = 0;               // peak (Megatron's max_lr)
  double min_lr = 0;
  double lr_warmup_init = 0;   // lr at iteration 0 of the warmup
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;  // Megatron defaults this to train_iters; callers do the same
  // constant | linear | cosine | inverse-square-root | WSD (Megatron's default: linear)
  std::string lr_decay_style = "linear";
  // WSD: hold lr until lr_decay_iters - lr_wsd_decay_iters, then anneal in this style.
  std::string lr_wsd_decay_style = "exponential";  // linear | cosine | exponential | minus_sqrt
  int64_t lr_wsd_decay_iters = 0;
};

class LRSchedule {
 public:
  // Validates the options; errors name the offending field.
  explicit LRSchedule(LRScheduleOptions options);

  // The lr for the optimizer step taken after `iteration` completed steps (0 for the first
  // step), as Megatron, whose scheduler is stepped after each optimizer step. With warmup the
  // first step therefore runs at lr_warmup_init.
  double lr_at(int64_t iteration) const;

  const LRScheduleOptions& options() const { return o_; }

 private:
  enum class Style { Constant, Linear, Cosine, InverseSqrt, WSD };
  enum class WsdStyle { Linear, Cosine, Exponential, MinusSqrt };
  LRScheduleOptions o_;
  Style style_;
  WsdStyle wsd_style_;
};

}  // namespace primus
