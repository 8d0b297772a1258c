// The run's event log, <run_dir>/events.jsonl: one JSON object per line, appended by the
// launcher (launch, hang, rank_died, straggler, stack_dump, restart, job_end) and by the ranks
// (nan, loss_spike, step_skipped). `analyze run` reads it back. Each line is written with one
// write(2) on an O_APPEND descriptor, so lines from several processes never interleave.
//
// Fields every event has: time (ISO 8601, UTC), t (seconds since the epoch), source
// ("launcher" or "rank"), kind, severity (info | warn | error), message; optional: rank, ranks,
// iteration, attempt, and kind-specific fields.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::safe {

std::filesystem::path events_path(const std::filesystem::path& run_dir);

// Appends `event` (time, t filled in when missing). Failing to write is reported on stderr, not
// thrown: losing an event must not kill a training run.
void append_event(const std::filesystem::path& run_dir, nlohmann::json event);

// Builds the common fields.
nlohmann::json make_event(const std::string& source, const std::string& kind, const std::string& severity,
                          const std::string& message);

// All events of a run, in file order. Lines that do not parse (a crash in the middle of a write)
// are skipped; `bad_lines` counts them.
std::vector<nlohmann::json> read_events(const std::filesystem::path& run_dir, int* bad_lines = nullptr);

std::string iso_time(double epoch_seconds);  // "2026-01-31T12:00:00.123Z"
double now_epoch();

}  // namespace primus::safe
