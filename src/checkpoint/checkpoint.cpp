// Saving and loading checkpoints, with the ranks' agreement on failure (checkpoint.h). The format
// is format.cpp's, the slicing reshard.cpp's, the folder's bookkeeping run_folder.cpp's.
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/format.h"
#include "checkpoint/reshard.h"
#include "checkpoint/run_folder.h"
#include "core/error.h"
#include "core/suggest.h"
#include "parallel/process_group.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::checkpoint {
namespace {

// Fills one rank's tensors (any ShardSpec) from whichever files of a checkpoint hold the global
// ranges they need.
class Loader {
 public:
  Loader(fs::path dir, const ParamStore& params, const LoadOptions& opt)
      : dir_(std::move(dir)), params_(params), opt_(opt), meta_(read_meta(dir_)) {
    read_state();
    index_ = parse_index(dir_, meta_);
  }

  CheckpointData run() {
    make_spans();
    for (const StoredParam& info : params_.infos()) {
      if (const SavedTensor* st = source(info))
        fill(info, *st);
      else
        keep_initial(info);
    }
    batch_.run(opt_);
    std::vector<char> config = read_verified(dir_, meta_, "config.yaml");
    out_.config_yaml.assign(config.begin(), config.end());
    read_run_state();
    return std::move(out_);
  }

 private:
  void read_state() {
    try {
      out_.state.iteration = meta_.at("iteration");
      out_.state.consumed_samples = meta_.at("consumed_samples");
      out_.state.optimizer_step = meta_.at("optimizer_step");
      out_.state.seed = meta_.at("seed");
      out_.state.run_id = meta_.value("run_id", std::string());
      const json& l = meta_.at("layout");
      out_.saved_layout = {l.at("world_size").get<int>(), l.at("tp").get<int>(), l.at("pp").get<int>(),
                           l.at("dp").get<int>(),         l.at("cp").get<int>(), l.at("vpp").get<int>()};
    } catch (const json::exception& e) {
      fail("checkpoint {}/meta.json is missing a field: {}", dir_.string(), e.what());
    }
  }

  // The run state asked for, from the shard that meta.json names for it (header verified).
  void read_run_state() {
    if (opt_.state.empty() || !meta_.contains("state")) return;
    const json& index = meta_.at("state");
    std::map<std::string, std::unique_ptr<ShardReader>> readers;
    for (const std::string& name : opt_.state) {
      if (!index.contains(name)) continue;
      const std::string file = index.at(name).get<std::string>();
      auto& rd = readers[file];
      if (!rd) rd = std::make_unique<ShardReader>(dir_ / file, shard_expect(meta_, file));
      const json& st = rd->header().contains("state") ? rd->header().at("state") : json::object();
      if (!st.contains(name) || !st.at(name).is_array())
        fail("checkpoint {}: meta.json says {} holds run state {}, but it does not", dir_.string(), file, name);
      std::vector<uint32_t> bits;
      try {
        bits = st.at(name).get<std::vector<uint32_t>>();  // the floats' bit patterns (format.cpp)
      } catch (const json::exception& e) {
        fail("checkpoint {}: run state {} in {} is not a list of 32-bit values ({})", dir_.string(), name, file,
             e.what());
      }
      std::vector<float>& v = out_.state_values[name];
      v.resize(bits.size());
      std::memcpy(v.data(), bits.data(), bits.size() * sizeof(float));
    }
  }

  // The saved tensor that fills `info`; nullptr when a non-strict load leaves it as it is (the
  // checkpoint lacks it, or holds it in another shape). A strict load throws instead.
  const SavedTensor* source(const StoredParam& info) const {
    auto it = index_.find(info.name);
    if (it != index_.end() && it->second.global == info.global_shape) return &it->second;
    if (!opt_.strict) return nullptr;
    if (it == index_.end()) {
      std::vector<std::string> names;
      for (const auto& [name, st] : index_) names.push_back(name);
      fail("checkpoint {} has no tensor {}{}", dir_.string(), info.name, did_you_mean(info.name, names));
    }
    fail("checkpoint {}: tensor {} has global shape {} there ({}) but {} in the model", dir_.string(), info.name,
         shape_str(it->second.global), files_holding(it->second), shape_str(info.global_shape));
  }

  // Where each section's elements go (spans_): LoadOptions::targets (of a range with replicas,
  // only this rank's share), or `into`, or CheckpointData's full-size buffers (zeros where nothing
  // is read), each restricted to `ranges` / `optimizer_ranges`.
  void make_spans() {
    const int sections = opt_.optimizer ? kSections : 1;
    if (!opt_.targets.empty()) {
      for (const LoadTarget& t : opt_.targets) {
        const int k = t.replicas ? t.replicas->size() : 1, i = t.replicas ? t.replicas->rank() : 0;
        const int64_t lo = t.numel * i / k, hi = t.numel * (i + 1) / k;  // this replica's share
        for (int s = 0; s < sections; ++s)
          if (t.data[s] && hi > lo) spans_[s].push_back({t.begin + lo, hi - lo, t.data[s] + lo});
      }
      for (int s = 0; s < sections; ++s) {
        std::sort(spans_[s].begin(), spans_[s].end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
        for (size_t j = 1; j < spans_[s].size(); ++j)
          PRIMUS_CHECK(spans_[s][j].begin >= spans_[s][j - 1].begin + spans_[s][j - 1].numel,
                       "LoadOptions::targets overlap in section {}", s);
      }
      return;
    }
    const size_t n = size_t(params_.numel());
    float* dst[kSections] = {opt_.into[0], opt_.into[1], opt_.into[2]};
    if (opt_.into[0]) {
      if (opt_.optimizer && (!opt_.into[1] || !opt_.into[2]))
        fail("checkpoint {}: LoadOptions::into names no buffers for the optimizer moments", dir_.string());
    } else {
      out_.params.assign(n, 0.0f);
      if (opt_.optimizer) {
        out_.exp_avg.assign(n, 0.0f);
        out_.exp_avg_sq.assign(n, 0.0f);
      }
      dst[0] = out_.params.data();
      dst[1] = out_.exp_avg.data();
      dst[2] = out_.exp_avg_sq.data();
    }
    for (int s = 0; s < sections; ++s) {
      const auto& ranges = s > 0 && !opt_.optimizer_ranges.empty() ? opt_.optimizer_ranges : opt_.ranges;
      if (ranges.empty()) spans_[s].push_back({0, params_.numel(), dst[s]});
      for (const auto& [b, len] : ranges) spans_[s].push_back({b, len, dst[s] + b});
    }
  }

  void fill(const StoredParam& info, const SavedTensor& st) {
    const int sections = opt_.optimizer ? kSections : 1;
    const Placement target = make_placement(info.shape, info.shard.dim, info.shard.pieces);
    std::vector<const Entry*> entries;
    for (const Entry& e : st.entries) entries.push_back(&e);
    const PlanResult r =
        plan(info.name, st.global, target, entries,
             [&](const Entry& e, const auto& lo, const auto& hi, const auto& ss, const auto& dsh) {
               for_each_run(e.place.shape, info.shape, lo, hi, ss, dsh, [&](int64_t so, int64_t d, int64_t count) {
                 PRIMUS_CHECK(so >= 0 && so + count <= numel_of(e.place.shape) && d >= 0 && d + count <= info.numel,
                              "tensor {}: copy run outside a local tensor", info.name);
                 const int64_t a = info.offset + d;  // the run, in the flat layout
                 for (int s = 0; s < sections; ++s)
                   in_spans(spans_[s], a, count,
                            [&](int64_t at, int64_t n, float* dst) { read_parts(info, e, so + (at - a), n, s, dst); });
               });
             });
    if (!r.gaps.empty())
      fail("checkpoint {}: tensor {} (global shape {}) is not fully covered: {} is in none of its files ({})",
           dir_.string(), info.name, shape_str(st.global), gaps_str(r), files_holding(st));
  }

  // Where a section's elements [begin, begin + numel) of the flat layout go.
  struct Span {
    int64_t begin = 0, numel = 0;
    float* data = nullptr;  // element `begin`
  };

  // Calls fn(begin, count, dst) for the parts of [a, a + count) inside the spans (sorted,
  // disjoint), dst being where element `begin` goes.
  template <typename Fn>
  static void in_spans(const std::vector<Span>& spans, int64_t a, int64_t count, Fn&& fn) {
    const int64_t b = a + count;
    auto it = std::upper_bound(spans.begin(), spans.end(), a,
                               [](int64_t x, const Span& r) { return x < r.begin + r.numel; });
    for (; it != spans.end() && it->begin < b; ++it) {
      const int64_t lo = std::max(a, it->begin), hi = std::min(b, it->begin + it->numel);
      if (lo < hi) fn(lo, hi - lo, it->data + (lo - it->begin));
    }
  }

  // Reads the saved slice's local elements [so, so + count) of one section from the parts (files)
  // that hold them into dst.
  void read_parts(const StoredParam& info, const Entry& e, int64_t so, int64_t count, int section, float* dst) {
    for (int64_t x = so, end = so + count; x < end;) {
      const Part* best = nullptr;  // the part that covers x and reaches furthest (parts sorted by begin)
      for (const Part& p : e.parts) {
        if (p.begin > x) break;
        if (p.end > x && (!best || p.end > best->end)) best = &p;
      }
      if (!best)
        fail("checkpoint {}: element {} of tensor {}'s slice is in none of its files ({})", dir_.string(), x,
             info.name, e.file);
      ShardReader& rd = reader(best->file);
      if (uint64_t(best->offset + (best->end - best->begin)) > rd.numel())
        fail("checkpoint {}: tensor {} lies outside {} ({} elements)", dir_.string(), info.name, best->file,
             rd.numel());
      const int64_t n = std::min(end, best->end) - x;
      batch_.add(rd, section, uint64_t(best->offset + (x - best->begin)), uint64_t(n), dst + (x - so));
      out_.bytes_read += uint64_t(n) * sizeof(float);
      x += n;
    }
  }

  // A tensor a non-strict load does not fill keeps the model's values (its moments start at 0).
  // Into LoadOptions::targets without initial_values, the values are left where they are.
  void keep_initial(const StoredParam& info) {
    out_.fresh.push_back(info.name);
    const int64_t a = info.offset;
    if (opt_.optimizer)
      for (int s = 1; s < kSections; ++s)
        in_spans(spans_[s], a, info.numel, [](int64_t, int64_t n, float* dst) { std::fill(dst, dst + n, 0.0f); });
    const float* initial = opt_.initial_values;
    if (!initial && !opt_.targets.empty()) return;
    if (!initial) {
      if (initial_.empty()) {
        if (!params_.values().defined() || params_.dtype() != DType::F32)
          fail("checkpoint {}: tensor {} is not in it, and the model's own values are not at hand to keep",
               dir_.string(), info.name);
        const Tensor host = params_.device() == Device::CPU ? params_.values() : params_.values().to(Device::CPU);
        initial_.assign(host.data<float>(), host.data<float>() + params_.numel());
      }
      initial = initial_.data();
    }
    in_spans(spans_[0], a, info.numel,
             [&](int64_t at, int64_t n, float* dst) { std::copy(initial + at, initial + at + n, dst); });
  }

  ShardReader& reader(const std::string& file) {
    auto& r = readers_[file];
    if (!r) r = std::make_unique<ShardReader>(dir_ / file, shard_expect(meta_, file));
    return *r;
  }

  fs::path dir_;
  const ParamStore& params_;
  const LoadOptions& opt_;
  json meta_;
  std::map<std::string, SavedTensor> index_;
  CheckpointData out_;
  std::map<std::string, std::unique_ptr<ShardReader>> readers_;
  std::vector<Span> spans_[kSections];                   // where the sections go (make_spans)
  ShardBatch batch_;                                     // the runs to read, read together at the end of run()
  std::vector<float> initial_;  // a host copy of the store's values, when a tensor keeps them
};

// ---- agreement over ranks ---------------------------------------------------------------------

// Runs fn, turning any exception into its message ("" on success).
template <typename Fn>
std::string caught(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what()[0] ? e.what() : "unknown error";
  }
  return "";
}

// Every rank learns which ranks failed (an all-gather of one flag each): a collective, so it also
// serves as a barrier.
std::vector<int> failed_ranks(parallel::ProcessGroup* world, bool ok) {
  if (!world) return ok ? std::vector<int>{} : std::vector<int>{0};
  const int64_t mine = ok ? 1 : 0;
  std::vector<int64_t> all(size_t(world->size()), 0);
  world->all_gather(&mine, all.data(), 1, parallel::CommType::I64);
  std::vector<int> failed;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] == 0) failed.push_back(int(r));
  return failed;
}

void raise_if_failed(const std::vector<int>& failed, const std::string& own_error, const std::string& what) {
  if (failed.empty()) return;
  if (!own_error.empty()) throw Error(own_error);
  fail("{}: rank(s) {} failed (their error says why)", what, fmt::join(failed, ", "));
}

// Broadcasts `count` floats at `data` (host memory) from `root` over the group: in place when the
// group moves host memory, else through a bounded device buffer.
void broadcast_host(parallel::ProcessGroup& group, float* data, int64_t count, int root) {
  const bool host = group.device() == Device::CPU;
  const int64_t chunk = host ? (int64_t(1) << 28) : (int64_t(16) << 20);  // elements
  Tensor staging;
  for (int64_t at = 0; at < count; at += chunk) {
    const int64_t n = std::min(chunk, count - at);
    if (host) {
      group.broadcast(data + at, n, parallel::CommType::F32, root);
      continue;
    }
    if (!staging.defined() || staging.numel() < n) staging = Tensor::empty({n}, DType::F32, group.device());
    Tensor piece = staging.slice(0, 0, n);
    Tensor cpu = Tensor::empty({n});
    if (group.rank() == root) {
      std::copy(data + at, data + at + n, cpu.data<float>());
      piece.copy_from(cpu);
    }
    group.broadcast(piece, root);
    if (group.rank() != root) {
      cpu.copy_from(piece);
      std::copy(cpu.data<float>(), cpu.data<float>() + n, data + at);
    }
  }
}

// After every rank has read its part: each replica's share of the LoadTargets with replicas, sent
// to the others (collective over each range's replicas, in the targets' order). Returns the bytes
// this rank received.
uint64_t exchange_replicas(const LoadOptions& opt) {
  uint64_t received = 0;
  const int sections = opt.optimizer ? kSections : 1;
  for (const LoadTarget& t : opt.targets) {
    if (!t.replicas || t.replicas->size() <= 1) continue;
    const int k = t.replicas->size();
    for (int j = 0; j < k; ++j) {
      const int64_t lo = t.numel * j / k, hi = t.numel * (j + 1) / k;
      if (hi <= lo) continue;
      for (int s = 0; s < sections; ++s) {
        if (!t.data[s]) continue;
        broadcast_host(*t.replicas, t.data[s] + lo, hi - lo, j);
        if (j != t.replicas->rank()) received += uint64_t(hi - lo) * sizeof(float);
      }
    }
  }
  return received;
}

}  // namespace

// A collective save in three steps that every rank of the world runs: open (rank 0 makes the
// temporary folder), write (each rank its shard, maybe on a thread), finish (the outcomes shared,
// rank 0 publishes). A failure on any rank is reported at the end of a step to all of them, so
// none waits forever, and leaves no checkpoint. Collectives run on the caller's thread only.
class CheckpointSave::Impl {
 public:
  Impl(const std::string& save_dir, const ShardSource& source, const TrainState& state,
       const std::string& config_yaml, const SaveOptions& opt)
      : ranges_(source.ranges),
        state_(state),
        config_yaml_(config_yaml),
        opt_(opt),
        rank_(opt.world ? opt.world->rank() : 0),
        size_(opt.world ? opt.world->size() : 1),
        slot_(save_slot(save_dir, state.iteration)),
        what_(fmt::format("checkpoint {} not saved", slot_.final_dir.string())) {
    if (source.layout) tensors_ = source.layout->infos();
    for (const SaveRange& r : ranges_) writer_ = writer_ || r.numel > 0;
    const auto t0 = std::chrono::steady_clock::now();
    open();
    report_.open_ms = ms_since(t0);
    if (opt_.async) {  // a failure here (no memory for the copy) is this rank's outcome at finish()
      error_ = caught([&] {
        copy_to_host();
        thread_ = std::thread([this] { write(); });
      });
      if (!error_.empty()) done_ = true;
    } else {
      write();
    }
  }
  ~Impl() {
    if (thread_.joinable()) thread_.join();
  }

  bool written() const { return done_.load(); }
  bool all_written() const {
    const int32_t mine = done_.load() ? 1 : 0;
    return opt_.world ? opt_.world->all_reduce_value(mine, parallel::ReduceOp::Min) == 1 : mine == 1;
  }

  SaveReport finish() {
    const auto t_wait = std::chrono::steady_clock::now();
    if (thread_.joinable()) thread_.join();
    report_.wait_ms = ms_since(t_wait);
    const auto t0 = std::chrono::steady_clock::now();
    exchange();
    publish();
    report_.publish_ms = ms_since(t0);
    report_.dir = slot_.final_dir.string();
    return report_;
  }

 private:
  static double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  // 1. Rank 0 checks that the save replaces no other run's checkpoint and makes the temporary
  // folder; the others wait for it.
  void open() {
    std::string err;
    if (rank_ == 0)
      err = caught([&] {
        if (state_.run_id.empty()) fail("checkpoint: the training state has no run id (new_run_id())");
        save_seq_ = open_save_slot(slot_, state_.run_id, opt_.overwrite);
      });
    raise_if_failed(failed_ranks(opt_.world, err.empty()), err, what_);
  }

  // async: the ranges' data into host buffers of this save's own, so that training may go on.
  void copy_to_host() {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t total = 0;
    for (const SaveRange& r : ranges_) total += r.numel;
    std::vector<float>& host = opt_.host_buffer ? *opt_.host_buffer : own_host_;
    host.resize(size_t(total) * kSections);
    host_bytes_ = host.size() * sizeof(float);
    int64_t at = 0;
    for (SaveRange& r : ranges_) {
      for (int s = 0; s < kSections; ++s) {
        float* dst = host.data() + size_t(s) * size_t(total) + size_t(at);
        if (r.numel > 0 && r.data[s]) std::memcpy(dst, r.data[s], size_t(r.numel) * sizeof(float));
        r.data[s] = r.data[s] ? dst : nullptr;
      }
      at += r.numel;
    }
    report_.copy_ms = ms_since(t0);
  }

  // 2. This rank writes its shard file and fsyncs it (no collectives: it may run on a thread).
  void write() {
    const auto t0 = std::chrono::steady_clock::now();
    error_ = caught([&] {
      if (opt_.block_bytes <= 0) fail("checkpoint block_bytes must be positive, not {}", opt_.block_bytes);
      if (!writer_) return;
      mine_ = write_shard(slot_.tmp / shard_file_name(rank_), rank_, state_.run_id, state_.iteration, tensors_,
                          ranges_, opt_.block_bytes, opt_.state);
    });
    if (error_.empty() && writer_) maybe_kill_after(shard_file_name(rank_));
    report_.write_ms = ms_since(t0);
    report_.bytes = mine_.bytes;
    report_.host_buffer_bytes = opt_.source_host_bytes + host_bytes_ +
                                std::min<uint64_t>(kWriteBufferBytes, mine_.bytes);
    done_ = true;
  }

  // Everyone shares (ok, writer, bytes, crc, write time, host buffer bytes).
  void exchange() {
    const int64_t record[kRecord] = {error_.empty() ? 1 : 0, writer_ ? 1 : 0, int64_t(mine_.bytes), int64_t(mine_.crc),
                                     int64_t(report_.write_ms * 1e3), int64_t(report_.host_buffer_bytes)};
    records_.resize(kRecord * size_t(size_));
    if (opt_.world)
      opt_.world->all_gather(record, records_.data(), kRecord, parallel::CommType::I64);
    else
      std::copy(record, record + kRecord, records_.begin());
    std::vector<int> failed;
    for (int r = 0; r < size_; ++r) {
      const int64_t* rec = &records_[kRecord * size_t(r)];
      if (rec[0] == 0) failed.push_back(r);
      if (rec[1] != 0) {
        report_.writers += 1;
        report_.total_bytes += uint64_t(rec[2]);
      }
      report_.max_write_ms = std::max(report_.max_write_ms, double(rec[4]) / 1e3);
      report_.max_host_buffer_bytes = std::max(report_.max_host_buffer_bytes, uint64_t(rec[5]));
    }
    if (!failed.empty() && rank_ == 0) discard_save_slot(slot_);
    raise_if_failed(failed, error_, what_);
  }

  // 3. Rank 0 indexes the shards, writes config.yaml and meta.json, renames, moves `latest`.
  void publish() {
    std::string err;
    if (rank_ == 0)
      err = caught([&] {
        json meta = state_json();
        index_shards(meta);
        const Written cfg = write_whole_file(slot_.tmp / "config.yaml", config_yaml_.data(), config_yaml_.size());
        meta["files"]["config.yaml"] = {{"bytes", cfg.bytes}, {"crc32", cfg.crc}};
        maybe_kill_after("config.yaml");
        write_meta(slot_.tmp, meta);
        fsync_path(slot_.tmp, true);
        maybe_kill_after("meta.json");
        publish_save_slot(slot_);
      });
    if (!err.empty() && rank_ == 0) discard_save_slot(slot_);
    raise_if_failed(failed_ranks(opt_.world, err.empty()), err, what_);
  }

  json state_json() const {
    json meta;
    meta["iteration"] = state_.iteration;
    meta["consumed_samples"] = state_.consumed_samples;
    meta["optimizer_step"] = state_.optimizer_step;
    meta["seed"] = state_.seed;
    meta["run_id"] = state_.run_id;
    meta["save_seq"] = save_seq_;
    meta["saved_at"] =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const CheckpointLayout& l = opt_.layout;
    meta["layout"] = {{"world_size", size_}, {"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"cp", l.cp}, {"vpp", l.vpp}};
    return meta;
  }

  // meta.json's files and tensor index, from the shard headers just written (each read back and
  // verified), and the check that every tensor saved is whole across the files: a rank that wrote
  // less than it should shows here, at save time, not at the next load.
  void index_shards(json& meta) const {
    json files = json::object(), tensors = json::object(), state = json::object();
    for (int r = 0; r < size_; ++r) {
      const int64_t* rec = &records_[kRecord * size_t(r)];
      if (rec[1] == 0) continue;
      const std::string file = shard_file_name(r);
      files[file] = {{"bytes", rec[2]}, {"crc32", rec[3]}, {"rank", r}};
      ShardExpect expect;
      expect.bytes = uint64_t(rec[2]);
      expect.crc = uint32_t(rec[3]);
      expect.run_id = state_.run_id;
      expect.iteration = state_.iteration;
      const ShardReader rd(slot_.tmp / file, expect);
      if (rd.header().contains("state"))
        for (const auto& [name, values] : rd.header().at("state").items())
          if (!state.contains(name)) state[name] = file;  // replicas hold the same state
      for (const json& t : rd.header().at("tensors")) {
        const std::string tname = t.at("name");
        json& entry = tensors[tname];
        if (!entry.contains("global_shape"))
          entry["global_shape"] = t.at("global_shape");
        else if (entry["global_shape"] != t.at("global_shape"))
          fail("ranks disagree on the global shape of tensor {}: {} in {}, {} elsewhere", tname,
               t.at("global_shape").dump(), file, entry["global_shape"].dump());
        entry["shards"].push_back({{"file", file},
                                   {"offset", t.at("offset")},
                                   {"range", t.at("range")},
                                   {"shape", t.at("shape")},
                                   {"shard_dim", t.at("shard_dim")},
                                   {"pieces", t.at("pieces")}});
      }
    }
    if (files.empty()) fail("no rank is a writer (no rank has ranges to write)");
    meta["files"] = files;
    meta["tensors"] = tensors;
    if (!state.empty()) meta["state"] = state;
    for (const auto& [name, st] : parse_index(slot_.tmp, meta)) {  // (each slice whole across its parts)
      std::vector<const Entry*> entries;
      for (const Entry& e : st.entries) entries.push_back(&e);
      const PlanResult r = plan(name, st.global, make_placement(st.global, -1, {}), entries, [](auto&&...) {});
      if (!r.gaps.empty())
        fail("tensor {} is not fully saved: {} is in no rank's file ({}); is every tensor-parallel rank and "
             "pipeline stage a writer?",
             name, gaps_str(r), files_holding(st));
    }
  }

  static constexpr size_t kRecord = 6;
  std::vector<StoredParam> tensors_;
  std::vector<SaveRange> ranges_;
  const TrainState state_;
  const std::string config_yaml_;
  const SaveOptions opt_;
  const int rank_, size_;
  const SaveSlot slot_;
  const std::string what_;
  bool writer_ = false;
  int64_t save_seq_ = 0;
  std::vector<float> own_host_;  // async without SaveOptions::host_buffer: the ranges' three sections, copied
  uint64_t host_bytes_ = 0;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::string error_;        // this rank's write's error ("" on success)
  Written mine_;
  SaveReport report_;
  std::vector<int64_t> records_;  // per rank: kRecord values (exchange())
};

CheckpointSave::CheckpointSave(const std::string& save_dir, const ShardSource& source, const TrainState& state,
                               const std::string& config_yaml, const SaveOptions& options)
    : impl_(std::make_unique<Impl>(save_dir, source, state, config_yaml, options)) {}
CheckpointSave::~CheckpointSave() = default;
bool CheckpointSave::written() const { return impl_->written(); }
bool CheckpointSave::all_written() const { return impl_->all_written(); }
SaveReport CheckpointSave::finish() { return impl_->finish(); }

ShardSource ShardSource::whole(const ParamStore& params, const float* values, const float* exp_avg,
                               const float* exp_avg_sq) {
  ShardSource s;
  s.layout = &params;
  s.ranges.push_back({0, params.numel(), {values, exp_avg, exp_avg_sq}});
  return s;
}

std::string save_checkpoint(const std::string& save_dir, const ParamStore& params, const float* exp_avg,
                            const float* exp_avg_sq, const TrainState& state, const std::string& config_yaml,
                            const SaveOptions& opt) {
  // A store on the GPU (bf16 mixed precision) is written from a host copy of its master weights.
  Tensor values;
  ShardSource source;
  source.layout = &params;
  if (opt.writer) {
    values = params.device() == Device::CPU ? params.values() : params.values().to(Device::CPU);
    source = ShardSource::whole(params, values.data<float>(), exp_avg, exp_avg_sq);
  }
  SaveOptions sync = opt;
  sync.async = false;
  return CheckpointSave(save_dir, source, state, config_yaml, sync).finish().dir;
}

SaveReport save_checkpoint(const std::string& save_dir, const ShardSource& source, const TrainState& state,
                           const std::string& config_yaml, const SaveOptions& opt) {
  SaveOptions sync = opt;
  sync.async = false;
  return CheckpointSave(save_dir, source, state, config_yaml, sync).finish();
}

CheckpointData load_checkpoint(const std::string& dir, const ParamStore& params, const LoadOptions& opt) {
  CheckpointData out;
  const std::string err = caught([&] { out = Loader(fs::path(dir), params, opt).run(); });
  raise_if_failed(failed_ranks(opt.world, err.empty()), err, fmt::format("checkpoint {} not loaded", dir));
  out.bytes_received = exchange_replicas(opt);
  return out;
}

void verify_checkpoint(const std::string& dir_text) {
  const fs::path dir(dir_text);
  const json meta = read_meta(dir);
  if (!meta.contains("files") || !meta["files"].is_object())
    fail("checkpoint {}/meta.json lists no files", dir.string());
  std::vector<char> buf(1 << 20);
  for (const auto& [name, f] : meta["files"].items()) {
    const fs::path p = dir / name;
    std::ifstream in(p, std::ios::binary);
    if (!in) fail("checkpoint file {} is missing or unreadable", p.string());
    uint64_t bytes = 0;
    uint32_t crc = 0;
    while (in) {
      in.read(buf.data(), std::streamsize(buf.size()));
      const auto got = size_t(in.gcount());
      crc = crc_update(crc, buf.data(), got);
      bytes += got;
    }
    if (bytes != f.at("bytes").get<uint64_t>())
      fail("checkpoint file {} is truncated or padded: {} bytes, meta.json says {}", p.string(), bytes,
           f.at("bytes").get<uint64_t>());
    if (crc != f.at("crc32").get<uint32_t>())
      fail("checkpoint file {} is corrupted: its CRC-32 does not match meta.json", p.string());
  }
}

std::string read_checkpoint_config(const std::string& dir) {
  const json meta = read_meta(dir);
  std::vector<char> config = read_verified(dir, meta, "config.yaml");
  return std::string(config.begin(), config.end());
}

}  // namespace primus::checkpoint
