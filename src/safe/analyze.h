// Post-mortem of a run folder (<workspace>/<exp_name>): reads events.jsonl, the heartbeats in
// watch/, logs/ (rank logs and the launcher's stderr.log), metrics.jsonl and the snapshot, and
// says what happened: whether it finished, when and why each attempt stopped (hang, crashed rank,
// out of memory, communication timeout, NaN, hardware error, an error in the task), which ranks
// and nodes, the restarts, stragglers, loss spikes and where throughput dropped, with a
// suggestion for each known cause.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::safe {

struct Finding {
  std::string cause;       // hang | crashed_rank | out_of_memory | comm_timeout | nan | hardware | error |
                           // straggler | loss_spike | throughput_drop | interrupted
  std::string title;       // "hang", "crashed rank", ... for people
  std::string detail;      // what the evidence says
  std::vector<int> ranks;
  std::vector<std::string> nodes;
  int64_t iteration = -1;
  int attempt = 0;
  std::string evidence;    // where it was seen (event, log line)
  std::string suggestion;
};

struct RunAnalysis {
  std::string run_dir;
  std::string task;          // from the snapshot
  int world_size = 0;
  std::string status;        // finished | failed | unknown
  int attempts = 0, restarts = 0;
  int64_t last_iteration = -1, train_iters = -1;
  double first_loss = 0, last_loss = 0;
  std::vector<Finding> stops;     // why each attempt that did not finish stopped, in order
  std::vector<Finding> warnings;  // stragglers, loss spikes, skipped NaN steps, throughput drops
  std::vector<std::string> timeline;
  std::string verdict;       // one line
};

// Throws primus::Error when `run_dir` does not exist or is not a run folder.
RunAnalysis analyze_run(const std::filesystem::path& run_dir);
std::string render_text(const RunAnalysis& a);
nlohmann::json to_json(const RunAnalysis& a);

// Log-line classification, shared with the tests: "out_of_memory", "comm_timeout", "hardware",
// "nan" or "" for a line that names none of them.
std::string classify_log_line(const std::string& line);

}  // namespace primus::safe
