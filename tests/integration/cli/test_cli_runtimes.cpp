// primus-cli runtimes end to end: real primus-cli processes, real mpirun ranks, real bash hooks
// and patches. Only the outside world is faked where it is absent here: the GPU list
// (PRIMUS_FAKE_GPUS, or a fake nvidia-smi on PATH) and the container engine (a fake docker).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>  // environ

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kCli = PRIMUS_CLI_PATH;
const std::string kRoot = PRIMUS_SOURCE_DIR;

struct Result {
  int code;
  std::string out;
};

std::string q(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("primus-cli-test-" + std::to_string(getpid()) + "-" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir);
  }
  // Runs `primus-cli <args>` in the test folder through bash (env assignments may prefix it),
  // without the caller's PRIMUS_* variables: they would change what primus-cli does (the container
  // runtime forwards each one), and the cases set the ones they test.
  Result run(const std::string& args, const std::string& env = "") {
    std::string unset;
    for (char** e = environ; *e; ++e)
      if (const std::string kv = *e; kv.rfind("PRIMUS_", 0) == 0) unset += " -u " + kv.substr(0, kv.find('='));
    std::string cmd = "cd " + q(dir.string()) + " && env" + unset + " OMPI_ALLOW_RUN_AS_ROOT=1 "
                      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + env + " " + q(kCli) + " " + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int st = pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : 128, out};
  }
  fs::path write(const std::string& rel, const std::string& text, bool exec = false) {
    fs::path p = dir / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    if (exec) fs::permissions(p, fs::perms::owner_all, fs::perm_options::add);
    return p;
  }
  static std::string read(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  static bool has(const std::string& out, const std::string& re) { return std::regex_search(out, std::regex(re)); }
  fs::path dir;
};

TEST_F(Cli, DirectNproc2RunsTwoRanksThroughMpirun) {
  auto r = run("direct --nproc 2 --workspace ws --exp-name two -- info ranks");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "(^|\n)rank=0 local_rank=0 world_size=2 local_world_size=2 .*launcher=mpirun")) << r.out;
  EXPECT_TRUE(has(r.out, "(^|\n)rank=1 local_rank=1 world_size=2 local_world_size=2 .*launcher=mpirun")) << r.out;
  // Rank-aware logs: one file per rank, each line with time, node and rank.
  std::string l0 = read(dir / "ws/two/logs/rank-0.log"), l1 = read(dir / "ws/two/logs/rank-1.log");
  EXPECT_TRUE(has(l0, R"(^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[\S+ r0/2\] \[info\] rank=0)")) << l0;
  EXPECT_TRUE(has(l1, R"(\[\S+ r1/2\] \[info\] rank=1)")) << l1;
  // Terminal: rank 0's log lines only, unless --log-ranks all.
  EXPECT_TRUE(has(r.out, R"(r0/2\] \[info\])"));
  EXPECT_FALSE(has(r.out, R"(r1/2\] \[info\])")) << r.out;
  auto all = run("direct --nproc 2 --log-ranks all --workspace ws --exp-name two-all -- info ranks");
  ASSERT_EQ(all.code, 0) << all.out;
  EXPECT_TRUE(has(all.out, R"(r1/2\] \[info\] rank=1)")) << all.out;
  // The snapshot records the launch.
  json cmd = json::parse(read(dir / "ws/two/snapshot/command.json"));
  EXPECT_EQ(cmd["nproc"], 2);
  EXPECT_EQ(cmd["task_args"], json({"info", "ranks"}));
  json sys = json::parse(read(dir / "ws/two/snapshot/system.json"));
  EXPECT_EQ(sys["device"]["model"], "CPU");
  EXPECT_GT(sys["cpu"]["logical_cores"].get<int>(), 0);
  EXPECT_GT(sys["memory"]["total_bytes"].get<long long>(), 0);
  json ver = json::parse(read(dir / "ws/two/snapshot/version.json"));
  EXPECT_FALSE(ver["version"].get<std::string>().empty());
  EXPECT_TRUE(fs::exists(dir / "ws/two/snapshot/metadata.json"));
}

TEST_F(Cli, WorkspaceAndExpNameComeFromTheConfig) {
  write("c.yaml", "workspace: fromcfg\nexp_name: cfgexp\nlr: 0.1\n");
  auto r = run("direct -- info config --config c.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "fromcfg/cfgexp/snapshot/config.yaml"));
  EXPECT_TRUE(fs::exists(dir / "fromcfg/cfgexp/snapshot/resolved_config.yaml"));
}

TEST_F(Cli, HooksRunInNameOrderAroundTheTask) {
  std::string body = "#!/bin/bash\necho \"$PRIMUS_HOOK_PHASE $(basename $0) device=$PRIMUS_DEVICE rc=${PRIMUS_TASK_EXIT_CODE:-} args=$*\" >> " +
                     q((dir / "order.txt").string()) + "\n";
  write("h1/10_a", body, true);
  write("h1/30_c", body, true);
  write("h2/20_b", body, true);
  write("h2/README.md", "not a hook\n");
  write("h1/post/40_d", body, true);
  auto r = run("direct --hooks-dir h1 --hooks-dir h2 --workspace ws --exp-name h -- info ranks");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read(dir / "order.txt"),
            "pre 10_a device=CPU rc= args=info ranks\npre 20_b device=CPU rc= args=info ranks\n"
            "pre 30_c device=CPU rc= args=info ranks\npost 40_d device=CPU rc=0 args=info ranks\n");
  EXPECT_LT(r.out.find("[hook pre] 30_c"), r.out.find("rank=0 local_rank")) << r.out;
  EXPECT_GT(r.out.find("[hook post] 40_d"), r.out.find("rank=0 local_rank")) << r.out;
}

TEST_F(Cli, FailingHookStopsTheLaunchWithItsNameAndOutput) {
  write("h/10_ok", "#!/bin/bash\ntrue\n", true);
  write("h/20_bad", "#!/bin/bash\necho 'disk on fire'\nexit 3\n", true);
  write("h/post/90_never", "#!/bin/bash\ntouch " + q((dir / "post-ran").string()) + "\n", true);
  auto r = run("direct --hooks-dir h -- info ranks");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r.out, "error: pre hook '.*20_bad' failed \\(exit 3\\)")) << r.out;
  EXPECT_TRUE(has(r.out, "disk on fire")) << r.out;
  EXPECT_FALSE(has(r.out, "rank=0 local_rank")) << "the task must not start: " << r.out;
  EXPECT_FALSE(fs::exists(dir / "post-ran"));
}

TEST_F(Cli, HookWithoutRunBitIsAnError) {
  write("h/10_noexec", "#!/bin/bash\ntrue\n", false);
  auto r = run("direct --hooks-dir h -- info ranks");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r.out, "error: hook '.*10_noexec' is not executable \\(run: chmod \\+x")) << r.out;
}

TEST_F(Cli, PatchesAreSourcedInOrderAndEnvWins) {
  write("p1.sh", "export NCCL_DEBUG=INFO\nexport MY_PATCH=one\nunset CUDA_DEVICE_MAX_CONNECTIONS\necho 'patch output goes to stderr'\n");
  write("p2.sh", "export MY_PATCH=\"$MY_PATCH-two\"\n");
  auto r = run("direct --patch p1.sh --patch p2.sh --env NCCL_IB_TIMEOUT=7 -- info env --prefix NCCL_ --prefix MY_ --prefix OMP_");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "\nNCCL_DEBUG=INFO\n")) << r.out;
  EXPECT_TRUE(has(r.out, "\nMY_PATCH=one-two\n")) << r.out;
  EXPECT_TRUE(has(r.out, "\nNCCL_IB_TIMEOUT=7\n")) << r.out;
  EXPECT_FALSE(has(r.out, "CUDA_DEVICE_MAX_CONNECTIONS=")) << r.out;
  EXPECT_TRUE(has(r.out, "\nOMP_NUM_THREADS=")) << r.out;  // base.sh still applies
  auto pe = run("direct --patch p1.sh --env NCCL_DEBUG=TRACE --print-env -- info ranks");
  ASSERT_EQ(pe.code, 0) << pe.out;
  EXPECT_TRUE(has(pe.out, "NCCL_DEBUG=TRACE +# --env")) << pe.out;
  EXPECT_TRUE(has(pe.out, "MY_PATCH=one +# patch .*/p1.sh")) << pe.out;
  EXPECT_TRUE(has(pe.out, "unset CUDA_DEVICE_MAX_CONNECTIONS +# patch .*/p1.sh")) << pe.out;

  write("bad.sh", "exit 4\n");
  auto bad = run("direct --patch bad.sh -- info ranks");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(has(bad.out, "error: patch .*bad.sh: sourcing .* failed \\(exit 4\\)")) << bad.out;
  write("syntax.sh", "if then fi (\n");
  auto syn = run("direct --patch syntax.sh -- info ranks");
  EXPECT_NE(syn.code, 0);
  EXPECT_TRUE(has(syn.out, "is not valid bash")) << syn.out;
  auto missing = run("direct --patch nope.sh -- info ranks");
  EXPECT_TRUE(has(missing.out, "error: patch .*nope.sh: file .* does not exist")) << missing.out;
}

TEST_F(Cli, EnvPresetFollowsTheFakedDevice) {
  auto h100 = run("direct --print-env -- info ranks", "PRIMUS_FAKE_GPUS='NVIDIA H100 80GB HBM3,NVIDIA H100 80GB HBM3'");
  ASSERT_EQ(h100.code, 0) << h100.out;
  EXPECT_TRUE(has(h100.out, "# device: H100 x2 \\(from PRIMUS_FAKE_GPUS")) << h100.out;
  EXPECT_TRUE(has(h100.out, "NCCL_NVLS_ENABLE=1 +# configs/envs/H100.sh")) << h100.out;
  EXPECT_TRUE(has(h100.out, "NCCL_DEBUG=WARN +# configs/envs/base.sh")) << h100.out;
  EXPECT_TRUE(has(h100.out, "# nproc = 2  \\(GPU count\\)")) << h100.out;
  EXPECT_FALSE(has(h100.out, "HSA_NO_SCRATCH_RECLAIM")) << h100.out;

  // The rank itself sees the preset (built before it started).
  auto mi = run("direct --nproc 1 -- info env", "PRIMUS_FAKE_GPUS='AMD Instinct MI300X'");
  ASSERT_EQ(mi.code, 0) << mi.out;
  EXPECT_TRUE(has(mi.out, "\nHSA_NO_SCRATCH_RECLAIM=1\n")) << mi.out;
  EXPECT_TRUE(has(mi.out, "\nPRIMUS_DEVICE=MI300X\n")) << mi.out;
  EXPECT_FALSE(has(mi.out, "NCCL_NVLS_ENABLE")) << mi.out;

  // A value exported in the shell wins over the preset.
  auto keep = run("direct --print-env -- info ranks", "NCCL_DEBUG=INFO PRIMUS_FAKE_GPUS='NVIDIA A100-SXM4-80GB'");
  EXPECT_FALSE(has(keep.out, "NCCL_DEBUG=")) << keep.out;
  EXPECT_TRUE(has(keep.out, "NCCL_NVLS_ENABLE=0 +# configs/envs/A100.sh")) << keep.out;

  // Detection through a (fake) nvidia-smi on PATH, as on a real NVIDIA host.
  write("bin/nvidia-smi", "#!/bin/bash\necho 'NVIDIA H200, 550.54.15'\necho 'NVIDIA H200, 550.54.15'\n", true);
  auto smi = run("direct --print-env -- info ranks", "PATH=" + q((dir / "bin").string()) + ":$PATH");
  EXPECT_TRUE(has(smi.out, "# device: H200 x2 \\(from nvidia-smi, driver 550.54.15")) << smi.out;
  EXPECT_TRUE(has(smi.out, "# configs/envs/H200.sh")) << smi.out;

  // No GPU: the CPU preset.
  auto cpu = run("direct --print-env -- info ranks", "PRIMUS_FAKE_GPUS=none");
  EXPECT_TRUE(has(cpu.out, "PRIMUS_DEVICE=CPU")) << cpu.out;
  EXPECT_TRUE(has(cpu.out, "OMPI_MCA_btl=\\^openib,ofi +# configs/envs/CPU.sh")) << cpu.out;
  EXPECT_TRUE(has(cpu.out, "OMPI_MCA_mtl=\\^ofi,psm,psm2 +# configs/envs/CPU.sh")) << cpu.out;
  auto own = run("direct --print-env -- info ranks", "PRIMUS_FAKE_GPUS=none OMPI_MCA_mtl=psm2");
  EXPECT_FALSE(has(own.out, "OMPI_MCA_mtl=")) << own.out;  // the user's own choice is kept, not overwritten
}

TEST_F(Cli, ProjectFileAndPrimusVariablesGiveDefaults) {
  write(".primus.yaml", "log_ranks: all\nenv:\n  MY_YAML: from-yaml\ndirect:\n  nproc: 2\n");
  auto r = run("direct --print-env -- info ranks");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "# log_ranks = all  \\(.*\\.primus\\.yaml log_ranks\\)")) << r.out;
  EXPECT_TRUE(has(r.out, "MY_YAML=from-yaml +# .*\\.primus\\.yaml env")) << r.out;
  EXPECT_TRUE(has(r.out, "# nproc = 2  \\(.*direct.nproc\\)")) << r.out;
  auto env = run("direct --print-env -- info ranks", "PRIMUS_LOG_RANKS=0,1");
  EXPECT_TRUE(has(env.out, "# log_ranks = 0,1  \\(PRIMUS_LOG_RANKS\\)")) << env.out;
  auto cli = run("direct --log-ranks 1 --print-env -- info ranks", "PRIMUS_LOG_RANKS=0,1");
  EXPECT_TRUE(has(cli.out, "# log_ranks = 1  \\(--log-ranks\\)")) << cli.out;
  write(".primus.yaml", "workspce: x\n");
  auto bad = run("direct -- info ranks");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(has(bad.out, "error: .*\\.primus\\.yaml: unknown key 'workspce' \\(did you mean 'workspace'\\?\\)")) << bad.out;
}

TEST_F(Cli, ContainerDryRunPrintsTheExactCommand) {
  auto r = run("container --dry-run --runtime docker --image rocm/primus:v1 --mount /data:/data --workspace " +
                   q((dir / "ws").string()) + " --exp-name e1 --env NCCL_DEBUG=INFO -- info ranks",
               "PRIMUS_FAKE_GPUS='AMD Instinct MI300X'");
  ASSERT_EQ(r.code, 0) << r.out;
  std::string d = dir.string();
  std::string expected = "command: docker run --rm --network=host --ipc=host --device /dev/kfd --device /dev/dri "
                         "--group-add video --cap-add SYS_PTRACE --security-opt seccomp=unconfined -v " + kRoot + ":" + kRoot +
                         " -v " + d + "/ws:" + d + "/ws -v " + d + ":" + d + " -v /data:/data -w " + d +
                         " -e PRIMUS_ROOT=" + kRoot + " -e PRIMUS_FAKE_GPUS rocm/primus:v1 " + kCli +
                         " direct --workspace " + d + "/ws --exp-name e1 --log-ranks 0 --env NCCL_DEBUG=INFO -- info ranks\n";
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out << "\nexpected:\n" << expected;
  EXPECT_FALSE(fs::exists(dir / "ws")) << "a dry run writes nothing";
  auto nv = run("container --dry-run --runtime podman --image img -- info ranks", "PRIMUS_FAKE_GPUS='NVIDIA H100 80GB HBM3'");
  EXPECT_TRUE(has(nv.out, "command: podman run --rm --network=host --ipc=host --device nvidia.com/gpu=all -v ")) << nv.out;
}

TEST_F(Cli, ContainerBadInputsAreClearErrors) {
  auto noimg = run("container --dry-run -- info ranks");
  EXPECT_NE(noimg.code, 0);
  EXPECT_TRUE(has(noimg.out, "error: container: no image given")) << noimg.out;
  auto eng = run("container --runtime dockr --image x -- info ranks");
  EXPECT_TRUE(has(eng.out, "error: unknown container runtime 'dockr' \\(did you mean 'docker'\\?\\)")) << eng.out;
  // A fake engine stands in for the daemon this machine does not run.
  std::string path = "PATH=" + q((dir / "bin").string()) + ":$PATH";
  write("bin/docker", "#!/bin/bash\ncase \"$1\" in info) echo 'Cannot connect to the Docker daemon' >&2; exit 1;; esac\n", true);
  auto down = run("container --image img -- info ranks", path);
  EXPECT_NE(down.code, 0);
  EXPECT_TRUE(has(down.out, "error: container engine 'docker' is not reachable .*Cannot connect")) << down.out;
  write("bin/docker",
        "#!/bin/bash\ncase \"$1\" in info) exit 0;; image) exit 1;; pull) echo 'manifest unknown' >&2; exit 1;;"
        " run) shift; echo \"$@\" > " + q((dir / "ran.txt").string()) + "; exit 0;; esac\n",
        true);
  auto missing = run("container --image no/such:img -- info ranks", path);
  EXPECT_NE(missing.code, 0);
  EXPECT_TRUE(has(missing.out, "error: container image 'no/such:img' is not available.*\n.*manifest unknown")) << missing.out;
  // With the image present the engine gets exactly the dry run's command.
  write("bin/docker",
        "#!/bin/bash\ncase \"$1\" in info|image) exit 0;; run) shift; echo \"run $*\" > " + q((dir / "ran.txt").string()) + ";; esac\n",
        true);
  auto dry = run("container --image img --exp-name e --dry-run -- info ranks", path);
  auto real = run("container --image img --exp-name e -- info ranks", path);
  ASSERT_EQ(real.code, 0) << real.out;
  std::string line = dry.out.substr(dry.out.find("command: ") + 9);
  std::string ran = read(dir / "ran.txt");
  EXPECT_EQ(line.substr(line.find(" run ") + 1), ran);
}

TEST_F(Cli, SlurmDryRunPrintsTheExactCommands) {
  std::string d = dir.string();
  auto r = run("slurm srun -N 2 -p gpu --dry-run --workspace ws --exp-name s1 -- info ranks");
  ASSERT_EQ(r.code, 0) << r.out;
  // Watched (the default): a rank that dies takes the step down, so the watch can restart it.
  EXPECT_NE(r.out.find("command: srun --mpi=pmix -N 2 -p gpu --kill-on-bad-exit=1 " + kCli + " direct --workspace " +
                       d + "/ws --exp-name s1 --log-ranks 0 -- info ranks\n"),
            std::string::npos)
      << r.out;
  auto b = run("slurm sbatch -N 64 -t 72:00:00 --dry-run --workspace ws --exp-name b1 -- container --image I -- info ranks");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("command: sbatch --parsable --job-name=b1 --output=" + d + "/ws/b1/logs/slurm-%j.out -N 64 -t 72:00:00 " +
                       d + "/ws/b1/sbatch.sh\n"),
            std::string::npos)
      << b.out;
  // The job runs a watched srun in its allocation (hooks, watch and restarts on the batch host).
  EXPECT_NE(b.out.find("\nexec " + kCli + " slurm srun --batch-step --workspace " + d +
                       "/ws --exp-name b1 --log-ranks 0 --max-restarts 0 --hang-timeout 600 --nan-policy skip -- "
                       "container --image I -- info ranks\n"),
            std::string::npos)
      << b.out;
  EXPECT_FALSE(fs::exists(dir / "ws"));
  auto mode = run("slurm srn -- info ranks");
  EXPECT_TRUE(has(mode.out, "error: slurm: unknown mode 'srn' \\(did you mean 'srun'\\?\\)")) << mode.out;
}

TEST_F(Cli, ReplayReproducesConfigAndCommand) {
  write("c.yaml", "lr: 0.001\ntrain_iters: 10\n");
  auto first = run("direct --workspace ws --exp-name orig --env MY_KNOB=42 -- info config --config c.yaml --set lr=0.5");
  ASSERT_EQ(first.code, 0) << first.out;
  fs::path snap = dir / "ws/orig/snapshot";
  ASSERT_TRUE(fs::exists(snap / "resolved_config.yaml")) << first.out;
  write("c.yaml", "lr: 99\ntrain_iters: 1\n");  // later edits of the original must not leak into the replay
  auto again = run("direct -- info config --replay " + q(snap.string()));
  ASSERT_EQ(again.code, 0) << again.out;
  fs::path replay_dir;
  for (auto& e : fs::directory_iterator(dir / "ws"))
    if (e.path().filename().string().rfind("orig_replay_", 0) == 0) replay_dir = e.path();
  ASSERT_FALSE(replay_dir.empty()) << again.out;
  EXPECT_EQ(read(replay_dir / "snapshot/resolved_config.yaml"), read(snap / "resolved_config.yaml"));
  EXPECT_EQ(read(replay_dir / "snapshot/config.yaml"), read(snap / "config.yaml"));
  EXPECT_NE(read(snap / "resolved_config.yaml").find("lr: 0.5"), std::string::npos);
  json c1 = json::parse(read(snap / "command.json")), c2 = json::parse(read(replay_dir / "snapshot/command.json"));
  auto a1 = c1["task_args"].get<std::vector<std::string>>(), a2 = c2["task_args"].get<std::vector<std::string>>();
  ASSERT_EQ(a1.size(), a2.size());
  for (size_t i = 0; i < a1.size(); ++i)
    if (i == 0 || a1[i - 1] != "--config") EXPECT_EQ(a1[i], a2[i]);
  EXPECT_EQ(c2["nproc"], c1["nproc"]);
  json e2 = json::parse(read(replay_dir / "snapshot/env.json"));
  EXPECT_EQ(e2["set"]["MY_KNOB"]["value"], "42");
  EXPECT_EQ(json::parse(read(replay_dir / "snapshot/metadata.json"))["replay_of"], snap.string());
}

TEST_F(Cli, ReplayRefusesOtherHardwareUnlessForced) {
  auto first = run("direct --workspace ws --exp-name hw -- info ranks", "PRIMUS_FAKE_GPUS='NVIDIA H100 80GB HBM3'");
  ASSERT_EQ(first.code, 0) << first.out;
  auto refused = run("direct -- info ranks --replay ws/hw/snapshot", "PRIMUS_FAKE_GPUS=none");
  EXPECT_NE(refused.code, 0);
  EXPECT_TRUE(has(refused.out, "device.model: \"H100\" in the snapshot, \"CPU\" here")) << refused.out;
  EXPECT_TRUE(has(refused.out, "use --force")) << refused.out;
  EXPECT_FALSE(has(refused.out, "rank=0 local_rank")) << refused.out;
  auto forced = run("direct -- info ranks --replay ws/hw --force", "PRIMUS_FAKE_GPUS=none");
  EXPECT_EQ(forced.code, 0) << forced.out;
  EXPECT_TRUE(has(forced.out, "rank=0 local_rank=0 world_size=1")) << forced.out;
}

TEST_F(Cli, BadInputsGiveClearErrors) {
  fs::create_directories(dir / "empty");
  auto notsnap = run("direct -- info ranks --replay empty");
  EXPECT_NE(notsnap.code, 0);
  EXPECT_TRUE(has(notsnap.out, "error: replay: 'empty' is not a snapshot folder \\(metadata.json is missing\\)")) << notsnap.out;
  auto gone = run("direct -- info ranks --replay nowhere");
  EXPECT_TRUE(has(gone.out, "error: replay: 'nowhere' does not exist")) << gone.out;
  auto rt = run("dirct -- info ranks");
  EXPECT_NE(rt.code, 0);
  EXPECT_TRUE(has(rt.out, "error: unknown runtime 'dirct' \\(did you mean 'direct'\\?\\)")) << rt.out;
  auto task = run("direct -- inf ranks");
  EXPECT_TRUE(has(task.out, "error: unknown task 'inf' \\(did you mean 'info'\\?\\)")) << task.out;
  EXPECT_FALSE(fs::exists(dir / "output")) << "a typo must not create a run folder";
  auto flag = run("direct --nprocs 2 -- info ranks");
  EXPECT_TRUE(has(flag.out, "error: unknown option '--nprocs' \\(did you mean '--nproc'\\?\\)")) << flag.out;
  auto tflag = run("direct -- info env --prefx X");
  EXPECT_TRUE(has(tflag.out, "error: unknown option '--prefx' \\(did you mean '--prefix'\\?\\)")) << tflag.out;
  auto lr = run("direct --log-ranks zero -- info ranks");
  EXPECT_TRUE(has(lr.out, "error: log ranks 'zero' must be")) << lr.out;
  auto env = run("direct --env NOEQUALS -- info ranks");
  EXPECT_TRUE(has(env.out, "error: --env 'NOEQUALS' must look like NAME=VALUE")) << env.out;
}

}  // namespace
