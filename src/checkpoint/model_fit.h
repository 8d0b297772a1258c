// Whether a checkpoint holds the model a run describes: the one rule, checked before every load
// (the trainer's resume, finetune and pretrained_checkpoint, `generate --load`, `checkpoint
// export`). docs/checkpoints.md#what-a-load-checks lists what it compares and what each refusal says.
//
// Two comparisons, both from files every rank can read (so every rank reaches the same verdict,
// though each loads only its own part of the model):
//   1. the fields of the model description that change the set, shape or meaning of the weights
//      (one table, model_fit.cpp), the checkpoint's config.yaml against the run's: a difference is
//      an error naming the field, both values and the ways to go on on purpose;
//   2. every tensor of the checkpoint's index (meta.json) against the model's layout
//      (model_parameter_layout): a tensor the model has no place for, one it lacks, or one of
//      another shape is an error too (what the table does not name still cannot slip through).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "model/model_spec.h"

namespace primus::checkpoint {

// The trainer module of a checkpoint's config.yaml (parsed): modules.pre_trainer, or
// modules.post_trainer for a post-training run; an undefined node when there is neither.
YAML::Node trainer_module(const YAML::Node& config);

// The model a checkpoint was saved with: the trainer module's model_spec of its config.yaml
// (verified against meta.json), validated. Throws primus::Error when there is none.
ModelSpec read_checkpoint_model(const std::string& dir);

// Why a checkpoint is loaded: it decides which differences are errors and which ways to go on a
// refusal names.
enum class LoadPurpose {
  Resume,   // go on with a run: weights, optimizer state, iteration, data position
  Weights,  // a new run from the weights (finetune, pretrained_checkpoint): a field that changes
            // only what the weights mean (rotary base, router scoring) may differ, and is logged
  Read,     // the checkpoint's own model (generate, checkpoint export): its config.yaml's
};

struct FitOptions {
  LoadPurpose purpose = LoadPurpose::Resume;
  // false (`load_strict: false`): no difference is an error; the load takes the tensors whose name
  // and shape match and the returned ModelFit says what it drops and what starts fresh.
  bool strict = true;
  // Tensors the run's model holds beyond the spec's layout (LoRA adapters, model/linears.h), by
  // global shape. A Weights load of a checkpoint that holds none of them (LoRA starting from a
  // base model) leaves them at their initial values (B = 0: the base model's outputs), not refused.
  std::vector<std::pair<std::string, std::vector<int64_t>>> extra;
};

// What a load of the checkpoint into the model does where they differ.
struct ModelFit {
  std::vector<std::string> differences;  // "qk_layernorm: true in the checkpoint, false in this run"
  std::vector<std::string> dropped;      // checkpoint tensors the model has no place for (or of another shape)
  std::vector<std::string> fresh;        // model tensors the checkpoint lacks (or of another shape)
  bool extra_fresh = false;              // FitOptions::extra all absent and left at their initial values
  bool exact() const { return differences.empty() && dropped.empty() && fresh.empty(); }
  // One paragraph for the log: the differences, the tensors dropped and those left at their initial values.
  std::string summary(const std::string& dir) const;
};

// Compares the checkpoint in `dir` with the model `spec` (see the top of this file). Throws
// primus::Error when the difference is not allowed for `options`; otherwise returns what differs.
ModelFit check_model_fit(const std::string& dir, const ModelSpec& spec, const FitOptions& options = {});

// The final error of an automatic resume when `save_dir` holds checkpoints and none of them could be
// resumed (`skipped`: each checkpoint folder with its reason, newest first): names the newest one's
// reason and the ways to go on, none of which deletes a checkpoint.
[[noreturn]] void fail_nothing_to_resume(const std::string& save_dir,
                                         const std::vector<std::pair<std::string, std::string>>& skipped);

// The model keys (model/model_spec.h) the comparison covers, and those free to change between a
// checkpoint and the run that loads it (how the model trains, not what its weights are). Every
// model key is in one of the two (a test checks it, so that a new key must be placed).
std::vector<std::string> model_keys_compared();
std::vector<std::string> model_keys_free_to_change();

}  // namespace primus::checkpoint
