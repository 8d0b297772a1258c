// A run that many test cases compare against (a one-process reference training), computed once and
// shared. ctest runs every case in a process of its own, two at a time, so the share is a folder in
// the build tree: test_cache/<key>/, where the key hashes everything that decides the run's result
// (the caller's description of it, and the size and time of the binary that runs it, so that a
// rebuilt primus-cli never meets an old result). The first case to ask produces it under a lock;
// a case asking for the same key at the same time waits for it rather than running it again; the
// others copy the finished folder. A failed run is not kept: each case that needs it runs it again
// and reports its own failure.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#ifndef PRIMUS_TEST_CACHE_DIR
#error "PRIMUS_TEST_CACHE_DIR is defined by primus_add_test (tests/CMakeLists.txt)"
#endif

namespace primus::test {

struct SharedRunResult {
  int status = 0;    // the producer's: 0 when the run succeeded
  std::string out;   // its output (the first producer's, when the run came from the share)
  std::filesystem::path folder;  // set by the producer: the folder, inside its scratch folder, to share
  bool from_cache = false;
};

// A stable 64-bit FNV-1a of the text, as 16 hex digits (std::hash may differ between builds).
inline std::string shared_run_key(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The identity of a file for a key: its path, size and modification time.
inline std::string file_stamp(const std::filesystem::path& p) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(p, ec);
  const auto time = std::filesystem::last_write_time(p, ec).time_since_epoch().count();
  return p.string() + ":" + std::to_string(size) + ":" + std::to_string(time);
}

// Fills `dest` (which must not exist) with the folder that produce(scratch) writes somewhere inside
// the empty folder `scratch` (and names in its result's `folder`) for this description, producing it
// only when the share has none. produce returns the run's status (0: success) and output.
inline SharedRunResult shared_run(const std::string& description, const std::filesystem::path& dest,
                                  const std::function<SharedRunResult(const std::filesystem::path&)>& produce) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(PRIMUS_TEST_CACHE_DIR);
  fs::create_directories(root);
  const std::string key = shared_run_key(description);
  const fs::path entry = root / key;
  SharedRunResult r;
  {
    // One producer per key across processes; the lock goes with the descriptor.
    const int fd = ::open((root / (key + ".lock")).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd >= 0) ::flock(fd, LOCK_EX);
    if (!fs::exists(entry / ".shared_run_output")) {
      const fs::path scratch = root / (key + ".scratch." + std::to_string(::getpid()));
      fs::remove_all(scratch);
      fs::create_directories(scratch);
      r = produce(scratch);
      if (r.status == 0 && !fs::is_directory(r.folder)) {
        r.status = -1;
        r.out += "\nshared_run: the producer named no folder to share (" + r.folder.string() + ")";
      }
      if (r.status == 0) {
        std::ofstream(r.folder / ".shared_run_output") << r.out;
        std::ofstream(r.folder / ".shared_run_description") << description;
        fs::remove_all(entry);
        fs::rename(r.folder, entry);
      }
      fs::remove_all(scratch);
    } else {
      std::stringstream s;
      s << std::ifstream(entry / ".shared_run_output").rdbuf();
      r.out = s.str();
      r.from_cache = true;
    }
    if (fd >= 0) ::close(fd);
  }
  if (r.status != 0) return r;
  fs::create_directories(dest.parent_path());
  fs::copy(entry, dest, fs::copy_options::recursive);
  fs::remove(dest / ".shared_run_output");
  fs::remove(dest / ".shared_run_description");
  return r;
}

}  // namespace primus::test
