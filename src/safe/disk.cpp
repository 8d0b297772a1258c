#include "safe/disk.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"

namespace fs = std::filesystem;

namespace primus::safe {

uint64_t free_bytes(const std::string& path) {
  fs::path p = path.empty() ? fs::path(".") : fs::path(path);
  std::error_code ec;
  // The file or folder may not exist yet: ask the nearest parent that does.
  while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0)
    fail("cannot read the free space of the file system holding {}: {}", path, std::strerror(errno));
  return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
}

void require_free(const std::string& path, uint64_t bytes, const std::string& what) {
  uint64_t avail = 0;
  if (const char* fake = std::getenv("PRIMUS_FAULT_DISK_FREE"))
    avail = std::strtoull(fake, nullptr, 10);
  else
    avail = free_bytes(path);
  if (avail < bytes)
    fail("not enough disk space for {} {}: it needs {} bytes ({}), the file system has {} bytes ({}) free", what,
         path, bytes, human_bytes(bytes), avail, human_bytes(avail));
}

void fail_write(const std::string& path, int err, uint64_t bytes_needed) {
  fail("cannot write {}: {}{} ({} more bytes needed)", path, std::strerror(err),
       err == ENOSPC || err == EDQUOT ? " (the disk or quota is full)" : "", bytes_needed);
}

}  // namespace primus::safe
