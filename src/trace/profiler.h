// The profiler of a training run: Megatron's `profile`, `profile_step_start`, `profile_step_end`
// and `profile_ranks`. Over the steps profile_step_start + 1 .. profile_step_end (as logged,
// i.e. the steps that start after profile_step_start steps have run, as Megatron counts them) it
// records on each selected rank what the rank did, and at the window's end writes one Chrome
// trace per rank to <run dir>/trace/rank-N.json (Perfetto and chrome://tracing load it;
// `analyze trace` reads it; docs/profiling.md describes the format).
//
// What is recorded comes from decorators the trainer puts around what it already has, so that
// neither the model nor the op set knows about tracing:
//   TracedBackend (traced_backend.h)   every op of the op set, with its shapes, FLOPs, bytes,
//                                      layer, module and pass                 category compute
//   TracedProcessGroup (traced_group.h) every collective and point-to-point transfer, with its
//                                      group, bytes, issue time and host wait  communication
//   PassSpans (pass_spans.h)           F / B / W per microbatch and chunk      annotation
//   the trainer's phases               data loading, checkpoint I/O            host
//                                      optimizer, gradient norm (Region)       compute
// Categories are set by whoever records an event, never guessed from names.
//   the device's copy hooks (core/device.h) host <-> device and device <-> device copies,
//                                      wrapped by wrap() for a GPU backend        memcpy
//
// Times. On the CPU every op runs on the calling thread: marks are the host's steady clock. On a
// GPU (clock.h) the ops' marks are CUDA events recorded on the compute stream around each op, and
// the collectives' on their group's communication stream; they are resolved into the host's clock
// at the window's end. When profiling is off nothing is wrapped; on but outside the window, each
// decorated call costs one branch.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/tensor.h"
#include "trace/clock.h"

namespace primus {
class ParamStore;
}
namespace primus::ops {
class Backend;
}
namespace primus::parallel {
class ProcessGroup;
}

namespace primus::trace {

class TracedBackend;

// Chrome trace "cat" values.
enum class Category : uint8_t { Compute, Communication, Memcpy, Host, Annotation };
const char* category_name(Category c);  // "compute", "communication", "memcpy", "host", "annotation"

// The rows ("threads") of a rank's trace. Communication gets one row per group and lane (a
// group with several transfers in flight, e.g. gradient buckets, spreads them over lanes).
enum class Track : uint8_t { Compute, Communication, Host, Passes };

// The pass an op belongs to (the model's explicit passes, docs/architecture.md).
enum class Pass : uint8_t { None, F, B, W };
const char* pass_name(Pass p);  // "", "F", "B", "W"

// What an op of the op set does, which decides its pass inside a fused backward (B and W of a
// layer run back to back) and marks forward ops re-run inside a backward as recompute.
enum class OpKind : uint8_t { Forward, Backward, WeightGrad, Other };

constexpr Mark kNoMark = UINT32_MAX;

// One recorded interval. Strings that repeat (op names, modules, groups) are literals or interned.
struct Event {
  const char* name = "";
  Category cat = Category::Compute;
  Track track = Track::Compute;
  Mark begin = 0, end = 0;
  Mark begin2 = kNoMark;  // a second start: the interval starts at the later of begin and begin2
  std::string label;  // annotation spans: "F mb 3 chunk 0"; empty: name
  // compute ops
  OpKind kind = OpKind::Other;
  Pass pass = Pass::None;
  bool recompute = false;         // a forward op re-run inside a backward pass
  int layer = -1;                 // decoder layer, -1 for none
  const std::string* module = nullptr;  // "linear_qkv", "output_layer", "head", ...
  DType dtype = DType::F32;
  int64_t dims[4] = {0, 0, 0, 0};  // gemm: M, N, K (and the problems of a grouped one); attention: batch, seq, heads, head_dim; else rows, cols
  double flops = 0, bytes = 0;
  // communication
  const std::string* group = nullptr;  // "tp", "dp", "pp", "mp", "embedding"
  std::string group_ranks;             // "0,1"
  int group_size = 0;
  int64_t seq = -1;                     // index of this op among the group's collectives (for matching ranks)
  int peer = -1;                        // p2p: the peer's rank in the group
  double wait_us = 0;                   // host time blocked waiting for it
  Mark issue = 0;                       // host time it was issued
  // annotation spans
  int microbatch = -1, chunk = -1;
  int64_t step = -1;
  bool region = false;    // a part of a compute region
  bool fused_bw = false;  // a span of a fused backward (B and W together)
};

struct ProfileOptions {
  bool enabled = false;
  int64_t step_start = 10, step_end = 12;  // Megatron's defaults
  std::vector<int64_t> ranks = {0};
  int64_t last_step = 0;  // the run's last iteration (train_iters): a window past it ends there
};

// What the trace says about the run, beside the events ("otherData" in the file).
struct RunInfo {
  int rank = 0, world_size = 1;
  int tp = 1, pp = 1, dp = 1, cp = 1, vpp = 1;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
  std::string host, device, precision, model, schedule;
  int64_t micro_batch_size = 1, seq_length = 0, microbatches_per_rank = 1, global_batch_size = 1;
  std::vector<int64_t> stage_layers;  // layers per pipeline stage, in stage order
  double peak_tflops = 0;             // the device's dense peak (MFU's denominator)
  double memory_bandwidth_gbs = 0;    // the device's memory bandwidth (the roofline's slope)
  std::string bandwidth_source;       // "data sheet" or "measured"
};

class Profiler {
 public:
  // world: a host group of every rank (the window's start is a barrier over it, the clock
  // reference of all ranks). this rank records when it is listed in options.ranks.
  Profiler(const ProfileOptions& options, parallel::ProcessGroup& world, std::filesystem::path trace_dir,
           std::unique_ptr<Clock> clock);
  ~Profiler();

  // Whether events are being recorded now (inside the window, on a profiled rank).
  bool active() const { return active_; }
  bool records_this_rank() const { return selected_; }
  Clock& clock() { return *clock_; }
  RunInfo& info() { return info_; }

  // The backend decorator (traced_backend.h), owned here: the run's ops go through it. For a
  // device backend it also wraps the device's copy hooks (one profiler per process at a time;
  // the destructor puts them back), so that copies are memcpy events.
  ops::Backend& wrap(ops::Backend& backend);
  // Parameter pointers -> layer and module, for ops that read weights or write gradients.
  void set_parameters(const ParamStore& params, const Tensor& working_weights);

  // Steps: `iteration` is the step about to run, 1-based as logged. Collective over the world at
  // the window's start (every rank calls them, profiled or not); at the window's end the trace is
  // written and the file returned.
  void step_begin(int64_t iteration);
  std::filesystem::path step_end(int64_t iteration);

  // ---- recording (no-ops unless active()) ----
  // A compute op of the op set: the decorator marks its start, runs it, takes the end mark
  // (clock().device(nullptr)), fills the event's details, then calls op_end.
  Event& op_begin(const char* name);
  void op_end(Event& e, Mark end);
  // Layer and module of a weight (or gradient) pointer, -1 / nullptr when it is neither.
  void resolve(const void* ptr, int& layer, const std::string*& module) const;

  // A communication op (traced_group.h): issued (interrupts a region until issued() returns),
  // then completed when it is known to be done; the event is the caller's until then. `stream`:
  // the group's communication stream on a GPU, nullptr on the host.
  std::unique_ptr<Event> comm_issue(const char* name, void* stream);
  void comm_issued() { resume_region(); }
  void comm_complete(std::unique_ptr<Event> e, void* stream);

  // A copy through the device's hooks (memcpy_hooks in profiler.cpp): "memcpy HtoD", "memcpy
  // DtoH", "memcpy DtoD"; inside an op of the op set it nests in the op's interval.
  Event& copy_begin(const char* name, double bytes);
  void copy_end(Event& e);

  // Annotation spans (F/B/W, phases) and host spans (data loading, checkpoint I/O). A pass span
  // with fused_bw holds a whole backward: its ops are B or W by their kind.
  void span_begin(Category cat, const char* name, std::string label, Pass pass = Pass::None, int microbatch = -1,
                  int chunk = -1, bool fused_bw = false);
  void span_end();
  // A compute region (optimizer, gradient norm): host-driven work that is not an op of the op
  // set. Ops and communication inside it split it, so that it never covers them.
  void region_begin(const char* name);
  void region_end();
  // Called by the decorators around what interrupts a region.
  void interrupt_region();
  void resume_region();

  Pass current_pass() const { return pass_; }
  const std::string* intern(const std::string& s);

  // The Chrome trace of what was recorded (events resolved to host microseconds).
  nlohmann::json to_chrome_json();

 private:
  struct Open {
    Category cat;
    const char* name;
    std::string label;
    Pass pass;
    int microbatch, chunk;
    Mark begin;
  };
  void close_layer();
  void note_layer(const Event& op);
  std::filesystem::path write();

  ProfileOptions opt_;
  parallel::ProcessGroup& world_;
  std::filesystem::path dir_;
  std::unique_ptr<Clock> clock_;
  RunInfo info_;
  bool selected_ = false, active_ = false, started_ = false;
  int64_t step_ = -1;
  double sync_us_ = 0;
  std::deque<Event> events_;  // stable addresses: op_begin hands out references
  std::vector<std::unique_ptr<Event>> comm_;  // completed communication events
  std::vector<Open> spans_;
  Pass pass_ = Pass::None;
  bool fused_bw_ = false;
  int microbatch_ = -1, chunk_ = -1;
  // The layer span being built from the ops of the current pass.
  int layer_ = -2;
  const std::string* layer_module_ = nullptr;
  Mark layer_begin_ = 0, layer_end_ = 0;
  // The open region and its current segment.
  const char* region_ = nullptr;
  int region_depth_ = 0;  // interruptions in progress
  Mark region_begin_ = 0;
  std::vector<std::unique_ptr<std::string>> strings_;
  struct ParamRange {
    uintptr_t begin, end;
    int layer;
    const std::string* module;
  };
  std::vector<ParamRange> ranges_;  // sorted by begin
  std::unique_ptr<TracedBackend> backend_;
  bool wrapped_copies_ = false;
  Device copy_device_ = Device::CPU;
};

// RAII helpers that accept a null profiler (profiling off): the trainer writes one line each.
class Span {
 public:
  Span(Profiler* p, Category cat, const char* name, std::string label = {});
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Profiler* p_;
};

class Region {
 public:
  Region(Profiler* p, const char* name);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

 private:
  Profiler* p_;
};

class PassSpan {
 public:
  PassSpan(Profiler* p, Pass pass, int microbatch, int chunk, bool fused_bw = false);
  ~PassSpan();
  PassSpan(const PassSpan&) = delete;
  PassSpan& operator=(const PassSpan&) = delete;

 private:
  Profiler* p_;
};

// `fn` (any callable) inside a host span `name` on each call: e.g. the data loading of a step.
template <typename Fn>
auto in_host_span(Profiler* p, const char* name, Fn fn) {
  return [p, name, fn = std::move(fn)](auto&&... args) {
    Span s(p, Category::Host, name);
    return fn(std::forward<decltype(args)>(args)...);
  };
}

// The trace file of a rank under a run folder.
std::filesystem::path trace_file(const std::filesystem::path& run_dir, int rank);

}  // namespace primus::trace
