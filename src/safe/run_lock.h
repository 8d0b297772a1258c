// One run per run folder: an flock on <run_dir>/run.lock, taken by the launcher (primus-cli
// direct) before it writes anything there and by a training rank started without one. A second
// run into the same folder stops at once with an error naming the holder's pid and host, instead
// of two trainers deleting each other's temporary checkpoint folders and interleaving metrics.
//
// The lock file holds one JSON line about its holder (pid, host, role, start time, token). The
// launcher passes its token to the ranks (PRIMUS_RUN_LOCK_TOKEN): a rank that finds the lock held
// with its launcher's token runs under it; the kernel drops the lock when the holder dies, so a
// crash never leaves a stale lock behind (the file stays, the lock does not).
#pragma once

#include <filesystem>
#include <string>

namespace primus::safe {

class RunLock {
 public:
  RunLock() = default;
  ~RunLock();
  RunLock(RunLock&& o) noexcept;
  RunLock& operator=(RunLock&& o) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // Takes the lock for this process (`role`: "launcher", "rank 0", ...). Throws primus::Error
  // naming the holder when another process has it. Creates run_dir when needed.
  static RunLock acquire(const std::filesystem::path& run_dir, const std::string& role);

  // For a training rank: when the lock is held by the launcher that started this process (its
  // token is PRIMUS_RUN_LOCK_TOKEN), returns a lock that joins it (holds nothing itself);
  // otherwise acquire(run_dir, role). Call it on one rank per job (world rank 0).
  static RunLock acquire_or_join(const std::filesystem::path& run_dir, const std::string& role);

  bool held() const { return fd_ >= 0; }     // this process holds the flock
  bool joined() const { return joined_; }    // the launcher holds it for this process
  const std::string& token() const { return token_; }
  std::filesystem::path path() const { return path_; }

  // Who holds the lock according to its file ("pid 123 on host h (launcher, since ...)"), or "".
  static std::string describe_holder(const std::filesystem::path& run_dir);

 private:
  int fd_ = -1;
  bool joined_ = false;
  std::string token_;
  std::filesystem::path path_;
};

std::filesystem::path run_lock_path(const std::filesystem::path& run_dir);

}  // namespace primus::safe
