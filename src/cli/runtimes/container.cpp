// container runtime: the same task inside an image, through docker or podman.
//   primus-cli container --image I [--mount /data:/data] [--runtime podman] -- <task> ...
// The project and the workspace are mounted at their own paths, GPUs are passed in, and
// `primus-cli direct` runs inside, so presets, hooks and the snapshot come from inside the image.
#include <unistd.h>

#include <iostream>

#include <fmt/format.h>

#include "cli/lib/launch.h"
#include "cli/lib/process.h"
#include "cli/registry.h"
#include "core/error.h"

namespace primus::cli {
namespace fs = std::filesystem;
namespace container_runtime {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct ContainerOptions {
  CommonOptions common;
  std::string image, engine, cli_path;
  std::vector<std::string> mounts, engine_options;
  int nproc = 0;
};

bool under(const fs::path& p, const fs::path& dir) {
  auto rel = p.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

std::string pick_engine(const std::string& wanted, bool need_binary) {
  if (!wanted.empty()) {
    if (wanted != "docker" && wanted != "podman" && wanted.find('/') == std::string::npos) {
      std::string n = nearest(wanted, {"docker", "podman"});
      fail("unknown container runtime '{}'{}; use docker, podman or a path to one", wanted,
           n.empty() ? "" : fmt::format(" (did you mean '{}'?)", n));
    }
    if (need_binary && !find_program(wanted)) fail("container runtime '{}' is not installed (not found on PATH)", wanted);
    return wanted;
  }
  for (const char* e : {"docker", "podman"})
    if (find_program(e)) return e;
  if (need_binary) fail("no container engine found: neither docker nor podman is on PATH (or pass --runtime)");
  return "docker";  // a dry run still shows the command it would use
}

int launch(const ContainerOptions& o, const std::vector<std::string>& task_args) {
  PrepareOptions p;
  p.nproc = o.nproc;
  Launch L = prepare_launch("container", o.common, task_args, p);
  Setting image = resolve_setting(o.image, "--image", "PRIMUS_IMAGE", L.project, "container.image", "");
  if (image.value.empty()) fail("container: no image given (--image, PRIMUS_IMAGE or container.image in .primus.yaml)");
  Setting eng = resolve_setting(o.engine, "--runtime", "PRIMUS_CONTAINER_RUNTIME", L.project, "container.runtime", "");
  bool dry = L.opt.dry_run;
  std::string engine = pick_engine(eng.value, !dry);
  std::string engine_name = fs::path(engine).filename().string();

  fs::path root = fs::absolute(project_root()).lexically_normal();
  fs::path ws = L.workspace;
  fs::path cwd = fs::current_path();
  std::vector<std::string> cmd{engine, "run", "--rm", "--network=host", "--ipc=host"};
  // GPUs: every device of this host goes in; the ranks pick theirs by local rank.
  if (L.device.vendor == "nvidia") {
    if (engine_name == "podman") cmd.insert(cmd.end(), {"--device", "nvidia.com/gpu=all"});
    else cmd.insert(cmd.end(), {"--gpus", "all"});
  } else if (L.device.vendor == "amd") {
    cmd.insert(cmd.end(), {"--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--cap-add",
                           "SYS_PTRACE", "--security-opt", "seccomp=unconfined"});
  }
  auto mount = [&](const std::string& src, const std::string& dst, bool ro) {
    cmd.insert(cmd.end(), {"-v", src + ":" + dst + (ro ? ":ro" : "")});
  };
  mount(root.string(), root.string(), false);
  if (!under(ws, root)) mount(ws.string(), ws.string(), false);
  if (!under(cwd, root) && !under(cwd, ws) && cwd != root && cwd != ws) mount(cwd.string(), cwd.string(), false);
  for (auto& f : L.patches)
    if (!under(f, root)) mount(f, f, true);
  for (auto& d : L.hooks_dirs)
    if (!under(d, root)) mount(d, d, true);
  std::vector<std::string> mounts = L.project.list("container.mounts");
  mounts.insert(mounts.end(), o.mounts.begin(), o.mounts.end());
  for (auto& m : mounts) {
    auto colon = m.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == m.size())
      fail("--mount '{}' must look like /host/path:/container/path[:ro]", m);
    cmd.insert(cmd.end(), {"-v", m});
  }
  cmd.insert(cmd.end(), {"-w", cwd.string(), "-e", "PRIMUS_ROOT=" + root.string()});
  // Launch facts the inner primus-cli needs: Slurm/PMIx rank variables when nested under
  // srun, OpenMPI tuning (OMPI_MCA_*) and the PRIMUS_* defaults. Passed by name, so values stay out of the process list.
  EnvMap here = current_environment();
  for (auto& [k, v] : here)
    if ((k.rfind("SLURM_", 0) == 0 || k.rfind("PMIX_", 0) == 0 || k.rfind("OMPI_MCA_", 0) == 0 ||
         (k.rfind("PRIMUS_", 0) == 0 && k != "PRIMUS_ROOT")))
      cmd.insert(cmd.end(), {"-e", k});
  std::vector<std::string> extra = L.project.list("container.options");
  extra.insert(extra.end(), o.engine_options.begin(), o.engine_options.end());
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  cmd.push_back(image.value);

  // Inside: the same primus-cli (the project is mounted at its own path) unless told otherwise.
  std::string inner_cli = !o.cli_path.empty() ? o.cli_path : self_exe();
  cmd.insert(cmd.end(), {inner_cli, "direct"});
  auto fwd = L.forward_options(true);
  cmd.insert(cmd.end(), fwd.begin(), fwd.end());
  if (o.nproc > 0) cmd.insert(cmd.end(), {"--nproc", std::to_string(o.nproc)});
  if (L.opt.print_env) cmd.push_back("--print-env");
  if (L.opt.force) cmd.push_back("--force");
  cmd.push_back("--");
  cmd.insert(cmd.end(), L.line.task_args.begin(), L.line.task_args.end());

  if (dry) {
    std::cout << "# dry run: nothing is started, nothing is written\n";
    std::cout << fmt::format("# image = {}  ({})\n# engine = {}  ({})\n", image.value, image.source, engine,
                             eng.value.empty() ? (find_program(engine) ? "found on PATH" : "default, not installed") : eng.source);
    std::cout << "# presets, patches and hooks apply inside the container (primus-cli direct)\n";
    std::cout << "command: " << join_command(cmd) << "\n";
    return 0;
  }
  auto info = run_capture({engine, "info"});
  if (info.exit_code != 0) {
    std::string why = info.err.empty() ? info.out : info.err;
    fail("container engine '{}' is not reachable ('{} info' failed): {}", engine, engine, why.substr(0, why.find('\n')));
  }
  if (run_capture({engine, "image", "inspect", image.value}).exit_code != 0) {
    std::cerr << fmt::format("primus-cli: image {} is not here, pulling it\n", image.value);
    auto pull = run_capture({engine, "pull", image.value});
    if (pull.exit_code != 0)
      fail("container image '{}' is not available: not found locally and '{} pull' failed:\n{}", image.value, engine,
           pull.err.empty() ? pull.out : pull.err);
  }
  exec_replace(cmd, here);
}

RuntimeRegistrar reg{{"container", "run the task inside a docker/podman image (primus-cli direct inside)",
                      [](CLI::App& app) -> RuntimeLauncher {
                        auto o = std::make_shared<ContainerOptions>();
                        add_common_options(app, o->common);
                        app.add_option("--image", o->image, "image to run (default: PRIMUS_IMAGE, .primus.yaml container.image)");
                        app.add_option("--runtime", o->engine, "docker or podman (default: whichever is on PATH)");
                        app.add_option("--mount", o->mounts, "extra bind mount /host:/container[:ro] (repeatable)");
                        app.add_option("--option", o->engine_options, "extra option for '<engine> run' (repeatable)");
                        app.add_option("--nproc,-n", o->nproc, "ranks inside the container (passed to direct)")
                            ->check(kAtLeastOne);
                        app.add_option("--cli-path", o->cli_path, "primus-cli inside the image (default: this one's path)");
                        return [o](const std::vector<std::string>& task_args) { return launch(*o, task_args); };
                      }}};

}  // namespace
}  // namespace primus::cli
