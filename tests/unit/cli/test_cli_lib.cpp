// The pieces under the runtimes: device name normalisation, launch-environment discovery,
// rank-aware logging, the layered environment, hook discovery, .primus.yaml parsing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "cli/lib/env_plan.h"
#include "cli/lib/gpu.h"
#include "cli/lib/hooks.h"
#include "cli/lib/project_file.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::cli;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("primus-cli-unit-" + std::to_string(getpid()) + "-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text, bool exec = false) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  if (exec) fs::permissions(p, fs::perms::owner_all, fs::perm_options::add);
}

// Sets variables for one test and restores them after.
struct ScopedEnv {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const std::string& k, const std::optional<std::string>& v) {
    const char* old = std::getenv(k.c_str());
    saved.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
    if (v) setenv(k.c_str(), v->c_str(), 1);
    else unsetenv(k.c_str());
  }
  ~ScopedEnv() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) setenv(it->first.c_str(), it->second->c_str(), 1);
      else unsetenv(it->first.c_str());
    }
  }
};

void clear_launch_vars(ScopedEnv& e) {
  for (const char* k : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_NTASKS", "SLURM_LOCALID",
                        "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST",
                        "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                        "MASTER_ADDR", "MASTER_PORT", "PRIMUS_LAUNCHED"})
    e.set(k, std::nullopt);
}

TEST(Gpu, NamesAreNormalised) {
  EXPECT_EQ(normalise_gpu_name("NVIDIA H100 80GB HBM3"), "H100");
  EXPECT_EQ(normalise_gpu_name("NVIDIA H100 NVL"), "H100");
  EXPECT_EQ(normalise_gpu_name("NVIDIA H200"), "H200");
  EXPECT_EQ(normalise_gpu_name("NVIDIA A100-SXM4-80GB"), "A100");
  EXPECT_EQ(normalise_gpu_name("NVIDIA B200"), "B200");
  EXPECT_EQ(normalise_gpu_name("NVIDIA GB200"), "GB200");
  EXPECT_EQ(normalise_gpu_name("AMD Instinct MI300X"), "MI300X");
  EXPECT_EQ(normalise_gpu_name("AMD Instinct MI325X OAM"), "MI325X");
  EXPECT_EQ(normalise_gpu_name("AMD Instinct MI355X"), "MI355X");
  EXPECT_EQ(normalise_gpu_name("AMD Instinct MI250X / MI250"), "MI250X");
  EXPECT_EQ(normalise_gpu_name("Tesla T4"), "TESLA_T4");
  EXPECT_EQ(amd_model_from_device_id(0x74a1), "MI300X");
  EXPECT_EQ(amd_model_from_device_id(0x75a3), "MI355X");
  EXPECT_EQ(amd_model_from_device_id(0x1234), "");
}

TEST(Gpu, FakeListDrivesDetection) {
  ScopedEnv e;
  e.set("PRIMUS_FAKE_GPUS", "AMD Instinct MI325X,AMD Instinct MI325X,AMD Instinct MI325X");
  DeviceInfo d = detect_devices();
  EXPECT_EQ(d.vendor, "amd");
  EXPECT_EQ(d.model, "MI325X");
  EXPECT_EQ(d.count(), 3);
  e.set("PRIMUS_FAKE_GPUS", "none");
  d = detect_devices();
  EXPECT_EQ(d.model, "CPU");
  EXPECT_EQ(d.count(), 0);
}

TEST(LaunchEnv, ReadsMpirunThenSlurmThenRank) {
  ScopedEnv e;
  clear_launch_vars(e);
  LaunchEnv single = discover_launch_env();
  EXPECT_EQ(single.launcher, "single");
  EXPECT_EQ(single.world_size, 1);
  EXPECT_FALSE(is_launched_rank());

  e.set("SLURM_PROCID", "3");
  EXPECT_FALSE(is_launched_rank()) << "a batch script (no job step) is not a rank";
  e.set("SLURM_STEP_ID", "0");
  e.set("SLURM_NTASKS", "8");
  e.set("SLURM_LOCALID", "1");
  e.set("SLURM_NODEID", "1");
  e.set("SLURM_STEP_TASKS_PER_NODE", "2(x4)");
  e.set("SLURM_STEP_NODELIST", "gpu[07-10]");
  e.set("SLURM_JOB_ID", "1234");
  LaunchEnv s = discover_launch_env();
  EXPECT_EQ(s.launcher, "slurm");
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.local_world_size, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.master_addr, "gpu07");
  EXPECT_EQ(s.master_port, 21234);
  EXPECT_TRUE(is_launched_rank());

  e.set("OMPI_COMM_WORLD_RANK", "5");
  e.set("OMPI_COMM_WORLD_SIZE", "6");
  e.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  e.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  LaunchEnv m = discover_launch_env();
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(m.rank, 5);
  EXPECT_EQ(m.world_size, 6);

  e.set("OMPI_COMM_WORLD_RANK", "six");
  EXPECT_THROW(discover_launch_env(), Error);
  e.set("OMPI_COMM_WORLD_RANK", "7");
  EXPECT_THROW(discover_launch_env(), Error) << "rank 7 of 6";
}

TEST(Log, RankSelectionAndLineFormat) {
  EXPECT_TRUE(log::rank_selected("all", 9));
  EXPECT_FALSE(log::rank_selected("none", 0));
  EXPECT_TRUE(log::rank_selected("0,3", 3));
  EXPECT_FALSE(log::rank_selected("0,3", 2));
  EXPECT_THROW(log::rank_selected("0,x", 0), Error);
  EXPECT_THROW(log::rank_selected("1,", 0), Error);

  fs::path d = temp_dir("log");
  LaunchEnv where;
  where.rank = 2;
  where.world_size = 4;
  where.node = "nodeA";
  log::init(where, {d, "none", "info"});
  log::info("hello {}", 42);
  log::debug("not at info level");
  log::flush();
  std::ifstream f(d / "rank-2.log");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_TRUE(std::regex_match(ss.str(), std::regex(R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[nodeA r2/4\] \[info\] hello 42\n)")))
      << ss.str();
  EXPECT_THROW(log::init(where, {d, "0", "loud"}), Error);
  fs::remove_all(d);
}

TEST(EnvPlan, RecordsWhatEachScriptChanged) {
  fs::path d = temp_dir("envplan");
  write(d / "a.sh", "export A=1\nexport KEEP=${KEEP:-preset}\nunset GONE\necho chatter\n");
  write(d / "b.sh", "export A=2\nexport B=\"with space\"\n");
  EnvPlan plan({{"KEEP", "mine"}, {"GONE", "x"}, {"PATH", std::getenv("PATH")}});
  plan.source_script(d / "a.sh", "a");
  plan.source_script(d / "b.sh", "b");
  plan.set("C", "3", "--env");
  auto& ch = plan.changes();
  EXPECT_EQ(ch.at("A").value, "2");
  EXPECT_EQ(ch.at("A").source, "b");
  EXPECT_EQ(ch.at("B").value, "with space");
  EXPECT_TRUE(ch.at("GONE").unset);
  EXPECT_EQ(ch.count("KEEP"), 0u) << "a preset must not override the shell's value";
  EnvMap full = plan.full();
  EXPECT_EQ(full.at("KEEP"), "mine");
  EXPECT_EQ(full.count("GONE"), 0u);
  EXPECT_EQ(full.at("C"), "3");
  write(d / "exit.sh", "exit 5\n");
  EXPECT_THROW(plan.source_script(d / "exit.sh", "x"), Error);
  EXPECT_THROW(plan.source_script(d / "missing.sh", "x"), Error);
  EXPECT_THROW(parse_assignment("1BAD=x", "--env"), Error);
  EXPECT_EQ(parse_assignment("OK=a=b", "--env").second, "a=b");
  fs::remove_all(d);
}

TEST(Hooks, FoundInNameOrderAcrossFolders) {
  fs::path d = temp_dir("hooks");
  write(d / "repo/train/pretrain/10_a.sh", "#!/bin/sh\n", true);
  write(d / "repo/train/pretrain/README.md", "docs\n");
  write(d / "repo/train/pretrain/post/50_z", "#!/bin/sh\n", true);
  write(d / "user/05_first", "#!/bin/sh\n", true);
  write(d / "user/20_b", "#!/bin/sh\n", true);
  HookSet h = find_hooks("train", "pretrain", {d / "repo"}, {d / "user"});
  ASSERT_EQ(h.pre.size(), 3u);
  EXPECT_EQ(h.pre[0].filename(), "05_first");
  EXPECT_EQ(h.pre[1].filename(), "10_a.sh");
  EXPECT_EQ(h.pre[2].filename(), "20_b");
  ASSERT_EQ(h.post.size(), 1u);
  EXPECT_TRUE(find_hooks("train", "other", {d / "repo"}, {}).pre.empty());
  EXPECT_THROW(find_hooks("train", "pretrain", {d / "repo"}, {d / "nope"}), Error);
  write(d / "user/30_plain", "#!/bin/sh\n", false);
  EXPECT_THROW(find_hooks("train", "pretrain", {d / "repo"}, {d / "user"}), Error);
  fs::remove_all(d);
}

TEST(ProjectFile, KeysAndErrors) {
  fs::path d = temp_dir("project");
  write(d / "p.yaml", "workspace: /w\ncontainer:\n  image: img:1\n  mounts: [/a:/a]\npatches: [fix.sh]\nenv: {X: 1}\n");
  ProjectFile p = ProjectFile::load_file(d / "p.yaml");
  EXPECT_EQ(p.scalar("workspace"), "/w");
  EXPECT_EQ(p.scalar("container.image"), "img:1");
  EXPECT_FALSE(p.scalar("exp_name"));
  EXPECT_EQ(p.list("container.mounts"), std::vector<std::string>{"/a:/a"});
  EXPECT_EQ(p.list("patches", true), std::vector<std::string>{(d / "fix.sh").string()});
  EXPECT_EQ(p.map("env").at("X"), "1");
  EXPECT_EQ(p.scalar("workspace"), "/w") << "reading must not change the tree";
  write(d / "bad.yaml", "container:\n  imgae: x\n");
  try {
    ProjectFile::load_file(d / "bad.yaml");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'image'"), std::string::npos) << e.what();
  }
  write(d / "broken.yaml", "a: [1, 2\n");
  EXPECT_THROW(ProjectFile::load_file(d / "broken.yaml"), Error);
  fs::remove_all(d);
}

}  // namespace
