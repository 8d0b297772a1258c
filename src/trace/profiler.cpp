#include "trace/profiler.h"

#include <algorithm>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "core/device.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "model/param_store.h"
#include "parallel/process_group.h"
#include "trace/traced_backend.h"

namespace fs = std::filesystem;

namespace primus::trace {

const char* category_name(Category c) {
  switch (c) {
    case Category::Compute: return "compute";
    case Category::Communication: return "communication";
    case Category::Memcpy: return "memcpy";
    case Category::Host: return "host";
    case Category::Annotation: return "annotation";
  }
  return "?";
}

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::None: return "";
    case Pass::F: return "F";
    case Pass::B: return "B";
    case Pass::W: return "W";
  }
  return "?";
}

fs::path trace_file(const fs::path& run_dir, int rank) {
  return run_dir / "trace" / fmt::format("rank-{}.json", rank);
}

Profiler::Profiler(const ProfileOptions& options, parallel::ProcessGroup& world, fs::path trace_dir,
                   std::unique_ptr<Clock> clock)
    : opt_(options), world_(world), dir_(std::move(trace_dir)), clock_(std::move(clock)) {
  if (opt_.step_start < 0 || opt_.step_end <= opt_.step_start)
    fail("profile_step_end ({}) must be greater than profile_step_start ({}), which must not be negative",
         opt_.step_end, opt_.step_start);
  for (int64_t r : opt_.ranks)
    if (r < 0 || r >= world.size())
      fail("profile_ranks lists rank {}, but the run has {} ranks (0 .. {})", r, world.size(), world.size() - 1);
  selected_ = opt_.enabled && std::find(opt_.ranks.begin(), opt_.ranks.end(), int64_t(world.rank())) != opt_.ranks.end();
  info_.rank = world.rank();
  info_.world_size = world.size();
  info_.host = host_name();
}

namespace {

// The device's copy hooks are plain function pointers: the wrapped ones find the profiler here.
Profiler* g_copy_profiler = nullptr;
DeviceHooks g_device_hooks;  // the hooks the profiler wrapped, called by the wrappers

const char* copy_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::HostToDevice: return "memcpy HtoD";
    case CopyKind::DeviceToHost: return "memcpy DtoH";
    case CopyKind::DeviceToDevice: return "memcpy DtoD";
  }
  return "memcpy";
}

void traced_copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  Profiler* p = g_copy_profiler;
  if (!p || !p->active()) return g_device_hooks.copy(dst, src, bytes, kind);
  Event& e = p->copy_begin(copy_name(kind), double(bytes));
  g_device_hooks.copy(dst, src, bytes, kind);
  p->copy_end(e);
}

void traced_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  Profiler* p = g_copy_profiler;
  if (!p || !p->active()) return g_device_hooks.copy_2d(dst, dpitch, src, spitch, width, rows);
  Event& e = p->copy_begin("memcpy DtoD", double(width) * double(rows));
  g_device_hooks.copy_2d(dst, dpitch, src, spitch, width, rows);
  p->copy_end(e);
}

}  // namespace

Profiler::~Profiler() {
  if (wrapped_copies_) {
    register_device_hooks(copy_device_, g_device_hooks);
    g_copy_profiler = nullptr;
  }
}

ops::Backend& Profiler::wrap(ops::Backend& backend) {
  backend_ = std::make_unique<TracedBackend>(backend, *this);
  const Device d = backend.device();
  if (d != Device::CPU && !wrapped_copies_ && !g_copy_profiler && device_registered(d)) {
    g_device_hooks = device_hooks(d);
    DeviceHooks traced = g_device_hooks;
    if (traced.copy) traced.copy = traced_copy;
    if (traced.copy_2d) traced.copy_2d = traced_copy_2d;
    register_device_hooks(d, traced);
    g_copy_profiler = this;
    wrapped_copies_ = true;
    copy_device_ = d;
  }
  return *backend_;
}

Event& Profiler::copy_begin(const char* name, double bytes) {
  interrupt_region();
  Event& e = events_.emplace_back();
  e.name = name;
  e.cat = Category::Memcpy;
  e.bytes = bytes;
  e.begin = clock_->device(nullptr);
  return e;
}

void Profiler::copy_end(Event& e) {
  e.end = clock_->device(nullptr);
  e.microbatch = microbatch_;
  e.chunk = chunk_;
  e.pass = pass_;
  resume_region();
}

const std::string* Profiler::intern(const std::string& s) {
  for (const auto& p : strings_)
    if (*p == s) return p.get();
  strings_.push_back(std::make_unique<std::string>(s));
  return strings_.back().get();
}

// "decoder.layers.3.self_attention.linear_qkv.weight" -> layer 3, module "linear_qkv".
void Profiler::set_parameters(const ParamStore& params, const Tensor& working_weights) {
  ranges_.clear();
  const size_t esize = dtype_size(params.dtype()), wsize = dtype_size(working_weights.dtype());
  for (const StoredParam& p : params.infos()) {
    int layer = -1;
    std::string module;
    if (p.name.rfind("decoder.layers.", 0) == 0) {
      layer = std::stoi(p.name.substr(15));
      const std::string rest = p.name.substr(p.name.find('.', 15) + 1);
      const size_t last = rest.rfind('.');
      const size_t before = rest.rfind('.', last - 1);
      module = rest.substr(before == std::string::npos ? 0 : before + 1, last - (before == std::string::npos ? 0 : before + 1));
    } else if (p.name.rfind("embedding.", 0) == 0) {
      module = "word_embeddings";
    } else if (p.name.rfind("output_layer", 0) == 0) {
      module = "output_layer";
    } else {
      module = "final_layernorm";
    }
    const std::string* m = intern(module);
    auto add = [&](const void* base, size_t size) {
      const uintptr_t b = reinterpret_cast<uintptr_t>(base) + uintptr_t(p.offset) * size;
      ranges_.push_back({b, b + uintptr_t(p.numel) * size, layer, m});
    };
    add(working_weights.raw(), wsize);
    if (working_weights.raw() != params.values().raw()) add(params.values().raw(), esize);
    add(params.grads().raw(), esize);
  }
  std::sort(ranges_.begin(), ranges_.end(), [](const ParamRange& a, const ParamRange& b) { return a.begin < b.begin; });
}

void Profiler::resolve(const void* ptr, int& layer, const std::string*& module) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), p,
                             [](uintptr_t v, const ParamRange& r) { return v < r.begin; });
  if (it == ranges_.begin()) return;
  --it;
  if (p >= it->end) return;
  layer = it->layer;
  module = it->module;
}

// ---------------------------------------------------------------------------------------------
// Window

void Profiler::step_begin(int64_t iteration) {
  if (!opt_.enabled) return;
  if (!started_ && iteration > opt_.step_start && iteration <= opt_.step_end) {
    started_ = true;
    world_.barrier();  // every rank: the common reference of the ranks' clocks
    if (selected_) {
      clock_->start_window();
      sync_us_ = host_now_us();
      active_ = true;
    }
  }
  if (!active_) return;
  step_ = iteration;
  span_begin(Category::Annotation, "step", fmt::format("step {}", iteration));
}

fs::path Profiler::step_end(int64_t iteration) {
  if (!active_) return {};
  span_end();
  const int64_t last = opt_.last_step > 0 ? std::min(opt_.step_end, opt_.last_step) : opt_.step_end;
  if (iteration < last) return {};
  active_ = false;
  return write();
}

// ---------------------------------------------------------------------------------------------
// Recording

Event& Profiler::op_begin(const char* name) {
  interrupt_region();
  Event& e = events_.emplace_back();
  e.name = name;
  e.begin = clock_->device(nullptr);
  return e;
}

void Profiler::op_end(Event& e, Mark end) {
  e.end = end;
  e.microbatch = microbatch_;
  e.chunk = chunk_;
  if (pass_ != Pass::None) {
    if (fused_bw_) e.pass = e.kind == OpKind::WeightGrad ? Pass::W : Pass::B;
    else e.pass = pass_;
    e.recompute = e.pass != Pass::F && e.kind == OpKind::Forward;
    note_layer(e);
  }
  resume_region();
}

// Layer spans: consecutive ops of one pass on the same layer (or the embedding, or the head). Ops
// without weights (attention, SwiGLU, RoPE, the cross-entropy) belong to the layer they run in.
void Profiler::note_layer(const Event& op) {
  int key = layer_;
  const std::string* where = layer_module_;
  if (op.layer >= 0) {
    key = op.layer;
    where = nullptr;
  } else if (op.module && *op.module == "word_embeddings" && std::string(op.name) != "gemm") {
    key = -10;
    where = intern("embedding");
  } else if (op.module && (*op.module == "output_layer" || *op.module == "final_layernorm" ||
                           *op.module == "word_embeddings")) {
    key = -20;
    where = intern("head");
  }
  if (key != layer_ || where != layer_module_) {
    close_layer();
    layer_ = key;
    layer_module_ = where;
    layer_begin_ = op.begin;
  }
  layer_end_ = op.end;
  const_cast<Event&>(op).layer = op.layer >= 0 ? op.layer : key >= 0 ? key : -1;
}

void Profiler::close_layer() {
  if (layer_ != -2 && (layer_ >= 0 || layer_module_)) {
    Event& e = events_.emplace_back();
    e.name = "layer";
    e.cat = Category::Annotation;
    e.track = Track::Passes;
    e.begin = layer_begin_;
    e.end = layer_end_;
    e.pass = pass_;
    e.fused_bw = fused_bw_;
    e.layer = layer_ >= 0 ? layer_ : -1;
    e.module = layer_module_;
    e.microbatch = microbatch_;
    e.chunk = chunk_;
    e.step = step_;
    e.label = layer_ >= 0 ? fmt::format("{} layer {}", fused_bw_ ? "BW" : pass_name(pass_), layer_)
                          : fmt::format("{} {}", fused_bw_ ? "BW" : pass_name(pass_), *layer_module_);
  }
  layer_ = -2;
  layer_module_ = nullptr;
}

std::unique_ptr<Event> Profiler::comm_issue(const char* name, void* stream) {
  interrupt_region();
  auto e = std::make_unique<Event>();
  e->name = name;
  e->cat = Category::Communication;
  e->track = Track::Communication;
  e->issue = clock_->host();
  if (stream) {
    e->begin = clock_->device(stream);   // the communication stream is free
    e->begin2 = clock_->device(nullptr);  // the compute stream reached the op (its input is ready)
  } else {
    e->begin = clock_->host();
  }
  e->microbatch = microbatch_;
  e->chunk = chunk_;
  e->pass = fused_bw_ ? Pass::None : pass_;
  e->layer = layer_ >= 0 ? layer_ : -1;
  return e;
}

void Profiler::comm_complete(std::unique_ptr<Event> e, void* stream) {
  if (!active_) return;  // issued in the window, finished after it
  e->end = stream ? clock_->device(stream) : clock_->host();
  comm_.push_back(std::move(e));
}

void Profiler::span_begin(Category cat, const char* name, std::string label, Pass pass, int microbatch, int chunk,
                          bool fused_bw) {
  if (!active_) return;
  const Mark m = cat == Category::Host ? clock_->host() : clock_->device(nullptr);
  spans_.push_back({cat, name, std::move(label), pass, microbatch, chunk, m});
  if (pass != Pass::None) {
    close_layer();
    pass_ = pass;
    fused_bw_ = fused_bw;
    microbatch_ = microbatch;
    chunk_ = chunk;
  }
}

void Profiler::span_end() {
  if (!active_ || spans_.empty()) return;
  Open o = std::move(spans_.back());
  spans_.pop_back();
  if (o.pass != Pass::None) close_layer();
  Event& e = events_.emplace_back();
  e.name = o.name;
  e.cat = o.cat;
  e.track = o.cat == Category::Host ? Track::Host : o.cat == Category::Compute ? Track::Compute : Track::Passes;
  e.begin = o.begin;
  e.end = o.cat == Category::Host ? clock_->host() : clock_->device(nullptr);
  e.label = std::move(o.label);
  e.pass = o.pass;
  e.fused_bw = o.pass != Pass::None && fused_bw_;
  e.microbatch = o.microbatch;
  e.chunk = o.chunk;
  e.step = step_;
  if (o.pass != Pass::None) {
    pass_ = Pass::None;
    fused_bw_ = false;
    microbatch_ = chunk_ = -1;
  }
}

void Profiler::region_begin(const char* name) {
  if (!active_) return;
  region_ = name;
  region_depth_ = 0;
  region_begin_ = clock_->device(nullptr);
}

void Profiler::region_end() {
  if (!active_ || !region_) return;
  interrupt_region();
  region_ = nullptr;
  region_depth_ = 0;
}

void Profiler::interrupt_region() {
  if (!region_ || region_depth_++ > 0) return;
  Event& e = events_.emplace_back();
  e.name = region_;
  e.cat = Category::Compute;
  e.track = Track::Compute;
  e.region = true;
  e.begin = region_begin_;
  e.end = clock_->device(nullptr);
  e.step = step_;
}

void Profiler::resume_region() {
  if (!region_ || --region_depth_ > 0) return;
  region_depth_ = 0;
  region_begin_ = clock_->device(nullptr);
}

// ---------------------------------------------------------------------------------------------
// Writing

nlohmann::json Profiler::to_chrome_json() {
  const std::vector<double> us = clock_->resolve();
  auto at = [&](Mark m) { return us.at(m); };
  auto start_of = [&](const Event& e) { return e.begin2 == kNoMark ? at(e.begin) : std::max(at(e.begin), at(e.begin2)); };
  const int pid = info_.rank;
  nlohmann::json events = nlohmann::json::array();
  std::map<int, std::string> threads = {{0, "compute"}, {1, "host"}, {2, "passes"}};
  auto tid_of = [](Track t) { return t == Track::Compute ? 0 : t == Track::Host ? 1 : 2; };

  auto base = [&](const Event& e, int tid, double ts, double te) {
    nlohmann::json j = {{"name", e.name},
                        {"cat", category_name(e.cat)},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", ts},
                        {"dur", std::max(0.0, te - ts)}};
    if (!e.label.empty()) j["name"] = e.label;
    return j;
  };
  for (const Event& e : events_) {
    const double ts = start_of(e), te = at(e.end);
    if (e.region && te <= ts) continue;  // an empty part of a region
    nlohmann::json j = base(e, tid_of(e.track), ts, te);
    nlohmann::json a = nlohmann::json::object();
    if (e.cat == Category::Compute) {
      a["op"] = e.name;
      if (e.pass != Pass::None) a["pass"] = pass_name(e.pass);
      if (e.recompute) a["recompute"] = true;
      if (e.layer >= 0) a["layer"] = e.layer;
      if (e.module) a["module"] = *e.module;
      if (e.flops > 0 || e.bytes > 0) {
        a["dtype"] = dtype_name(e.dtype);
        a["flops"] = e.flops;
        a["bytes"] = e.bytes;
      }
      if (std::string(e.name) == "gemm") {
        a["M"] = e.dims[0];
        a["N"] = e.dims[1];
        a["K"] = e.dims[2];
        if (e.dims[3] > 0) a["groups"] = e.dims[3];  // a grouped GEMM (MoE experts)
      } else if (e.dims[0] > 0) {
        nlohmann::json shape = nlohmann::json::array();
        for (int64_t d : e.dims)
          if (d > 0) shape.push_back(d);
        a["shape"] = shape;
      }
    } else if (e.cat == Category::Memcpy) {
      a["op"] = e.name;
      a["bytes"] = e.bytes;
      if (e.pass != Pass::None) a["pass"] = pass_name(e.pass);
    } else {
      a["op"] = e.name;
      if (e.pass != Pass::None) a["pass"] = e.fused_bw ? "BW" : pass_name(e.pass);
      if (e.layer >= 0) a["layer"] = e.layer;
      if (e.module) a["module"] = *e.module;
    }
    if (e.microbatch >= 0) a["microbatch"] = e.microbatch;
    if (e.chunk >= 0) a["chunk"] = e.chunk;
    if (e.step >= 0) a["step"] = e.step;
    j["args"] = a;
    events.push_back(std::move(j));
  }
  // Communication: one row per group, more where transfers overlap (lanes).
  std::map<std::string, std::vector<double>> lanes;  // group -> end of each lane's last op
  std::map<std::pair<std::string, int>, int> tids;
  std::vector<const Event*> comm;
  for (const auto& e : comm_) comm.push_back(e.get());
  std::sort(comm.begin(), comm.end(), [&](const Event* a, const Event* b) { return start_of(*a) < start_of(*b); });
  for (const Event* e : comm) {
    const double ts = start_of(*e), te = std::max(at(e->end), ts);
    const std::string g = e->group ? *e->group : "?";
    auto& ends = lanes[g];
    int lane = 0;
    while (lane < int(ends.size()) && ends[size_t(lane)] > ts) ++lane;
    if (lane == int(ends.size())) ends.push_back(te);
    else ends[size_t(lane)] = te;
    auto key = std::make_pair(g, lane);
    if (!tids.count(key)) {
      const int tid = 10 + int(tids.size());
      tids[key] = tid;
      threads[tid] = lane == 0 ? "communication " + g : fmt::format("communication {} #{}", g, lane + 1);
    }
    nlohmann::json j = base(*e, tids[key], ts, te);
    nlohmann::json a = {{"op", e->name},       {"group", g},          {"group_ranks", e->group_ranks},
                        {"group_size", e->group_size}, {"bytes", e->bytes}, {"dtype", dtype_name(e->dtype)},
                        {"seq", e->seq},       {"issue_us", at(e->issue)}, {"wait_us", e->wait_us}};
    if (e->peer >= 0) a["peer"] = e->peer;
    if (e->pass != Pass::None) a["pass"] = pass_name(e->pass);
    if (e->layer >= 0) a["layer"] = e->layer;
    if (e->microbatch >= 0) a["microbatch"] = e->microbatch;
    if (e->chunk >= 0) a["chunk"] = e->chunk;
    j["args"] = a;
    events.push_back(std::move(j));
  }
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", fmt::format("rank {}", pid)}}}});
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  for (const auto& [tid, name] : threads) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
  }
  const RunInfo& i = info_;
  nlohmann::json other = {{"producer", "primus-cpp"},
                          {"format_version", 1},
                          {"rank", i.rank},
                          {"world_size", i.world_size},
                          {"host", i.host},
                          {"clock", clock_->name()},
                          {"sync_us", sync_us_},
                          {"profile_step_start", opt_.step_start},
                          {"profile_step_end", opt_.step_end},
                          {"device", i.device},
                          {"precision", i.precision},
                          {"peak_tflops", i.peak_tflops},
                          {"memory_bandwidth_gbs", i.memory_bandwidth_gbs},
                          {"memory_bandwidth_source", i.bandwidth_source},
                          {"model", i.model},
                          {"micro_batch_size", i.micro_batch_size},
                          {"seq_length", i.seq_length},
                          {"global_batch_size", i.global_batch_size},
                          {"microbatches_per_rank", i.microbatches_per_rank},
                          {"layout",
                           {{"tp", i.tp}, {"pp", i.pp}, {"dp", i.dp}, {"cp", i.cp}, {"vpp", i.vpp},
                            {"schedule", i.schedule}, {"stage_layers", i.stage_layers}}},
                          {"coord", {{"tp", i.tp_rank}, {"pp", i.pp_rank}, {"dp", i.dp_rank}}}};
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

fs::path Profiler::write() {
  const nlohmann::json j = to_chrome_json();
  fs::create_directories(dir_);
  const fs::path path = dir_ / fmt::format("rank-{}.json", info_.rank);
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) fail("cannot write the trace {}", tmp.string());
    out << j.dump() << "\n";
    if (!out) fail("cannot write the trace {}", tmp.string());
  }
  fs::rename(tmp, path);
  events_.clear();
  comm_.clear();
  clock_->clear();
  return path;
}

// ---------------------------------------------------------------------------------------------
// RAII helpers

Span::Span(Profiler* p, Category cat, const char* name, std::string label) : p_(p && p->active() ? p : nullptr) {
  if (p_) p_->span_begin(cat, name, std::move(label));
}
Span::~Span() {
  if (p_) p_->span_end();
}

Region::Region(Profiler* p, const char* name) : p_(p && p->active() ? p : nullptr) {
  if (p_) p_->region_begin(name);
}
Region::~Region() {
  if (p_) p_->region_end();
}

PassSpan::PassSpan(Profiler* p, Pass pass, int microbatch, int chunk, bool fused_bw) : p_(p && p->active() ? p : nullptr) {
  if (!p_) return;
  const char* name = fused_bw ? "BW" : pass_name(pass);
  p_->span_begin(Category::Annotation, name,
                 chunk >= 0 ? fmt::format("{} mb {} chunk {}", name, microbatch, chunk) : fmt::format("{} mb {}", name, microbatch),
                 pass, microbatch, chunk, fused_bw);
}
PassSpan::~PassSpan() {
  if (p_) p_->span_end();
}

}  // namespace primus::trace
