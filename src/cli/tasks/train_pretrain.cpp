// `train pretrain --config exp.yaml [--print-config] [--<key> <value> ...]`: the pretraining
// loop on an experiment config (modules.pre_trainer); any config key may be overridden after --config.
#include "cli/lib/train_task.h"
#include "cli/registry.h"

namespace primus::cli {
namespace train_pretrain_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

TaskRegistrar reg{{"train", "pretrain", "pretrain a model from an experiment config",
                   [](CLI::App& app) -> TaskAction { return train_task(app, TrainTask::Pretrain); }}};

}  // namespace
}  // namespace primus::cli
