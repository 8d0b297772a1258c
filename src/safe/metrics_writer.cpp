#include "safe/metrics_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/bounded_json.h"
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

MetricsFile read_metrics(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) fail("cannot read {}", file.string());
  MetricsFile m;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    ++m.lines;
    nlohmann::json row;
    try {
      row = parse_json(line, fmt::format("{} line {}", file.string(), n));
    } catch (const Error&) {
      m.skipped.push_back({n, "not JSON"});
      continue;
    }
    if (!row.is_object() || !row.contains("iteration") || !row["iteration"].is_number()) {
      m.skipped.push_back({n, "no numeric iteration"});
      continue;
    }
    for (const char* key : {"lm_loss", "eval_lm_loss", "lr", "grad_norm", "tokens_per_sec"})
      if (row.contains(key) && !row[key].is_number())
        m.skipped.push_back({n, row[key].is_null() ? fmt::format("{} is null (NaN or infinite)", key)
                                                   : fmt::format("{} is not a number", key)});
    m.rows.push_back(std::move(row));
  }
  return m;
}

std::string MetricsFile::describe_skipped() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < skipped.size() && i < 5; ++i)
    parts.push_back(fmt::format("line {} {}", skipped[i].line, skipped[i].why));
  if (skipped.size() > 5) parts.push_back(fmt::format("and {} more", skipped.size() - 5));
  return fmt::format("{} of {} lines: {}", skipped.size(), lines, fmt::join(parts, "; "));
}

}  // namespace primus::safe
