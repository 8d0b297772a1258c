#include "plan/model_options.h"

namespace primus::plan {

Fp8Options fp8_options(const config::TrainingArgs& a) {
  Fp8Options o;
  o.enabled = a.fp8 != Fp8Mode::Off;
  o.forward = fp8::Format::E4M3;
  o.backward = a.fp8 == Fp8Mode::Hybrid ? fp8::Format::E5M2 : fp8::Format::E4M3;
  o.recipe = a.fp8_recipe;
  o.margin = int(a.fp8_margin);
  o.amax_history_len = int(a.fp8_amax_history_len);
  o.amax_compute_algo = a.fp8_amax_compute_algo;
  o.wgrad = a.fp8_wgrad;
  o.output_layer = a.fp8_output_layer;
  if (a.first_last_layers_bf16) {
    o.bf16_layers_at_start = a.num_layers_at_start_in_bf16;
    o.bf16_layers_at_end = a.num_layers_at_end_in_bf16;
  }
  return o;
}

LlamaOptions model_options(const config::TrainingArgs& a) {
  LlamaOptions o;
  o.recompute = a.recompute_granularity;
  o.fp8 = fp8_options(a);
  o.lora = a.lora;
  return o;
}

}  // namespace primus::plan
