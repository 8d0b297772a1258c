#include "safe/metrics_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "safe/disk.h"

namespace primus::safe {

MetricsWriter::MetricsWriter(std::string path, uint64_t reserve_bytes) : path_(std::move(path)), reserve_(reserve_bytes) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot open {} for writing: {}", path_, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const nlohmann::json& row) { write_line(row.dump()); }

void MetricsWriter::write_line(const std::string& line) {
  append(line.empty() || line.back() != '\n' ? line + "\n" : line);
}

void MetricsWriter::append(const std::string& text) {
  require_free(path_, text.size() + reserve_, "metrics");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      // A partial row would be a malformed line: cut it off again where it began (best effort).
      if (done > 0 && ::ftruncate(fd_, off_t(::lseek(fd_, 0, SEEK_END)) - off_t(done)) != 0) {
      }
      fail_write(path_, err, text.size() - done);
    }
    done += size_t(n);
  }
  written_ += text.size();
}

void MetricsWriter::sync() {
  if (::fsync(fd_) != 0) fail_write(path_, errno, 0);
}

}  // namespace primus::safe
