#include "cli/lib/train_task.h"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "cli/lib/overrides.h"
#include "config/experiment.h"
#include "config/lora.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "hf/hf_checkpoint.h"
#include "parallel/mpi_process_group.h"
#include "train/run_check.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace primus::cli {
namespace {

// A config of the other module is refused by name: each task trains one kind of run.
void check_module(const config::ExperimentConfig& cfg, TrainTask which) {
  if (which == TrainTask::Pretrain && cfg.post_trainer)
    fail("{} is a post-training config (modules.post_trainer): run it with train posttrain", cfg.config_file);
  if (which == TrainTask::Posttrain && !cfg.post_trainer)
    fail("{} is a pretraining config (modules.pre_trainer): train posttrain reads modules.post_trainer with stage: "
         "sft (docs/posttraining.md)",
         cfg.config_file);
}

// hf_path: the Hugging Face folder, imported once into <run dir>/hf_import as `checkpoint import`
// does (by the first rank while the others wait), becomes the pretrained_checkpoint of a run that
// names no checkpoint of its own to start from.
void start_from_hf(config::ExperimentConfig& cfg) {
  config::TrainingArgs& a = cfg.train;
  if (a.hf_path.empty()) return;
  if (!a.load.empty() || !a.pretrained_checkpoint.empty()) {
    log::info("hf_path {} is not imported: the run starts from {}", a.hf_path,
              a.load.empty() ? a.pretrained_checkpoint : a.load);
    return;
  }
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(a.hf_path) / "config.json", ec))
    fail("hf_path '{}' is not a local Hugging Face model folder (with config.json and safetensors): download the model "
         "and set hf_path to its folder, or start from a checkpoint with pretrained_checkpoint",
         a.hf_path);
  const fs::path target = fs::path(cfg.run_dir()) / "hf_import";
  const LaunchEnv env = discover_launch_env();
  std::string problem;
  if (env.rank == 0 && !fs::exists(target / "latest", ec)) try {
      hf::ImportOptions o;
      o.hf_dir = a.hf_path;
      o.save_dir = target.string();
      log::info("hf_path: imported {} into {}", a.hf_path, hf::import_hf(o));
    } catch (const Error& e) {
      problem = e.what();
    }
  if (env.world_size > 1) {  // every rank waits for the import and stops with it
    parallel::init_mpi();
    if (parallel::mpi_world().all_reduce_value(int32_t(problem.empty() ? 0 : 1)) != 0)
      fail("cannot import hf_path {}: {}", a.hf_path, problem.empty() ? "rank 0 failed (see its log)" : problem);
  } else if (!problem.empty()) {
    fail("cannot import hf_path {}: {}", a.hf_path, problem);
  }
  a.pretrained_checkpoint = target.string();
}

}  // namespace

TaskAction train_task(CLI::App& app, TrainTask which) {
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
  const std::string task = which == TrainTask::Pretrain ? "train pretrain" : "train posttrain";
  return [config, print, reference, check_world, self, which, task]() {
    if (*reference) {  // once: not again in the launcher's check pass
      if (*check_world == 0)
        std::cout << config::training_keys_reference() << "\n"
                  << config::lora_keys_reference() << "\n"
                  << config::argument_status_reference() << "\n"
                  << config::dialect_keys_reference(config::Framework::TorchTitan) << "\n"
                  << config::dialect_keys_reference(config::Framework::MaxText);
      return 0;
    }
    if (config->empty()) fail("{} needs --config <experiment.yaml>", task);
    // The ranks that will train: a torchtitan or MaxText config's "-1" degrees and
    // per-device batches are resolved against them.
    const int world = *check_world > 0 ? *check_world : discover_launch_env().world_size;
    auto cfg = config::load_experiment(*config, key_values(self->remaining()), world);
    check_module(cfg, which);
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
    start_from_hf(cfg);
    train::pretrain(cfg, cfg.train.peft_adapter_path.empty()
                             ? train::StartingAdapters{}
                             : hf::read_peft_adapters(cfg.train.peft_adapter_path, cfg.model_spec, cfg.train.lora));
    return 0;
  };
}

}  // namespace primus::cli
