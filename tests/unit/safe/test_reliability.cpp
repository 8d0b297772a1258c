// Issue 21's building blocks of src/safe, without training: disk space and write errors, the
// metrics writer, unwritable heartbeats, the run-folder lock, ranks dying with their launcher.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "core/launch_env.h"
#include "safe/disk.h"
#include "safe/heartbeat.h"
#include "safe/launcher_link.h"
#include "safe/metrics_writer.h"
#include "safe/run_lock.h"
#include "support/error_of.h"

namespace fs = std::filesystem;
using namespace primus;

namespace {

struct Dir {
  fs::path path;
  Dir() {
    path = fs::temp_directory_path() /
           ("primus_rel_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
};

using test::error_of;

struct EnvVar {
  std::string name;
  EnvVar(const char* n, const std::string& v) : name(n) { ::setenv(n, v.c_str(), 1); }
  ~EnvVar() { ::unsetenv(name.c_str()); }
};

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

}  // namespace

TEST(Disk, NotEnoughSpaceNamesThePathAndTheBytes) {
  Dir d;
  EXPECT_GT(safe::free_bytes(d.path.string()), 0u);
  EXPECT_GT(safe::free_bytes((d.path / "not" / "yet").string()), 0u);  // asks the nearest parent
  const std::string e = error_of([&] { safe::require_free((d.path / "x").string(), uint64_t(1) << 62, "checkpoint shard"); });
  EXPECT_NE(e.find("not enough disk space for checkpoint shard"), std::string::npos) << e;
  EXPECT_NE(e.find((d.path / "x").string()), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(uint64_t(1) << 62) + " bytes"), std::string::npos) << e;
  EnvVar fake("PRIMUS_FAULT_DISK_FREE", "100");
  EXPECT_NO_THROW(safe::require_free(d.path.string(), 100, "x"));
  EXPECT_THROW(safe::require_free(d.path.string(), 101, "x"), Error);
}

// Issue 21, finding 3: on a full disk metrics.jsonl ended empty while the run said it finished.
TEST(MetricsWriter, AFullDiskIsAnErrorNamingTheFileNeverASilentlyEmptyFile) {
  {
    EnvVar fake("PRIMUS_FAULT_DISK_FREE", "1000000000");  // /dev/full: writes fail with ENOSPC
    safe::MetricsWriter w("/dev/full", 0);
    const std::string e = error_of([&] { w.write(nlohmann::json{{"iteration", 1}, {"lm_loss", 2.5}}); });
    EXPECT_NE(e.find("/dev/full"), std::string::npos) << e;
    EXPECT_NE(e.find("No space left on device"), std::string::npos) << e;
    EXPECT_NE(e.find("bytes needed"), std::string::npos) << e;
  }
  Dir d;
  const fs::path p = d.path / "metrics.jsonl";
  safe::MetricsWriter w(p.string(), 0);
  w.write(nlohmann::json{{"iteration", 1}});
  w.write_line(R"({"iteration": 2})");
  w.sync();
  EXPECT_EQ(w.bytes_written(), fs::file_size(p));
  {
    EnvVar fake("PRIMUS_FAULT_DISK_FREE", "10");  // checked before writing: nothing half-written
    const std::string e = error_of([&] { w.write(nlohmann::json{{"iteration", 3}}); });
    EXPECT_NE(e.find("not enough disk space for metrics"), std::string::npos) << e;
  }
  std::ifstream in(p);
  std::string a, b, c;
  std::getline(in, a);
  std::getline(in, b);
  EXPECT_EQ(a, R"({"iteration":1})");
  EXPECT_EQ(b, R"({"iteration": 2})");
  EXPECT_FALSE(std::getline(in, c));
  EXPECT_NE(error_of([&] { safe::MetricsWriter((d.path / "no" / "such" / "m.jsonl").string()); }).find("cannot open"),
            std::string::npos);
}

TEST(Heartbeat, AnUnwritableHeartbeatSaysWhyAndTheLauncherCanReadIt) {
  Dir d;
  safe::Heartbeat hb;
  hb.rank = 3;
  hb.pid = 1234;
  hb.host = "node7";
  EXPECT_EQ(safe::write_heartbeat(d.path, hb), "");
  std::ofstream(d.path / "blocked") << "a file where the watch folder should be";
  const std::string err = safe::write_heartbeat(d.path / "blocked", hb);
  EXPECT_NE(err.find("cannot write"), std::string::npos) << err;
  {
    EnvVar fault("PRIMUS_FAULT_HEARTBEAT", "from=5");
    hb.iteration = 4;
    EXPECT_EQ(safe::write_heartbeat(d.path, hb), "");
    hb.iteration = 5;
    EXPECT_NE(safe::write_heartbeat(d.path, hb).find("No space left on device"), std::string::npos);
  }
  const std::string text = "some output\n" + safe::heartbeat_unwritable_line(hb, "cannot write x: No space left on device") +
                           "more\n";
  const auto found = safe::parse_unwritable_heartbeats(text);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 3);
  EXPECT_EQ(found[0].pid, 1234);
  EXPECT_EQ(found[0].host, "node7");
  EXPECT_EQ(found[0].reason, "cannot write x: No space left on device");
}

// Issue 21, finding 4: nothing locked the run folder; two trainers in one folder deleted each
// other's temporary checkpoint folders and mixed their metrics.
TEST(RunLock, ASecondRunStopsAtOnceNamingTheHolder) {
  Dir d;
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    safe::RunLock lock = safe::RunLock::acquire(d.path, "test holder");
    ::pause();
    std::_Exit(0);
  }
  for (int i = 0; i < 200 && safe::RunLock::describe_holder(d.path).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string e = error_of([&] { safe::RunLock::acquire(d.path, "second"); });
  EXPECT_NE(e.find("in use by another run"), std::string::npos) << e;
  EXPECT_NE(e.find("pid " + std::to_string(holder)), std::string::npos) << e;
  EXPECT_NE(e.find("on host " + host_name()), std::string::npos) << e;
  // The kernel drops the lock with its holder: no stale lock after a crash.
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  safe::RunLock mine = safe::RunLock::acquire(d.path, "after the crash");
  EXPECT_TRUE(mine.held());
  // A rank of this launcher joins it; a process with another token does not.
  {
    EnvVar token("PRIMUS_RUN_LOCK_TOKEN", mine.token());
    safe::RunLock rank = safe::RunLock::acquire_or_join(d.path, "rank 0");
    EXPECT_TRUE(rank.joined());
    EXPECT_FALSE(rank.held());
  }
  EnvVar token("PRIMUS_RUN_LOCK_TOKEN", "someone-else");
  EXPECT_THROW(safe::RunLock::acquire_or_join(d.path, "rank 0"), Error);
}

// Issue 21, finding 4: SIGKILL to the launcher left its trainer running as an orphan.
TEST(LauncherLink, ARankDiesWithItsLauncher) {
  EXPECT_GT(safe::process_start_ticks(::getpid()), 0);
  EXPECT_EQ(safe::process_start_ticks(-5), -1);
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    // The "launcher" starts a "rank" that is not its direct child (as under mpirun: a
    // grandchild), tells the test its pid, then waits to be killed.
    std::map<std::string, std::string> env;
    safe::export_launcher_identity(env);
    const pid_t middle = ::fork();
    if (middle == 0) {
      const pid_t rank = ::fork();
      if (rank == 0) {
        for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        safe::die_with_launcher(0.05);
        const pid_t me = ::getpid();
        (void)!::write(pipefd[1], &me, sizeof me);
        while (true) ::pause();
      }
      std::_Exit(0);  // the rank is reparented: PR_SET_PDEATHSIG alone would not reach it
    }
    ::waitpid(middle, nullptr, 0);
    while (true) ::pause();
  }
  pid_t rank = 0;
  ASSERT_EQ(::read(pipefd[0], &rank, sizeof rank), ssize_t(sizeof rank));
  EXPECT_TRUE(alive(rank));
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gone = !alive(rank) || std::ifstream("/proc/" + std::to_string(rank) + "/stat").peek() == EOF;
    // A zombie (reparented to an init that reaps late) counts as dead: check its state.
    std::ifstream st("/proc/" + std::to_string(rank) + "/stat");
    std::string s((std::istreambuf_iterator<char>(st)), {});
    if (s.find(") Z") != std::string::npos) gone = true;
  }
  EXPECT_TRUE(gone) << "rank " << rank << " outlived its launcher";
  if (!gone) ::kill(rank, SIGKILL);
}
