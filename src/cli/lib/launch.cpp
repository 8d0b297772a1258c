#include "cli/lib/launch.h"

#include "config/yaml_tree.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "cli/registry.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"

#ifndef PRIMUS_PROJECT_DIR
#define PRIMUS_PROJECT_DIR "."
#endif

namespace primus::cli {
namespace fs = std::filesystem;

namespace {

struct OptSpec {
  const char* name;
  bool value;
};
const std::vector<OptSpec>& common_specs() {
  static const std::vector<OptSpec> s = {{"--dry-run", false},  {"--print-env", false}, {"--force", false},
                                         {"--env", true},       {"--patch", true},      {"--hooks-dir", true},
                                         {"--log-ranks", true}, {"--workspace", true},  {"--exp-name", true},
                                         {"--replay", true},    {"--numa", false},      {"--no-numa", false}};
  return s;
}

std::string abs_path(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }

std::vector<std::string> split_colon(const char* v) {
  std::vector<std::string> out;
  if (!v) return out;
  std::string s(v);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(':', pos);
    std::string item = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    if (!item.empty()) out.push_back(item);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

// workspace / exp_name as the task will see them: the config file with its `extends` chain and
// ${VAR} substitution, then a "--workspace X" / "--exp_name X" override among the task's options
// (which follow --config), exactly as the train task resolves them.
std::optional<std::string> config_key(const TaskLine& line, const char* key) {
  if (!line.config) return std::nullopt;
  std::optional<std::string> value;
  const config::YamlTree tree = config::load_yaml_tree(*line.config);
  if (tree.root[key] && tree.root[key].IsScalar()) value = tree.root[key].Scalar();
  const std::string dashed = std::string("--") + key, alt = "--" + std::string(key == std::string("exp_name") ? "exp-name" : key);
  for (size_t i = 0; i < line.task_args.size(); ++i) {
    const std::string& a = line.task_args[i];
    if ((a == dashed || a == alt) && i + 1 < line.task_args.size()) value = line.task_args[i + 1];
    else if (a.rfind(dashed + "=", 0) == 0) value = a.substr(dashed.size() + 1);
    else if (a.rfind(alt + "=", 0) == 0) value = a.substr(alt.size() + 1);
  }
  return value;
}

int parse_positive(const std::string& v, const std::string& what) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || n < 1 || n > 1 << 20) fail("{} must be a positive integer, got '{}'", what, v);
  return static_cast<int>(n);
}

// Pulls "--replay DIR" / "--replay=DIR" and "--force" out of the task's options: they belong to
// the runtime, but the documented spelling puts them after the task.
void take_replay_flags(std::vector<std::string>& args, std::string& replay, bool& force) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--replay") {
      if (i + 1 >= args.size()) fail("--replay needs a snapshot folder");
      replay = args[++i];
    } else if (args[i].rfind("--replay=", 0) == 0) {
      replay = args[i].substr(9);
    } else if (args[i] == "--force") {
      force = true;
    } else {
      kept.push_back(args[i]);
    }
  }
  args = kept;
}

std::vector<std::string> restore_task_args(const Snapshot& s) {
  std::vector<std::string> args;
  for (const auto& a : s.command["task_args"]) args.push_back(arg_from_json(a));
  // The config is taken from the snapshot's copy, so later edits of the original do not leak in.
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size() && s.config) args[i + 1] = s.config->string();
    else if (args[i].rfind("--config=", 0) == 0 && s.config) args[i] = "--config=" + s.config->string();
  }
  return args;
}

}  // namespace

fs::path project_root() {
  if (const char* r = std::getenv("PRIMUS_ROOT"); r && *r) return r;
  return PRIMUS_PROJECT_DIR;
}

void add_common_options(CLI::App& app, CommonOptions& o) {
  app.add_flag("--dry-run", o.dry_run, "print the exact commands and environment, start nothing");
  app.add_flag("--print-env", o.print_env, "print the effective environment and where each value came from");
  app.add_flag("--force", o.force, "replay even when the hardware or versions differ from the snapshot");
  app.add_option("--env", o.env, "set NAME=VALUE for the task (repeatable; wins over presets and patches)");
  app.add_option("--patch", o.patches, "bash file sourced before launch to adjust the environment (repeatable)");
  app.add_option("--hooks-dir", o.hooks_dirs, "folder of NN_* hooks to run too (post/ after the task; repeatable)");
  app.add_option("--log-ranks", o.log_ranks, "ranks that log to the terminal: 0 (default), all, or a list like 0,3");
  app.add_option("--workspace", o.workspace, "folder for run folders (default: the config's workspace, else ./output)");
  app.add_option("--exp-name", o.exp_name, "run folder name (default: the config's exp_name, else generated)");
  app.add_option("--replay", o.replay, "run again from a snapshot folder (also accepted after the task)");
  app.add_flag("--numa", o.numa, "bind each rank to the NUMA node of its GPU (spread over the nodes without GPUs)");
  app.add_flag("--no-numa", o.no_numa, "no NUMA binding (the default; overrides PRIMUS_NUMA and .primus.yaml)");
}

void add_watch_options(CLI::App& app, WatchOptions& o, bool slurm) {
  app.add_option("--max-restarts", o.max_restarts,
                 "relaunch a failed training job up to K times; it resumes from the last good checkpoint")
      ->check(CLI::NonNegativeNumber)
      ->envname("PRIMUS_MAX_RESTARTS");
  app.add_option("--hang-timeout", o.hang_timeout,
                 "seconds without heartbeat progress from a rank before the job counts as hung (0: off; default 600)")
      ->check(CLI::NonNegativeNumber)
      ->envname("PRIMUS_HANG_TIMEOUT");
  app.add_option("--nan-policy", o.nan_policy,
                 "a NaN/Inf loss or gradient: skip the step (default), stop, or warn and update anyway")
      ->check(CLI::IsMember({"skip", "stop", "warn"}));
  app.add_flag("--no-watch", o.no_watch, "no heartbeats, hang detection or restarts: start the job and wait");
  if (slurm)
    app.add_flag("--exclude-failed-nodes", o.exclude_failed_nodes,
                 "a restart asks Slurm for the job without the nodes of the ranks that failed (a replacement from "
                 "the allocation, or from the partition outside one)");
}

std::vector<std::string> WatchOptions::forward() const {
  std::vector<std::string> f = {"--max-restarts", std::to_string(max_restarts),
                                "--hang-timeout", fmt::format("{}", hang_timeout),
                                "--nan-policy",   nan_policy};
  if (no_watch) f.push_back("--no-watch");
  if (exclude_failed_nodes) f.push_back("--exclude-failed-nodes");
  return f;
}

bool watch_option_arity(const std::string& name, bool& takes_value) {
  for (const OptSpec& s :
       {OptSpec{"--max-restarts", true}, OptSpec{"--hang-timeout", true}, OptSpec{"--nan-policy", true},
        OptSpec{"--no-watch", false}, OptSpec{"--exclude-failed-nodes", false}})
    if (name == s.name) {
      takes_value = s.value;
      return true;
    }
  return false;
}

bool common_option_arity(const std::string& name, bool& takes_value) {
  for (auto& s : common_specs())
    if (name == s.name) {
      takes_value = s.value;
      return true;
    }
  return false;
}

std::vector<std::string> TaskLine::all() const {
  if (nested.empty()) return task_args;
  std::vector<std::string> v = nested;
  v.push_back("--");
  v.insert(v.end(), task_args.begin(), task_args.end());
  return v;
}

TaskLine parse_task_line(const std::vector<std::string>& args) {
  TaskLine t;
  std::vector<std::string> runtimes;
  for (auto& r : runtime_registry()) runtimes.push_back(r.name);
  size_t start = 0;
  if (!args.empty() && std::find(runtimes.begin(), runtimes.end(), args[0]) != runtimes.end()) {
    auto dashes = std::find(args.begin(), args.end(), "--");
    if (dashes == args.end()) fail("nested runtime '{}' needs '-- <task> ...' after its options", args[0]);
    t.nested.assign(args.begin(), dashes);
    start = dashes - args.begin() + 1;
  }
  t.task_args.assign(args.begin() + start, args.end());
  if (!t.task_args.empty() && t.task_args[0][0] != '-') t.task = t.task_args[0];
  if (t.task_args.size() > 1 && t.task_args[1][0] != '-') t.subtask = t.task_args[1];
  for (size_t i = 0; i < t.task_args.size(); ++i) {
    if (t.task_args[i] == "--config" && i + 1 < t.task_args.size()) t.config = t.task_args[i + 1];
    else if (t.task_args[i].rfind("--config=", 0) == 0) t.config = t.task_args[i].substr(9);
  }
  return t;
}

Launch prepare_launch(const std::string& runtime, const CommonOptions& opt, const std::vector<std::string>& task_args,
                      const PrepareOptions& p) {
  Launch L;
  L.runtime = runtime;
  L.opt = opt;
  L.project = ProjectFile::load();
  std::vector<std::string> args = task_args;
  take_replay_flags(args, L.opt.replay, L.opt.force);
  L.line = parse_task_line(args);
  if (!L.line.nested.empty() && !p.allow_nested)
    fail("'{}' cannot start another runtime ('{}'); nest runtimes as: slurm ... -- container ... -- <task>", runtime,
         L.line.nested[0]);

  if (!L.opt.replay.empty()) {
    L.replay = load_snapshot(L.opt.replay);
    TaskLine orig = parse_task_line(restore_task_args(*L.replay));
    // "train pretrain --replay D" may name the task; it must be the snapshot's, with nothing else.
    if ((!L.line.task.empty() && L.line.task != orig.task) || (!L.line.subtask.empty() && L.line.subtask != orig.subtask))
      fail("replay: the snapshot ran '{} {}', not '{} {}'", orig.task, orig.subtask, L.line.task, L.line.subtask);
    size_t named = (L.line.task.empty() ? 0 : 1) + (L.line.subtask.empty() ? 0 : 1);
    if (L.line.task_args.size() > named)
      fail("replay takes the task's options from the snapshot; drop '{}'", L.line.task_args[named]);
    std::vector<std::string> diffs = compare_with_here(*L.replay, detect_devices());
    if (!diffs.empty() && !L.opt.force)
      fail("replay: this machine differs from the snapshot {}:\n  {}\nuse --force to replay anyway", L.replay->dir.string(),
           fmt::join(diffs, "\n  "));
    for (auto& d : diffs) std::cerr << "primus-cli: replaying despite: " << d << "\n";
    L.line = orig;
  }
  if (L.line.task.empty() && !p.rank_mode) fail("no task given after '--'");
  validate_task_names(L.line.task_args);

  // Run folder.
  std::string now = fmt::format("{:%Y%m%d_%H%M%S}", fmt::localtime(std::time(nullptr)));
  Setting ws = resolve_setting(L.opt.workspace, "--workspace", nullptr, L.project, "", "");
  if (ws.value.empty())
    if (auto v = config_key(L.line, "workspace")) ws = {*v, "config " + *L.line.config};
  if (ws.value.empty() && L.replay) ws = {L.replay->metadata.value("workspace", ""), "replayed snapshot"};
  if (ws.value.empty()) ws = resolve_setting("", "", "PRIMUS_WORKSPACE", L.project, "workspace", "./output");
  Setting exp = resolve_setting(L.opt.exp_name, "--exp-name", nullptr, L.project, "", "");
  if (exp.value.empty() && L.replay) exp = {L.replay->metadata.value("exp_name", "run") + "_replay_" + now, "replay of a snapshot"};
  if (exp.value.empty())
    if (auto v = config_key(L.line, "exp_name")) exp = {*v, "config " + *L.line.config};
  if (exp.value.empty()) {
    std::string gen = L.line.task + (L.line.subtask.empty() ? "" : "_" + L.line.subtask) + "_" + now;
    exp = resolve_setting("", "", "PRIMUS_EXP_NAME", L.project, "exp_name", gen);
    if (exp.source == "default") exp.source = "generated";
  }
  if (exp.value.find('/') != std::string::npos || exp.value == "." || exp.value == "..")
    fail("exp_name '{}' must be a plain folder name", exp.value);
  L.workspace = abs_path(ws.value);
  L.exp_name = exp.value;
  L.run_dir = fs::path(L.workspace) / L.exp_name;
  L.settings.push_back({"workspace", {L.workspace, ws.source}});
  L.settings.push_back({"exp_name", exp});

  Setting lr = resolve_setting(L.opt.log_ranks, "--log-ranks", "PRIMUS_LOG_RANKS", L.project, "log_ranks", "0");
  log::rank_selected(lr.value, 0);  // validates the spelling now, not in every rank
  L.log_ranks = lr.value;
  L.settings.push_back({"log_ranks", lr});

  if (L.opt.numa && L.opt.no_numa) fail("--numa and --no-numa contradict each other: give one");
  Setting numa = resolve_setting(L.opt.numa      ? "1"
                                 : L.opt.no_numa ? "0"
                                                 : "",
                                 L.opt.numa ? "--numa" : "--no-numa", "PRIMUS_NUMA", L.project, "numa", "0");
  if (numa.value == "true") numa.value = "1";
  if (numa.value == "false") numa.value = "0";
  if (numa.value != "0" && numa.value != "1")
    fail("numa ({}) must be 0 or 1 (true or false), got '{}'", numa.source, numa.value);
  L.numa = numa.value == "1";
  L.settings.push_back({"numa", numa});

  // Additive lists: .primus.yaml, then PRIMUS_*, then the command line.
  for (auto& d : L.project.list("hooks_dirs", true)) L.hooks_dirs.push_back(d);
  for (auto& d : split_colon(std::getenv("PRIMUS_HOOKS_DIRS"))) L.hooks_dirs.push_back(abs_path(d));
  for (auto& d : L.opt.hooks_dirs) L.hooks_dirs.push_back(abs_path(d));
  for (auto& f : L.project.list("patches", true)) L.patches.push_back(f);
  for (auto& f : split_colon(std::getenv("PRIMUS_PATCHES"))) L.patches.push_back(abs_path(f));
  for (auto& f : L.opt.patches) L.patches.push_back(abs_path(f));

  // Device and rank count.
  L.device = detect_devices();
  Setting np;
  if (p.rank_mode) np = {std::to_string(std::max(1, p.local_world_size)), "launcher"};
  else if (p.nproc > 0) np = {std::to_string(p.nproc), "--nproc"};
  else if (L.replay) np = {std::to_string(L.replay->command.value("nproc", 1)), "replayed snapshot"};
  else np = resolve_setting("", "", "PRIMUS_NPROC", L.project, "direct.nproc", "");
  if (np.value.empty()) np = {std::to_string(std::max(1, L.device.count())), L.device.count() ? "GPU count" : "default"};
  L.nproc = parse_positive(np.value, "nproc (" + np.source + ")");
  L.settings.push_back({"nproc", np});

  // The environment, layer by layer (see env_plan.h).
  EnvMap start = current_environment();
  for (const char* marker : {"PRIMUS_ENV_APPLIED", "PRIMUS_LAUNCHED"}) start.erase(marker);
  L.env = EnvPlan(start);
  std::string detected = "detected (" + L.device.source + ")";
  L.env.set("PRIMUS_DEVICE", L.device.model, detected);
  L.env.set("PRIMUS_DEVICE_COUNT", std::to_string(L.device.count()), detected);
  L.env.set("PRIMUS_LOCAL_WORLD_SIZE", std::to_string(L.nproc), "runtime");
  fs::path envs = project_root() / "configs" / "envs";
  if (fs::is_regular_file(envs / "base.sh")) L.env.source_script(envs / "base.sh", "configs/envs/base.sh");
  else L.env.notes.push_back("no " + (envs / "base.sh").string());
  fs::path preset = envs / (L.device.model + ".sh");
  if (fs::is_regular_file(preset)) L.env.source_script(preset, "configs/envs/" + L.device.model + ".sh");
  else L.env.notes.push_back(fmt::format("no preset configs/envs/{}.sh for device {}", L.device.model, L.device.model));
  for (auto& [k, v] : L.project.map("env")) L.env.set(k, v, L.project.label() + " env");
  for (auto& f : L.patches) L.env.source_script(f, "patch " + f);
  if (L.replay) {
    std::string src = "replay " + L.replay->dir.string();
    static const std::set<std::string> not_restored = {"runtime", "launcher"};
    for (auto& [k, e] : L.replay->env["set"].items()) {
      std::string s = e.value("source", "");
      if (not_restored.count(s) || s.rfind("detected", 0) == 0) continue;
      if (e.value("unset", false)) L.env.unset(k, src);
      else L.env.set(k, e.value("value", ""), src);
    }
    EnvMap now_env = L.env.full();
    for (auto& [k, v] : L.replay->env["inherited"].items())
      if (!now_env.count(k) || now_env[k] != v.get<std::string>()) L.env.set(k, v.get<std::string>(), src + " (inherited)");
  }
  for (auto& kv : L.opt.env) {
    auto [k, v] = parse_assignment(kv, "--env");
    L.env.set(k, v, "--env");
  }
  L.env.set("PRIMUS_ROOT", project_root().string(), "runtime");
  L.env.set("PRIMUS_WORKSPACE", L.workspace, "runtime");
  L.env.set("PRIMUS_EXP_NAME", L.exp_name, "runtime");
  L.env.set("PRIMUS_RUN_DIR", L.run_dir.string(), "runtime");
  L.env.set("PRIMUS_SNAPSHOT_DIR", L.snapshot_dir().string(), "runtime");
  L.env.set("PRIMUS_LOG_RANKS", L.log_ranks, "runtime");
  L.env.set("PRIMUS_NUMA", L.numa ? "1" : "0", "runtime");
  L.env.set("PRIMUS_ENV_APPLIED", "1", "runtime");
  return L;
}

std::string Launch::describe() const {
  std::string s = fmt::format("# primus-cli {}: effective environment\n", runtime);
  s += fmt::format("# device: {} x{} (from {}{}{})\n", device.model, device.count(), device.source,
                   device.driver_version.empty() ? "" : ", driver " + device.driver_version,
                   device.toolkit_version.empty() ? "" : ", toolkit " + device.toolkit_version);
  s += fmt::format("# project file: {}\n", project.path() ? project.path()->string() : "none");
  for (auto& [name, st] : settings) s += fmt::format("# {} = {}  ({})\n", name, st.value, st.source);
  if (!patches.empty()) s += fmt::format("# patches: {}\n", fmt::join(patches, " "));
  if (!hooks_dirs.empty()) s += fmt::format("# hooks dirs: {}\n", fmt::join(hooks_dirs, " "));
  for (auto& n : env.notes) s += "# note: " + n + "\n";
  return s + env.describe();
}

HookSet Launch::hooks() const {
  std::vector<fs::path> plain(hooks_dirs.begin(), hooks_dirs.end());
  return find_hooks(line.task, line.subtask, {project_root() / "hooks"}, plain);
}

void Launch::write_snapshot(const std::vector<std::string>& runtime_args) const {
  SnapshotInput in;
  in.dir = snapshot_dir();
  in.runtime = runtime;
  in.runtime_args = runtime_args;
  in.task_args = line.all();
  if (line.config) in.config = fs::path(*line.config);
  in.nproc = nproc;
  in.workspace = workspace;
  in.exp_name = exp_name;
  if (replay) in.replay_of = replay->dir;
  cli::write_snapshot(in, env, device);
}

std::vector<std::string> Launch::forward_options(bool with_hooks_dirs) const {
  std::vector<std::string> f = {"--workspace", workspace, "--exp-name", exp_name, "--log-ranks", log_ranks};
  if (numa) f.push_back("--numa");
  for (auto& e : opt.env) f.insert(f.end(), {"--env", e});
  for (auto& p : opt.patches) f.insert(f.end(), {"--patch", abs_path(p)});
  if (with_hooks_dirs)
    for (auto& d : opt.hooks_dirs) f.insert(f.end(), {"--hooks-dir", abs_path(d)});
  // A replay's restored environment must reach the ranks too.
  if (replay)
    for (auto& [k, e] : env.changes())
      if (e.source.rfind("replay ", 0) == 0 && !e.unset) f.insert(f.end(), {"--env", k + "=" + e.value});
  return f;
}

void export_rank_variables() {
  LaunchEnv e = discover_launch_env();
  auto put = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
  put("RANK", std::to_string(e.rank));
  put("LOCAL_RANK", std::to_string(e.local_rank));
  put("WORLD_SIZE", std::to_string(e.world_size));
  put("LOCAL_WORLD_SIZE", std::to_string(e.local_world_size));
  put("NODE_RANK", std::to_string(e.node_rank));
  put("MASTER_ADDR", e.master_addr);
  put("MASTER_PORT", std::to_string(e.master_port));
}

}  // namespace primus::cli
