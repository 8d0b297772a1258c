#include "cli/lib/snapshot.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "cli/lib/process.h"
#include "core/error.h"
#include "core/launch_env.h"

#ifndef PRIMUS_PROJECT_DIR
#define PRIMUS_PROJECT_DIR "."
#endif
#ifndef PRIMUS_VERSION
#define PRIMUS_VERSION "0.0.0"
#endif

namespace primus::cli {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json args_json(const std::vector<std::string>& args) {
  json a = json::array();
  for (const auto& s : args) a.push_back(arg_json(s));
  return a;
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream f(p);
  // Text that is not UTF-8 (a host name, an environment value) is shown with U+FFFD here; the
  // arguments themselves are kept byte for byte (arg_json).
  f << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  if (!f) fail("cannot write {}", p.string());
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    fail("snapshot file {} is not valid JSON: {}", p.string(), e.what());
  }
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

std::string now_iso() {
  return fmt::format("{:%Y-%m-%dT%H:%M:%S%z}", fmt::localtime(std::chrono::system_clock::to_time_t(std::chrono::system_clock::now())));
}

// Variables that tune communication and threading; kept in env.json even when inherited from
// the shell (the rest of the shell environment is not recorded: it may hold secrets).
bool tuning_variable(const std::string& k) {
  static const std::regex re(
      "^(NCCL|RCCL|HSA|HIP|ROCM|ROCR|CUDA|CUBLAS|CUBLASLT|CUDNN|NVTE|TORCH|OMP|GOMP|KMP|OPENBLAS|MKL|UCX|"
      "FI|MPI|OMPI|PMIX|PRIMUS|GPU|HCC|MIOPEN|TE)_.*");
  return std::regex_match(k, re);
}

}  // namespace

json version_facts() {
  json v = {{"version", PRIMUS_VERSION}, {"git_commit", "unknown"}, {"git_dirty", nullptr}};
  std::string root = std::getenv("PRIMUS_ROOT") ? std::getenv("PRIMUS_ROOT") : PRIMUS_PROJECT_DIR;
  if (find_program("git")) {
    auto c = run_capture({"git", "-C", root, "rev-parse", "HEAD"});
    if (c.exit_code == 0) {
      v["git_commit"] = trim(c.out);
      auto s = run_capture({"git", "-C", root, "status", "--porcelain", "--untracked-files=no"});
      v["git_dirty"] = s.exit_code == 0 ? json(!trim(s.out).empty()) : json(nullptr);
    }
  }
  return v;
}

json system_facts(const DeviceInfo& device) {
  json s;
  s["hostname"] = host_name();
  utsname u{};
  if (uname(&u) == 0) s["os"] = {{"sysname", u.sysname}, {"release", u.release}, {"machine", u.machine}};
  std::smatch m;
  std::string os_release = read_text("/etc/os-release");
  if (std::regex_search(os_release, m, std::regex("PRETTY_NAME=\"([^\"]*)\""))) s["os"]["distribution"] = m[1];
  std::string cpuinfo = read_text("/proc/cpuinfo");
  std::string model = "unknown";
  if (std::regex_search(cpuinfo, m, std::regex("model name\\s*:\\s*([^\n]*)"))) model = trim(m[1]);
  s["cpu"] = {{"model", model}, {"logical_cores", std::thread::hardware_concurrency()}};
  std::string meminfo = read_text("/proc/meminfo");
  if (std::regex_search(meminfo, m, std::regex("MemTotal:\\s*(\\d+) kB")))
    s["memory"] = {{"total_bytes", std::stoull(m[1]) * 1024}};
  s["device"] = device.to_json();
  if (auto mpirun = find_program("mpirun")) {
    auto c = run_capture({*mpirun, "--version"});
    s["mpi"] = trim(c.out.substr(0, c.out.find('\n')));
  }
  if (const char* job = std::getenv("SLURM_JOB_ID")) {
    s["slurm"] = {{"job_id", job}};
    if (const char* nl = std::getenv("SLURM_JOB_NODELIST")) s["slurm"]["nodelist"] = nl;
  }
  return s;
}

json env_facts(const EnvPlan& env) {
  json set = json::object(), inherited = json::object();
  for (auto& [k, e] : env.changes())
    set[k] = e.unset ? json{{"unset", true}, {"source", e.source}} : json{{"value", e.value}, {"source", e.source}};
  for (auto& [k, v] : env.full())
    if (!env.changes().count(k) && tuning_variable(k)) inherited[k] = v;
  return {{"set", set}, {"inherited", inherited}, {"notes", env.notes}};
}

json arg_json(const std::string& s) {
  try {
    (void)json(s).dump();  // throws on bytes that are not UTF-8
    return s;
  } catch (const json::type_error&) {
    std::string hex;
    for (unsigned char c : s) hex += fmt::format("{:02x}", c);
    return json{{"bytes_hex", hex}};
  }
}

std::string arg_from_json(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (!j.is_object() || !j.contains("bytes_hex") || !j["bytes_hex"].is_string())
    fail("replay: an argument in command.json is neither text nor {{\"bytes_hex\": ...}}: {}", j.dump());
  const std::string hex = j["bytes_hex"].get<std::string>();
  if (hex.size() % 2) fail("replay: bytes_hex of odd length in command.json");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out += char(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

void write_snapshot(const SnapshotInput& in, const EnvPlan& env, const DeviceInfo& device) {
  std::error_code ec;
  fs::create_directories(in.dir, ec);
  if (ec) fail("cannot create the snapshot folder {}: {}", in.dir.string(), ec.message());
  std::vector<std::string> argv{self_exe(), in.runtime};
  argv.insert(argv.end(), in.runtime_args.begin(), in.runtime_args.end());
  argv.push_back("--");
  argv.insert(argv.end(), in.task_args.begin(), in.task_args.end());
  std::vector<std::string> files = {"command.json", "env.json", "system.json", "version.json", "metadata.json"};
  write_json(in.dir / "command.json", {{"runtime", in.runtime},
                                       {"runtime_args", args_json(in.runtime_args)},
                                       {"task_args", args_json(in.task_args)},
                                       {"argv", args_json(argv)},
                                       {"command_line", join_command(argv)},
                                       {"cwd", arg_json(fs::current_path().string())},
                                       {"nproc", in.nproc},
                                       {"config", in.config ? arg_json(fs::absolute(*in.config).string()) : json(nullptr)}});
  write_json(in.dir / "env.json", env_facts(env));
  write_json(in.dir / "system.json", system_facts(device));
  write_json(in.dir / "version.json", version_facts());
  if (in.config) {
    fs::copy_file(*in.config, in.dir / "config.yaml", fs::copy_options::overwrite_existing, ec);
    if (ec) fail("cannot copy the config {} into the snapshot: {}", in.config->string(), ec.message());
    files.push_back("config.yaml");
  }
  const char* user = std::getenv("USER");
  write_json(in.dir / "metadata.json", {{"format", "primus-snapshot/1"},
                                        {"created", now_iso()},
                                        {"user", user ? user : std::to_string(getuid())},
                                        {"hostname", host_name()},
                                        {"workspace", in.workspace},
                                        {"exp_name", in.exp_name},
                                        {"run_dir", in.dir.parent_path().string()},
                                        {"runtime", in.runtime},
                                        {"replay_of", in.replay_of ? json(in.replay_of->string()) : json(nullptr)},
                                        {"files", files}});
}

void update_snapshot_host(const fs::path& dir, const EnvPlan& env, const DeviceInfo& device) {
  if (!fs::is_regular_file(dir / "metadata.json")) return;  // the submitter wrote none (dry run)
  write_json(dir / "env.json", env_facts(env));
  write_json(dir / "system.json", system_facts(device));
}

Snapshot load_snapshot(const fs::path& given) {
  std::error_code ec;
  if (!fs::exists(given, ec)) fail("replay: '{}' does not exist", given.string());
  fs::path dir = given;
  if (!fs::is_regular_file(dir / "metadata.json") && fs::is_regular_file(dir / "snapshot" / "metadata.json"))
    dir = dir / "snapshot";
  for (const char* f : {"metadata.json", "command.json", "env.json", "system.json", "version.json"})
    if (!fs::is_regular_file(dir / f))
      fail("replay: '{}' is not a snapshot folder ({} is missing); a launch writes one to "
           "<workspace>/<exp_name>/snapshot/",
           given.string(), f);
  Snapshot s;
  s.dir = fs::absolute(dir).lexically_normal();
  s.metadata = read_json(dir / "metadata.json");
  if (s.metadata.value("format", "") != "primus-snapshot/1")
    fail("replay: {} has format '{}', expected primus-snapshot/1", (dir / "metadata.json").string(),
         s.metadata.value("format", ""));
  s.command = read_json(dir / "command.json");
  s.env = read_json(dir / "env.json");
  s.system = read_json(dir / "system.json");
  s.version = read_json(dir / "version.json");
  if (!s.command.contains("task_args") || !s.command["task_args"].is_array())
    fail("replay: {} has no task_args list", (dir / "command.json").string());
  if (fs::is_regular_file(dir / "config.yaml")) s.config = s.dir / "config.yaml";
  else if (!s.command.value("config", json(nullptr)).is_null())
    fail("replay: the run had a config ({}) but {} has no config.yaml copy", s.command["config"].dump(), s.dir.string());
  return s;
}

std::vector<std::string> compare_with_here(const Snapshot& s, const DeviceInfo& device) {
  json here = system_facts(device);
  json ver = version_facts();
  std::vector<std::string> diffs;
  auto cmp = [&](const std::string& name, const json& then, const json& now) {
    if (then != now) diffs.push_back(fmt::format("{}: {} in the snapshot, {} here", name, then.dump(), now.dump()));
  };
  for (const char* k : {"model", "count", "driver_version", "toolkit_version"})
    cmp(std::string("device.") + k, s.system["device"].value(k, json(nullptr)), here["device"][k]);
  cmp("cpu.model", s.system["cpu"].value("model", json(nullptr)), here["cpu"]["model"]);
  cmp("cpu.logical_cores", s.system["cpu"].value("logical_cores", json(nullptr)), here["cpu"]["logical_cores"]);
  cmp("primus.version", s.version.value("version", json(nullptr)), ver["version"]);
  cmp("primus.git_commit", s.version.value("git_commit", json(nullptr)), ver["git_commit"]);
  return diffs;
}

}  // namespace primus::cli
