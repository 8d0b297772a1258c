// Preflight: checks of the machines before a run, each with a status (pass | warn | fail | skip |
// info), rendered as a Markdown and a JSON report.
//   host     CPU model and instruction set, SGEMM speed, memory, open-file and locked-memory
//            limits, clock synchronisation, library versions
//   gpu      via nvidia-smi: count, model, memory, driver, ECC errors, retired pages, clocks,
//            temperature; "skip" when no GPU is present
//   network  (2+ ranks, collective) all-reduce correctness, clock offset between ranks,
//            point-to-point latency and bandwidth for every pair of ranks, all-reduce bus
//            bandwidth like nccl-tests (busbw = algbw * 2(n-1)/n); slow links and ranks named
//   storage  free space, write (fsync'd) and read (page cache dropped) speed of each path,
//            with the data read back verified
// Host, GPU and storage checks run once per node (local rank 0); rank 0 gathers and reports.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::parallel {
class ProcessGroup;
}

namespace primus::safe {

struct CheckResult {
  std::string section;  // host | gpu | network | storage
  std::string name;
  std::string status;   // pass | warn | fail | skip | info
  std::string value;    // the measurement, short
  std::string detail;   // why this status; what to do
  std::string node;
  int rank = -1;
};
nlohmann::json to_json(const CheckResult& c);
CheckResult check_from_json(const nlohmann::json& j);

std::vector<CheckResult> host_checks();

// GPU checks from nvidia-smi's CSV (index, name, memory.total [MiB], driver_version,
// ecc.errors.uncorrected.volatile.total, retired_pages.pending, clocks.sm, clocks.max.sm,
// temperature.gpu), parsed by a pure function so the rules are unit-tested.
std::vector<CheckResult> gpu_checks_from_nvidia_smi(const std::string& csv);
extern const char* const kNvidiaSmiQuery;  // the --query-gpu list that csv answers
std::vector<CheckResult> gpu_checks();

// Storage: each path is created if missing; `bytes` are written, fsynced, read back and checked.
std::vector<CheckResult> storage_checks(const std::vector<std::filesystem::path>& paths, int64_t bytes);

struct NetworkOptions {
  int64_t p2p_bytes = 4 << 20;        // bandwidth message
  int p2p_reps = 10;
  int latency_reps = 200;
  std::vector<int64_t> allreduce_bytes = {1 << 13, 1 << 16, 1 << 19, 1 << 22, 1 << 24};
  int allreduce_reps = 5;
  double slow_factor = 0.5;           // a link or rank below this fraction of the median is slow
  double max_clock_offset_s = 0.1;
};
// Collective over `pg` (every rank calls it). Returns the results on rank 0, nothing elsewhere.
std::vector<CheckResult> network_checks(parallel::ProcessGroup& pg, const NetworkOptions& o);

struct PreflightReport {
  std::vector<CheckResult> checks;
  std::string host, time;
  int world_size = 1;
  int count(const std::string& status) const;
};
std::string render_markdown(const PreflightReport& r);
nlohmann::json render_json(const PreflightReport& r);

// Throws primus::Error when `path` cannot be written as a report (missing or read-only folder,
// a folder in its place): called before any check runs, so nobody waits for a report that is
// then lost.
void check_report_path(const std::filesystem::path& path);

}  // namespace primus::safe
