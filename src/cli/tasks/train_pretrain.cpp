// `train pretrain --config exp.yaml [--print-config] [--<key> <value> ...]`: the pretraining
// loop on an experiment config; any config key may be overridden after --config.
#include <cstdlib>
#include <iostream>

#include "cli/lib/overrides.h"
#include "cli/registry.h"
#include "config/experiment.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "train/run_check.h"
#include "train/trainer.h"

namespace primus::cli {
namespace {

TaskRegistrar reg{{"train", "pretrain", "pretrain a model from an experiment config", [](CLI::App& app) -> TaskAction {
                     auto config = std::make_shared<std::string>();
                     auto print = std::make_shared<bool>(false);
                     auto reference = std::make_shared<bool>(false);
                     auto check_world = std::make_shared<int>(0);
                     app.add_option("--config", *config, "experiment YAML (see examples/ and docs/config.md)");
                     app.add_flag("--print-config", *print, "print the resolved config and exit");
                     app.add_flag("--config-reference", *reference,
                                  "print the tables of training keys and of Megatron's, torchtitan's and MaxText's "
                                  "keys (docs/config.md) and exit");
                     // The launcher's check before it starts ranks (direct.cpp): config, layout and
                     // memory for N ranks on this host, so that an error is printed once.
                     app.add_option("--check-for-ranks", *check_world)->group("");
                     app.allow_extras();
                     app.footer("Any config key can follow --config as --key value, e.g. --train_iters 50 "
                                "--lr 1e-3 --exp_name try2 --workspace /tmp/runs");
                     CLI::App* self = &app;
                     return [config, print, reference, check_world, self]() {
                       if (*reference) {  // once: not again in the launcher's check pass
                         if (*check_world == 0)
                           std::cout << config::training_keys_reference() << "\n"
                                     << config::argument_status_reference() << "\n"
                                     << config::dialect_keys_reference(config::Framework::TorchTitan) << "\n"
                                     << config::dialect_keys_reference(config::Framework::MaxText);
                         return 0;
                       }
                       if (config->empty()) fail("train pretrain needs --config <experiment.yaml>");
                       // The ranks that will train: a torchtitan or MaxText config's "-1" degrees and
                       // per-device batches are resolved against them.
                       const int world = *check_world > 0 ? *check_world : discover_launch_env().world_size;
                       auto cfg = config::load_experiment(*config, key_values(self->remaining()), world);
                       for (const auto& [name, value] : cfg.env) ::setenv(name.c_str(), value.c_str(), 1);
                       // Under primus-cli the runtime chose the run folder (its --workspace/--exp-name
                       // and replays win over the config); logs, snapshot and metrics share it.
                       const char* ws = std::getenv("PRIMUS_WORKSPACE");
                       const char* exp = std::getenv("PRIMUS_EXP_NAME");
                       if (ws && exp && *ws && *exp) {
                         cfg.workspace = ws;
                         cfg.exp_name = exp;
                       }
                       if (*print) {  // once: by the first rank, not in the launcher's check pass too
                         if (*check_world == 0 && discover_launch_env().rank == 0) std::cout << cfg.resolved_yaml();
                         return 0;
                       }
                       if (*check_world > 0) {
                         // bf16 runs on a GPU, whose memory the ranks check; fp32 runs share this host's.
                         train::check_run(cfg, *check_world, cfg.train.bf16 ? 0 : *check_world);
                         return 0;
                       }
                       train::pretrain(cfg);
                       return 0;
                     };
                   }}};

}  // namespace
}  // namespace primus::cli
