// info: small tasks that show what a launch gives a rank; the runtime tests run them.
//   info ranks    one line per rank: rank, local rank, world size, node, launcher, device, the NUMA
//                 nodes it runs on
//   info env      the tuning variables this rank sees (NCCL_*, OMP_*, ...), sorted
//   info config   loads a YAML config, applies --set key=value, records the resolved config in
//                 the launch's snapshot (primus::write_resolved_config) and prints it
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "cli/lib/numa.h"
#include "cli/lib/process.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"

namespace primus::cli {
namespace info_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

int info_ranks() {
  LaunchEnv e = discover_launch_env();
  const char* dev = std::getenv("PRIMUS_DEVICE");
  std::string line = fmt::format(
      "rank={} local_rank={} world_size={} local_world_size={} node={} launcher={} device={} numa={}", e.rank,
      e.local_rank, e.world_size, e.local_world_size, e.node, e.launcher, dev ? dev : "unknown", current_numa_nodes());
  log::info("{}", line);
  // Every rank answers on stdout (the terminal log shows rank 0 only): tests and users count them.
  std::cout << line << std::endl;
  return 0;
}

int info_env(const std::vector<std::string>& prefixes) {
  EnvMap env = current_environment();
  for (auto& [k, v] : env)
    for (auto& p : prefixes)
      if (k.rfind(p, 0) == 0) {
        std::cout << k << "=" << v << "\n";
        break;
      }
  std::cout.flush();
  return 0;
}

int info_config(const std::string& path, const std::vector<std::string>& sets) {
  YAML::Node cfg;
  try {
    cfg = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    fail("cannot read config {}: {}", path, e.what());
  }
  if (!cfg.IsMap()) fail("config {}: expected a mapping at the top level", path);
  for (auto& s : sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) fail("--set '{}' must look like key=value", s);
    std::string key = s.substr(0, eq);
    if (!cfg[key]) fail("--set {}: config {} has no key '{}'", s, path, key);
    cfg[key] = YAML::Load(s.substr(eq + 1));
  }
  YAML::Emitter out;
  out << cfg;
  std::string text = std::string(out.c_str()) + "\n";
  if (auto written = write_resolved_config(text)) log::info("resolved config written to {}", written->string());
  std::cout << text << std::flush;
  return 0;
}

TaskRegistrar ranks{{"info", "ranks", "print this rank's place in the launch (rank, local rank, world size, node)",
                     [](CLI::App&) -> TaskAction { return [] { return info_ranks(); }; }}};

TaskRegistrar env{{"info", "env", "print the tuning variables a rank sees (NCCL_*, OMP_*, ...)", [](CLI::App& app) -> TaskAction {
                     auto prefixes = std::make_shared<std::vector<std::string>>();
                     app.add_option("--prefix", *prefixes, "variable prefixes to show (repeatable)");
                     return [prefixes] {
                       if (prefixes->empty())
                         *prefixes = {"NCCL_", "RCCL_", "HSA_", "HIP_", "GPU_", "CUDA_", "TORCH_", "NVTE_",
                                      "OMP_",  "OPENBLAS_", "PRIMUS_", "UCX_"};
                       return info_env(*prefixes);
                     };
                   }}};

TaskRegistrar config{{"info", "config", "load a YAML config, apply --set, record and print the resolved config",
                      [](CLI::App& app) -> TaskAction {
                        auto path = std::make_shared<std::string>();
                        auto sets = std::make_shared<std::vector<std::string>>();
                        app.add_option("--config", *path, "YAML config file")->required();
                        app.add_option("--set", *sets, "override a top-level key: key=value (repeatable)");
                        return [path, sets] { return info_config(*path, *sets); };
                      }}};

}  // namespace
}  // namespace primus::cli
