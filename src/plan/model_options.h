// The model options a run's config asks for (model/llama.h LlamaOptions): recompute and the FP8
// keys (model/linears.h). The trainer builds its model with them, and the shape-only walk
// (plan/model_walk.h) builds the same model, so both take them from here.
#pragma once

#include "config/experiment.h"
#include "model/llama.h"

namespace primus::plan {

// The FP8 keys as the model takes them (model/linears.h Fp8Options).
Fp8Options fp8_options(const config::TrainingArgs& args);
// recompute_granularity, the FP8 keys and the lora block; the rest LlamaOptions' defaults (resident weights: the
// trainer clears them under ZeRO-2 / FSDP).
LlamaOptions model_options(const config::TrainingArgs& args);

}  // namespace primus::plan
