// One run per run folder: an flock on <run_dir>/run.lock, taken by the launcher (primus-cli
// direct) before it writes anything there and by a training rank started without one. A second
// run into the same folder stops at once with an error naming the holder's pid and host, instead
// of two trainers deleting each other's temporary checkpoint folders and interleaving metrics.
// One run per save folder the same way: <save>/save.lock, taken by the trainer's rank 0 at start
// (kSaveFolder), since a `save` outside the run folder is shared by runs of different names.
//
// The lock file holds one JSON line about its holder (pid, host, role, start time, token). The
// launcher passes its token to the ranks (PRIMUS_RUN_LOCK_TOKEN): a rank that finds the lock held
// with its launcher's token runs under it; the kernel drops the lock when the holder dies, so a
// crash never leaves a stale lock behind (the file stays, the lock does not).
#pragma once

#include <filesystem>
#include <string>

namespace primus::safe {

// What a lock guards: the lock file's name in the folder, and the words of its error.
struct LockedFolder {
  const char* file;    // "run.lock"
  const char* noun;    // "run folder"
  const char* remedy;  // what a second run can do instead
};
inline constexpr LockedFolder kRunFolder{"run.lock", "run folder", "choose another exp_name or workspace"};
inline constexpr LockedFolder kSaveFolder{"save.lock", "save folder", "give this run another save folder (save)"};

class RunLock {
 public:
  RunLock() = default;
  ~RunLock();
  RunLock(RunLock&& o) noexcept;
  RunLock& operator=(RunLock&& o) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // Takes the lock for this process (`role`: "launcher", "rank 0", ...). Throws primus::Error
  // naming the holder when another process has it. Creates the folder when needed.
  static RunLock acquire(const std::filesystem::path& dir, const std::string& role,
                         const LockedFolder& what = kRunFolder);

  // For a training rank: when the lock is held by the launcher that started this process (its
  // token is PRIMUS_RUN_LOCK_TOKEN), returns a lock that joins it (holds nothing itself);
  // otherwise acquire(run_dir, role). Call it on one rank per job (world rank 0).
  static RunLock acquire_or_join(const std::filesystem::path& run_dir, const std::string& role);

  bool held() const { return fd_ >= 0; }     // this process holds the flock
  bool joined() const { return joined_; }    // the launcher holds it for this process
  const std::string& token() const { return token_; }
  std::filesystem::path path() const { return path_; }

  // Who holds the lock according to its file ("pid 123 on host h (launcher, since ...)"), or "".
  static std::string describe_holder(const std::filesystem::path& dir, const LockedFolder& what = kRunFolder);

 private:
  int fd_ = -1;
  bool joined_ = false;
  std::string token_;
  std::filesystem::path path_;
};

std::filesystem::path run_lock_path(const std::filesystem::path& run_dir);

}  // namespace primus::safe
