// `analyze trace`: TraceLens's tables over the Chrome traces a profiled run writes (profiler.h),
// with TraceLens's definitions (docs/profiling.md has them in full):
//   timeline      per rank, over the device's events (categories compute, communication, memcpy;
//                 host and annotation events are not device work): each category's intervals
//                 merged, then
//                   computation    = |COMP|
//                   exposed comm   = |COMM - COMP|
//                   exposed memcpy = |MEMCPY - COMP - COMM|
//                   busy           = |ALL|,  total = last end - first start,  idle = total - busy
//                 so computation + exposed comm + exposed memcpy + idle = total exactly;
//   ops           time (sum of durations), count, percent of the sum over all ops, cumulative
//                 percent; by op name and by op category (GEMM, SDPA_fwd, SDPA_bwd, norm, ...);
//   gemms         per shape: count, time, TFLOP/s, FLOPs per byte (A, B and D moved once), and
//                 the share of the roofline min(peak, FLOPs per byte x memory bandwidth) of the
//                 device the trace was recorded on;
//   collectives   each collective matched across ranks by group and index: its latency is the
//                 shortest duration over ranks (the others include waiting), a rank's wait is
//                 the latest start minus its own; per (op, group, size): count, time, algorithm
//                 and bus bandwidth (nccl-tests' factors); per rank the waits, and the straggler
//                 (the rank that arrives last most often);
//   pipeline      per rank the measured bubble (wall - F/B/W time) / wall of each step, beside
//                 the schedule simulator's prediction from the measured F, B and W times.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::trace {

// One "X" event of a trace, as read back.
struct TraceEvent {
  std::string name, cat, op;  // op: args.op, else name
  double ts = 0, end = 0;     // microseconds, aligned across ranks
  int tid = 0;
  std::string pass, module, group, group_ranks, dtype;
  int layer = -1, microbatch = -1, chunk = -1, peer = -1, group_size = 0;
  int64_t step = -1, seq = -1, M = 0, N = 0, K = 0;
  double flops = 0, bytes = 0, wait_us = 0;
  bool recompute = false;
  double dur() const { return end - ts; }
};

struct RankTrace {
  std::string file;
  int rank = 0;
  nlohmann::json info;  // the trace's otherData
  std::vector<TraceEvent> events;
};

// Reads a run folder (its trace/*.json), a folder of traces, or trace files. Throws primus::Error
// naming the path when nothing is found or a file is not a trace this project wrote.
std::vector<RankTrace> load_traces(const std::vector<std::string>& paths);
// The events of a parsed trace (for tests and tools that build traces in memory).
RankTrace parse_trace(const nlohmann::json& trace, const std::string& file = "");

struct Interval {
  double begin, end;
};
// Sorted, merged; the difference a - b; the total length.
std::vector<Interval> merge(std::vector<Interval> v);
std::vector<Interval> subtract(const std::vector<Interval>& a, const std::vector<Interval>& b);
double length(const std::vector<Interval>& v);

struct Timeline {
  double total_ms = 0, computation_ms = 0, exposed_comm_ms = 0, exposed_memcpy_ms = 0, idle_ms = 0;
  double busy_ms = 0, total_comm_ms = 0, total_memcpy_ms = 0;
};
Timeline timeline_of(const std::vector<TraceEvent>& events);

struct OpRow {
  std::string name, category;
  double time_ms = 0;
  int64_t count = 0;
  double percent = 0, cumulative_percent = 0;
};

struct GemmRow {
  int64_t M = 0, N = 0, K = 0;
  std::string dtype, modules, passes;
  int64_t count = 0;
  double time_ms = 0, mean_us = 0, tflops = 0, flops_per_byte = 0, roofline_tflops = 0, roofline_percent = 0;
  std::string bound;  // "compute" or "memory": which side of the roofline's knee
};

struct CollectiveRow {
  std::string op, group, dtype, algorithm;
  int group_size = 0;
  double bytes = 0;
  int64_t count = 0;
  double time_ms = 0, mean_latency_us = 0, algbw_gbs = 0, busbw_gbs = 0, mean_wait_us = 0;
  int ranks = 0;  // ranks the op was seen on
};

struct RankWait {
  int rank = 0;
  int64_t collectives = 0, times_last = 0, times_first = 0;
  double total_wait_ms = 0, mean_wait_us = 0, total_comm_ms = 0;
};

struct LayerRow {
  std::string pass, where;  // "F", "layer 3" / "embedding" / "head"
  int64_t count = 0;
  double mean_ms = 0, time_ms = 0;
};

struct PipelineRank {
  int rank = 0, pp_rank = 0;
  double wall_ms = 0, busy_ms = 0, bubble = 0;  // per step, means over steps
  double f_ms = 0, b_ms = 0, w_ms = 0;          // mean per op (one chunk)
  int64_t ops = 0;
};

struct PipelineReport {
  std::string schedule;
  int pp = 1, vpp = 1, microbatches = 1;
  std::vector<PipelineRank> ranks;
  double measured_bubble = 0;   // (slowest rank's wall - busiest rank's F/B/W time) / slowest wall
  double simulated_bubble = -1; // the simulator on the same schedule with the measured times; -1 when it could not run
  std::string note;
};

struct TraceReport {
  std::vector<int> ranks;
  int64_t steps = 0;
  std::string device;
  double peak_tflops = 0, memory_bandwidth_gbs = 0;
  Timeline mean;                    // over ranks
  std::vector<Timeline> per_rank;   // parallel to ranks
  std::vector<OpRow> ops, categories;
  std::vector<GemmRow> gemms;
  std::vector<CollectiveRow> collectives;
  std::vector<RankWait> waits;
  int straggler = -1;  // -1: fewer than two ranks
  std::vector<LayerRow> layers;
  std::optional<PipelineReport> pipeline;
};

TraceReport analyze(const std::vector<RankTrace>& traces);

// TraceLens's op category of an op name.
std::string op_category(const std::string& op, const std::string& cat);
// nccl-tests' bus-bandwidth factor for `op` over n ranks: all_reduce 2(n-1)/n; reduce_scatter,
// all_gather, all_to_all (n-1)/n; broadcast and point-to-point 1.
double bus_factor(const std::string& op, int n);

// ---- output ----
struct Table {
  std::string name, title;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};
std::vector<Table> report_tables(const TraceReport& r);
nlohmann::ordered_json report_json(const TraceReport& r);
// Two runs op by op: the timeline and every op and GEMM shape side by side.
std::vector<Table> diff_tables(const TraceReport& a, const TraceReport& b);
nlohmann::ordered_json diff_json(const TraceReport& a, const TraceReport& b);
// format: text | markdown | csv.
std::string render(const std::vector<Table>& tables, const std::string& format);
// One step of every rank as an SVG timeline: a row per rank and track, F / B / W / other compute,
// communication and host work in their colours. step -1: the first profiled step.
std::string timeline_svg(const std::vector<RankTrace>& traces, int64_t step = -1);

}  // namespace primus::trace
