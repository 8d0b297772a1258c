// metrics.jsonl (or any append-only log of rows) written so that a full disk or another write
// error ends the run with an error naming the file and the bytes needed, instead of a file left
// silently short or empty while the run reports success.
//
//   safe::MetricsWriter metrics(run_dir / "metrics.jsonl");   // rank 0 only
//   metrics.write(row);                                       // one JSON object per line
//
// Each row is one write(2) on a file opened O_APPEND, after a check that the file system has the
// row's bytes plus a reserve free (PRIMUS_FAULT_DISK_FREE overrides the free space for tests).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::safe {

class MetricsWriter {
 public:
  // Opens `path` for appending (creating it); throws primus::Error when it cannot. A write needs
  // `reserve_bytes` free beyond the row itself, so that the run stops before the disk is full
  // (and checkpoints, which check their own size, can still tell why).
  explicit MetricsWriter(std::string path, uint64_t reserve_bytes = uint64_t(1) << 20);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const nlohmann::json& row);  // row.dump() + "\n"
  void write_line(const std::string& line);  // adds "\n" when missing
  // Appends `bytes` as they are (binary records: TensorBoard's event files, event_file.h), in one
  // piece: a write cut short by a full disk is cut off again where it began.
  void append(const std::string& bytes);
  // fsync: the rows written so far survive a crash of the machine.
  void sync();

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::string path_;
  uint64_t reserve_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// metrics.jsonl read back (analyze run, its curves): the rows, and every line that was passed
// over with the reason, so that a reader can say what it did not use. A line is passed over when it
// is not a JSON object with a numeric "iteration" (a row cut short by a crash, garbage); a row is
// kept but its value not used when one of the curves' keys (lm_loss, eval_lm_loss, lr, grad_norm,
// tokens_per_sec) is not a number (a NaN or infinite value, which JSON writes as null).
struct MetricsFile {
  struct Skipped {
    int64_t line = 0;  // 1-based
    std::string why;   // "not JSON", "no numeric iteration", "lm_loss is null (NaN or infinite)"
  };
  std::vector<nlohmann::json> rows;  // in file order
  std::vector<Skipped> skipped;
  int64_t lines = 0;  // non-empty lines
  // "2 of 40 lines: line 5 not JSON; line 9 lm_loss is null (NaN or infinite)" (the first few).
  std::string describe_skipped() const;
};
// Throws primus::Error when the file cannot be read.
MetricsFile read_metrics(const std::filesystem::path& file);

}  // namespace primus::safe
