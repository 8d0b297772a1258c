#include "safe/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/launch_env.h"
#include "safe/events.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::safe {

fs::path run_lock_path(const fs::path& run_dir) { return run_dir / kRunFolder.file; }

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

RunLock::RunLock(RunLock&& o) noexcept : fd_(o.fd_), joined_(o.joined_), token_(std::move(o.token_)), path_(std::move(o.path_)) {
  o.fd_ = -1;
  o.joined_ = false;
}

RunLock& RunLock::operator=(RunLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    joined_ = o.joined_;
    token_ = std::move(o.token_);
    path_ = std::move(o.path_);
    o.fd_ = -1;
    o.joined_ = false;
  }
  return *this;
}

namespace {

json read_holder(const fs::path& lock_file) {
  std::ifstream in(lock_file);
  std::string line;
  std::getline(in, line);
  try {
    return json::parse(line);
  } catch (const json::exception&) {
    return json::object();
  }
}

// Is the flock on this file held by someone (not us)? Tries to take it and gives it back.
bool lock_is_held(const fs::path& lock_file) {
  const int fd = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool busy = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return busy;
}

}  // namespace

std::string RunLock::describe_holder(const fs::path& dir, const LockedFolder& what) {
  const json h = read_holder(dir / what.file);
  if (!h.is_object() || !h.contains("pid")) return "";
  return fmt::format("pid {} on host {} ({}, since {})", h.value("pid", 0), h.value("host", "?"), h.value("role", "?"),
                     h.value("since", "?"));
}

RunLock RunLock::acquire(const fs::path& dir, const std::string& role, const LockedFolder& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create the {} {}: {}", what.noun, dir.string(), ec.message());
  RunLock lock;
  lock.path_ = dir / what.file;
  const int fd = ::open(lock.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot open the {}'s lock {}: {}", what.noun, lock.path_.string(), std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err != EWOULDBLOCK) fail("cannot lock {}: {}", lock.path_.string(), std::strerror(err));
    const std::string who = describe_holder(dir, what);
    fail("the {} {} is in use by another run: {} holds {}; wait for that run to end, stop it, or {}", what.noun,
         dir.string(), who.empty() ? "a process that has not written its name yet" : who, lock.path_.string(),
         what.remedy);
  }
  lock.fd_ = fd;
  std::random_device rd;
  lock.token_ = fmt::format("{:08x}{:08x}", rd(), rd());
  const std::string line =
      json{{"pid", ::getpid()}, {"host", host_name()}, {"role", role}, {"since", iso_time(now_epoch())}, {"token", lock.token_}}
          .dump() +
      "\n";
  // The holder's name is rewritten in place (the lock stays on the same file).
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != ssize_t(line.size()))
    fail("cannot write {}: {}", lock.path_.string(), std::strerror(errno));
  return lock;
}

RunLock RunLock::acquire_or_join(const fs::path& run_dir, const std::string& role) {
  const char* token = std::getenv("PRIMUS_RUN_LOCK_TOKEN");
  if (token && *token) {
    const fs::path file = run_lock_path(run_dir);
    const json h = read_holder(file);
    if (h.is_object() && h.value("token", "") == token && lock_is_held(file)) {
      RunLock joined;
      joined.joined_ = true;
      joined.token_ = token;
      joined.path_ = file;
      return joined;
    }
  }
  return acquire(run_dir, role);
}

}  // namespace primus::safe
