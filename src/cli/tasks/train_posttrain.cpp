// `train posttrain --config sft.yaml [--print-config] [--<key> <value> ...]`: supervised
// fine-tuning (modules.post_trainer, stage: sft) on a chat data set, from a checkpoint of ours
// (pretrained_checkpoint, finetune + load) or a Hugging Face folder (hf_path); docs/posttraining.md.
#include "cli/lib/train_task.h"
#include "cli/registry.h"

namespace primus::cli {
namespace train_posttrain_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

TaskRegistrar reg{{"train", "posttrain", "fine-tune a model on chat data (SFT) from a post-training config",
                   [](CLI::App& app) -> TaskAction { return train_task(app, TrainTask::Posttrain); }}};

}  // namespace
}  // namespace primus::cli
