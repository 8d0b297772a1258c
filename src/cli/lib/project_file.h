// .primus.yaml: project-level defaults for primus-cli, found in the current folder or the
// nearest parent (or named by PRIMUS_PROJECT_FILE). The command line wins over PRIMUS_*
// variables, which win over this file. Keys (all optional):
//
//   workspace: ./output          # where <exp_name>/ run folders go
//   exp_name: my-exp
//   log_ranks: "0"               # or "all", "0,3"
//   hooks_dirs: [my_hooks]       # paths relative to this file
//   patches: [fix_nccl.sh]
//   env: {NCCL_DEBUG: WARN}
//   direct: {nproc: 2}
//   container: {image: rocm/primus:v1, runtime: podman, mounts: ["/data:/data"], options: ["--privileged"]}
//   slurm: {mpi: pmix}           # srun --mpi value; "none" to pass no --mpi
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace primus::cli {

class ProjectFile {
 public:
  // Searches as described above; no file is fine. A malformed file or an unknown key throws.
  static ProjectFile load();
  static ProjectFile load_file(const std::filesystem::path& path);

  const std::optional<std::filesystem::path>& path() const { return path_; }
  std::string label() const { return path_ ? path_->string() : ".primus.yaml"; }
  // Dotted keys: "workspace", "container.image".
  std::optional<std::string> scalar(const std::string& key) const;
  // A list of strings; with `paths`, relative entries are resolved against the file's folder.
  std::vector<std::string> list(const std::string& key, bool paths = false) const;
  std::map<std::string, std::string> map(const std::string& key) const;

 private:
  std::optional<YAML::Node> node(const std::string& key) const;
  std::optional<std::filesystem::path> path_;
  YAML::Node root_;
};

// A resolved launch setting and where its value came from.
struct Setting {
  std::string value;
  std::string source;  // "--workspace", "PRIMUS_WORKSPACE", ".primus.yaml", "default", ...
};

// Command line, then the PRIMUS_* variable, then .primus.yaml, then the default.
Setting resolve_setting(const std::string& cli_value, const std::string& cli_name, const char* env_var,
                        const ProjectFile& project, const std::string& yaml_key, const std::string& def);

}  // namespace primus::cli
