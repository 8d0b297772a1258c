// Resharding checkpoints: save from simulated ranks of one layout, load into another, and check
// every element of the values and both AdamW moments. Ranks are threads joined by a small
// in-process ProcessGroup, so the real collective save protocol runs without MPI.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_bench.h"
#include "checkpoint/format.h"
#include "core/error.h"
#include "parallel/process_group.h"

namespace fs = std::filesystem;
using namespace primus;
using parallel::CommType;
using parallel::ProcessGroup;
using parallel::ReduceOp;
using parallel::WorkPtr;

namespace {

// ---- ranks as threads -------------------------------------------------------------------------

struct Hub {
  explicit Hub(int n) : n(n), slots(size_t(n)) {}
  void sync() {
    std::unique_lock lk(m);
    const int64_t g = gen;
    if (++arrived == n) {
      arrived = 0;
      ++gen;
      cv.notify_all();
    } else {
      cv.wait(lk, [&] { return gen != g; });
    }
  }
  int n;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  int64_t gen = 0;
  std::vector<std::vector<char>> slots;
};

// The collectives the checkpoint protocol uses (all-gather, all-reduce, barrier, broadcast) over
// threads of one process; the rest are not needed here.
class ThreadGroup final : public ProcessGroup {
 public:
  ThreadGroup(Hub& hub, int rank) : hub_(hub), rank_(rank) {
    for (int r = 0; r < hub.n; ++r) ranks_.push_back(r);
  }
  int rank() const override { return rank_; }
  int size() const override { return hub_.n; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "threads"; }
  Device device() const override { return Device::CPU; }
  const std::vector<int>& world_ranks() const override { return ranks_; }

  void all_gather(const void* send, void* recv, int64_t count, CommType t) override {
    const size_t bytes = size_t(count) * parallel::comm_type_size(t);
    hub_.slots[rank_].assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    hub_.sync();
    for (int r = 0; r < hub_.n; ++r) std::memcpy(static_cast<char*>(recv) + r * bytes, hub_.slots[r].data(), bytes);
    hub_.sync();
  }
  void all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override {
    if (t != CommType::I64) fail("ThreadGroup reduces int64 only");
    std::vector<int64_t> all(size_t(count * hub_.n));
    all_gather(buf, all.data(), count, t);
    auto* out = static_cast<int64_t*>(buf);
    for (int64_t i = 0; i < count; ++i) {
      int64_t v = all[i];
      for (int r = 1; r < hub_.n; ++r) {
        const int64_t x = all[r * count + i];
        v = op == ReduceOp::Sum ? v + x : op == ReduceOp::Max ? std::max(v, x) : std::min(v, x);
      }
      out[i] = v;
    }
  }
  void broadcast(void* buf, int64_t count, CommType t, int root) override {
    const size_t bytes = size_t(count) * parallel::comm_type_size(t);
    std::vector<char> all(bytes * size_t(hub_.n));
    all_gather(buf, all.data(), count, t);
    std::memcpy(buf, all.data() + size_t(root) * bytes, bytes);
  }
  void barrier() override { hub_.sync(); }

  void reduce_scatter(const void*, void*, int64_t, CommType, ReduceOp) override { unused(); }
  void all_to_all(const void*, void*, int64_t, CommType) override { unused(); }
  WorkPtr iall_reduce(void*, int64_t, CommType, ReduceOp) override { unused(); }
  WorkPtr ireduce_scatter(const void*, void*, int64_t, CommType, ReduceOp) override { unused(); }
  WorkPtr iall_gather(const void*, void*, int64_t, CommType) override { unused(); }
  WorkPtr isend(const void*, int64_t, CommType, int, int) override { unused(); }
  WorkPtr irecv(void*, int64_t, CommType, int, int) override { unused(); }
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>&, const std::string&) override { unused(); }
  std::unique_ptr<ProcessGroup> split(int, int, const std::string&) override { unused(); }

 private:
  [[noreturn]] static void unused() { fail("not used by the checkpoint tests"); }
  Hub& hub_;
  int rank_;
  std::string name_ = "world";
  std::vector<int> ranks_;
};

// Runs fn(rank, group) on n threads; returns each rank's error message ("" when it succeeded).
std::vector<std::string> run_ranks(int n, const std::function<void(int, ProcessGroup&)>& fn) {
  Hub hub(n);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ThreadGroup g(hub, r);
      try {
        fn(r, g);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// ---- a toy model whose tensors shard like Megatron's ------------------------------------------

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int world() const { return tp * pp * dp; }
  // Megatron order: tp fastest, then dp, pp slowest.
  int tp_rank(int r) const { return r % tp; }
  int dp_rank(int r) const { return (r / tp) % dp; }
  int pp_rank(int r) const { return r / (tp * dp); }
};

ShardSpec pieces_for(int dim, const std::vector<std::pair<int64_t, int64_t>>& parts, int tp, int r) {
  // Each part [start, start + len) is split tp ways; the rank holds its share of every part.
  ShardSpec s{dim, {}};
  if (tp == 1) return s;
  for (auto [start, len] : parts) s.pieces.push_back({start + r * len / tp, len / tp});
  return s;
}

// Two layers (one per stage under pp2), each with a column-parallel [8, 6] weight (rows split), a
// row-parallel [6, 8] weight (columns split), a fused QKV [16, 4] weight (3 pieces: q 8 rows, k and
// v 4 rows each) and a replicated norm; a vocab-parallel [12, 4] embedding on the first stage and
// its tied replica on the last (as LlamaModel does).
void build(ParamStore& p, const Layout& l, int rank, int num_layers = 2, int64_t col_cols = 6) {
  const int tp = l.tp, r = l.tp_rank(rank), stage = l.pp_rank(rank);
  const int per_stage = num_layers / l.pp;
  if (stage == 0) p.add_sharded("embedding.word_embeddings.weight", {12, 4}, pieces_for(0, {{0, 12}}, tp, r), ParamInit::Normal, true);
  for (int layer = stage * per_stage; layer < (stage + 1) * per_stage; ++layer) {
    const std::string pre = "decoder.layers." + std::to_string(layer) + ".";
    p.add(pre + "input_layernorm.weight", {6}, ParamInit::Ones, false);
    p.add_sharded(pre + "linear_fc1.weight", {8, col_cols}, pieces_for(0, {{0, 8}}, tp, r), ParamInit::Normal, true);
    p.add_sharded(pre + "linear_fc2.weight", {6, 8}, pieces_for(1, {{0, 8}}, tp, r), ParamInit::Normal, true);
    p.add_sharded(pre + "linear_qkv.weight", {16, 4}, pieces_for(0, {{0, 8}, {8, 4}, {12, 4}}, tp, r),
                  ParamInit::Normal, true);
  }
  if (stage == l.pp - 1 && l.pp > 1)
    p.add_sharded("embedding.word_embeddings.weight", {12, 4}, pieces_for(0, {{0, 12}}, tp, r), ParamInit::Normal, true);
  p.allocate();
}

// The global element index of each local element (independent of the library's own mapping).
std::vector<int64_t> global_indices(const StoredParam& p) {
  std::vector<int64_t> out(size_t(p.numel));
  if (p.shard.pieces.empty()) {
    for (int64_t i = 0; i < p.numel; ++i) out[i] = i;
    return out;
  }
  const int d = p.shard.dim;
  int64_t inner = 1;
  for (size_t k = size_t(d) + 1; k < p.shape.size(); ++k) inner *= p.shape[k];
  std::vector<int64_t> to_global;
  for (const auto& pc : p.shard.pieces)
    for (int64_t g = 0; g < pc.length; ++g) to_global.push_back(pc.global_start + g);
  const int64_t ld = p.shape[d], gd = p.global_shape[d];
  for (int64_t i = 0; i < p.numel; ++i) {
    const int64_t in = i % inner, j = (i / inner) % ld, outer = i / (inner * ld);
    out[i] = (outer * gd + to_global[j]) * inner + in;
  }
  return out;
}

// A distinct, exactly representable value per (tensor, global element, buffer).
float expected(const std::string& name, int64_t gi, int section) {
  const int64_t id = int64_t(std::hash<std::string>{}(name) % 97);
  return float(id * 1000 + gi) + 0.25f * float(section);
}

struct Buffers {
  std::vector<float> m, v;
};

Buffers fill(ParamStore& p) {
  Buffers b{std::vector<float>(size_t(p.numel()), 0.0f), std::vector<float>(size_t(p.numel()), 0.0f)};
  float* val = p.values().data<float>();
  for (const auto& info : p.infos()) {
    const auto gi = global_indices(info);
    for (int64_t i = 0; i < info.numel; ++i) {
      val[info.offset + i] = expected(info.name, gi[i], 0);
      b.m[info.offset + i] = expected(info.name, gi[i], 1);
      b.v[info.offset + i] = expected(info.name, gi[i], 2);
    }
  }
  return b;
}

// Counts elements of a loaded rank that differ from the expected function (all three buffers).
int64_t mismatches(const ParamStore& p, const checkpoint::CheckpointData& ck) {
  int64_t bad = 0;
  for (const auto& info : p.infos()) {
    const auto gi = global_indices(info);
    for (int64_t i = 0; i < info.numel; ++i) {
      const size_t k = size_t(info.offset + i);
      bad += ck.params[k] != expected(info.name, gi[i], 0);
      bad += ck.exp_avg[k] != expected(info.name, gi[i], 1);
      bad += ck.exp_avg_sq[k] != expected(info.name, gi[i], 2);
    }
  }
  return bad;
}

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("primus_reshard_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
};

// Saves iteration `it` from every rank of `l` (threads); returns each rank's error ("" = ok).
// A tiny block size that is not a multiple of 4 makes slices straddle checksum blocks.
std::vector<std::string> save_layout(const fs::path& save, const Layout& l, int64_t it = 5,
                                     std::function<bool(int)> writer = {}) {
  return run_ranks(l.world(), [&](int rank, ProcessGroup& world) {
    ParamStore p;
    build(p, l, rank);
    Buffers b = fill(p);
    checkpoint::SaveOptions o;
    o.world = &world;
    o.writer = writer ? writer(rank) : l.dp_rank(rank) == 0;
    o.layout.tp = l.tp;
    o.layout.pp = l.pp;
    o.layout.dp = l.dp;
    o.block_bytes = 42;
    checkpoint::TrainState st{it, it * 8, it, 1234, "reshard"};
    checkpoint::save_checkpoint(save.string(), p, b.m.data(), b.v.data(), st, "model: toy\n", o);
  });
}

// Loads into every rank of `l` (one after another, no collectives) and counts wrong elements.
int64_t load_layout_mismatches(const std::string& dir, const Layout& l) {
  int64_t bad = 0;
  for (int rank = 0; rank < l.world(); ++rank) {
    ParamStore p;
    build(p, l, rank);
    const checkpoint::CheckpointData ck = checkpoint::load_checkpoint(dir, p);
    EXPECT_EQ(ck.state.iteration, 5);
    EXPECT_EQ(ck.state.consumed_samples, 40);
    EXPECT_EQ(ck.config_yaml, "model: toy\n");
    bad += mismatches(p, ck);
  }
  return bad;
}

std::string load_error(const std::string& dir, const Layout& l, int rank, int num_layers = 2, int64_t col_cols = 6) {
  ParamStore p;
  build(p, l, rank, num_layers, col_cols);
  try {
    checkpoint::load_checkpoint(dir, p);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

bool all_ok(const std::vector<std::string>& errors) {
  for (const auto& e : errors)
    if (!e.empty()) {
      ADD_FAILURE() << e;
      return false;
    }
  return true;
}

const std::vector<Layout> kLayouts = {{1, 1, 1}, {2, 1, 1}, {4, 1, 1}, {2, 2, 1}, {1, 2, 2}, {2, 1, 2}};

}  // namespace

TEST(CheckpointReshard, EveryLayoutLoadsEveryOther) {
  for (const Layout& from : kLayouts) {
    TempDir t;
    ASSERT_TRUE(all_ok(save_layout(t.dir, from)));
    const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
    EXPECT_NO_THROW(checkpoint::verify_checkpoint(dir));
    // Replicas (dp) write nothing: one file per tp x pp rank.
    size_t shard_files = 0;
    for (const auto& e : fs::directory_iterator(dir)) shard_files += e.path().extension() == ".bin";
    EXPECT_EQ(shard_files, size_t(from.tp * from.pp));
    for (const Layout& to : kLayouts)
      EXPECT_EQ(load_layout_mismatches(dir, to), 0)
          << "saved tp" << from.tp << " pp" << from.pp << " dp" << from.dp << ", loaded tp" << to.tp << " pp" << to.pp;
  }
}

// Every rank writes a part of what it holds (format 4), as ZeRO / FSDP and replicas sharing the
// writing do: dp rank d of D writes, by `per_tensor`, the d-th share of every tensor, or the d-th
// share of its whole flat buffer (cutting tensors anywhere, as ZeRO-1's bucket shards do).
// `skip` names a rank that writes nothing.
std::vector<std::string> save_layout_ranges(const fs::path& save, const Layout& l, bool per_tensor, int skip = -1) {
  return run_ranks(l.world(), [&](int rank, ProcessGroup& world) {
    ParamStore p;
    build(p, l, rank);
    Buffers b = fill(p);
    const float* data[3] = {p.values().data<float>(), b.m.data(), b.v.data()};
    checkpoint::ShardSource src;
    src.layout = &p;
    const int64_t d = l.dp_rank(rank), D = l.dp;
    auto add = [&](int64_t begin, int64_t n) {
      const int64_t lo = begin + n * d / D, hi = begin + n * (d + 1) / D;
      if (lo < hi) src.ranges.push_back({lo, hi - lo, {data[0] + lo, data[1] + lo, data[2] + lo}});
    };
    if (per_tensor)
      for (const auto& info : p.infos()) add(info.offset, info.numel);
    else
      add(0, p.numel());
    if (rank == skip) src.ranges.clear();
    checkpoint::SaveOptions o;
    o.world = &world;
    o.block_bytes = 42;
    checkpoint::save_checkpoint(save.string(), src, {5, 40, 5, 1234, "reshard"}, "model: toy\n", o);
  });
}

TEST(CheckpointReshard, EveryRankWritesItsShareAndEveryLayoutLoads) {
  for (bool per_tensor : {true, false})
    for (const Layout& from : {Layout{1, 2, 2}, Layout{2, 1, 2}, Layout{1, 1, 3}}) {
      TempDir t;
      ASSERT_TRUE(all_ok(save_layout_ranges(t.dir, from, per_tensor)));
      const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
      EXPECT_NO_THROW(checkpoint::verify_checkpoint(dir));
      size_t shard_files = 0;
      for (const auto& e : fs::directory_iterator(dir)) shard_files += e.path().extension() == ".bin";
      EXPECT_EQ(shard_files, size_t(from.world()));  // every rank a writer
      for (const Layout& to : kLayouts)
        EXPECT_EQ(load_layout_mismatches(dir, to), 0) << "saved tp" << from.tp << " pp" << from.pp << " dp" << from.dp
                                                      << (per_tensor ? " per tensor" : " flat") << ", loaded tp"
                                                      << to.tp << " pp" << to.pp;
    }
}

// A rank that should have written its share and did not: the save fails on every rank, naming the
// tensor and the elements no file holds, and no checkpoint appears.
TEST(CheckpointReshard, AShareNobodyWroteFailsTheSave) {
  TempDir t;
  const auto errors = save_layout_ranges(t.dir, {1, 1, 2}, true, 1);
  for (const auto& e : errors) EXPECT_FALSE(e.empty());
  EXPECT_NE(errors[0].find("is not fully saved"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("are in none of its files"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank(s) 0 failed"), std::string::npos) << errors[1];
  EXPECT_FALSE(fs::exists(t.dir / "latest"));
}

// LoadOptions::ranges: a rank reads only the ranges it keeps (its ZeRO / FSDP shards); every
// element there is the saved one, the rest stays 0.
TEST(CheckpointReshard, LoadingOnlyOwnRangesFillsThemAndNothingElse) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout_ranges(t.dir, {1, 1, 2}, false)));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  ParamStore p;
  build(p, {2, 1, 1}, 1);  // tp rank 1 of tp2: another layout
  checkpoint::LoadOptions lo;
  const int64_t n = p.numel();
  lo.ranges = {{1, n / 3}, {n / 2, n / 4}};
  const checkpoint::CheckpointData ck = checkpoint::load_checkpoint(dir, p, lo);
  int64_t filled = 0, wrong = 0, outside = 0;
  for (const auto& info : p.infos()) {
    const auto gi = global_indices(info);
    for (int64_t i = 0; i < info.numel; ++i) {
      const int64_t k = info.offset + i;
      const bool mine = (k >= 1 && k < 1 + n / 3) || (k >= n / 2 && k < n / 2 + n / 4);
      if (!mine) {
        outside += ck.params[size_t(k)] != 0.0f || ck.exp_avg_sq[size_t(k)] != 0.0f;
        continue;
      }
      ++filled;
      wrong += ck.params[size_t(k)] != expected(info.name, gi[i], 0) || ck.exp_avg[size_t(k)] != expected(info.name, gi[i], 1) ||
               ck.exp_avg_sq[size_t(k)] != expected(info.name, gi[i], 2);
    }
  }
  EXPECT_GT(filled, n / 3);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(outside, 0);
}

// LoadOptions::into: the data goes into the caller's buffers, only where it is read (the rest
// keeps its contents), the same as a load into CheckpointData's buffers; read by three threads in
// reads of a few blocks each (blocks of 42 bytes: elements split between blocks), with O_DIRECT and
// through the page cache, in windows of the default size and of 64 bytes (runs, blocks and
// chunks cut by the windows).
TEST(CheckpointReshard, LoadingIntoCallersBuffersWritesOnlyTheRanges) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout_ranges(t.dir, {1, 1, 2}, false)));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  ParamStore p;
  build(p, {2, 1, 1}, 1);
  const int64_t n = p.numel();
  checkpoint::LoadOptions lo;
  lo.ranges = {{1, n / 3}, {n / 2, n / 4}};
  lo.read_threads = 3;
  lo.read_chunk_bytes = 100;
  const checkpoint::CheckpointData ref = checkpoint::load_checkpoint(dir, p, lo);
  std::vector<bool> in_tensor(size_t(n), false);  // alignment gaps are never written
  for (const auto& info : p.infos()) std::fill_n(in_tensor.begin() + info.offset, info.numel, true);
  for (const bool direct : {true, false})
    for (const int64_t window : {int64_t(4) << 20, int64_t(64)}) {
      SCOPED_TRACE(testing::Message() << "read_direct " << direct << ", read_window_bytes " << window);
      lo.read_direct = direct;
      lo.read_window_bytes = window;
      std::vector<float> into(size_t(3 * n), -7.0f);
      for (int s = 0; s < 3; ++s) lo.into[s] = into.data() + s * n;
      const checkpoint::CheckpointData ck = checkpoint::load_checkpoint(dir, p, lo);
      lo.into[0] = lo.into[1] = lo.into[2] = nullptr;
      EXPECT_TRUE(ck.params.empty());
      const std::vector<float>* want[3] = {&ref.params, &ref.exp_avg, &ref.exp_avg_sq};
      int64_t wrong = 0, touched = 0, read = 0;
      for (int64_t k = 0; k < n; ++k) {
        const bool mine = in_tensor[size_t(k)] && ((k >= 1 && k < 1 + n / 3) || (k >= n / 2 && k < n / 2 + n / 4));
        read += mine;
        for (int s = 0; s < 3; ++s) {
          const float got = into[size_t(s * n + k)];
          if (mine)
            wrong += got != (*want[s])[size_t(k)];
          else
            touched += got != -7.0f;
        }
      }
      EXPECT_GT(read, n / 3);
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(touched, 0);
    }
}

// LoadOptions::optimizer_ranges (a ZeRO-1 resume): every value, the moments only in the ranges.
TEST(CheckpointReshard, OptimizerRangesRestrictOnlyTheMoments) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout_ranges(t.dir, {1, 1, 2}, true)));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  ParamStore p;
  build(p, {1, 1, 1}, 0);
  const int64_t n = p.numel();
  checkpoint::LoadOptions lo;
  lo.optimizer_ranges = {{2, n / 3}, {n / 2, n / 5}};
  const checkpoint::CheckpointData ck = checkpoint::load_checkpoint(dir, p, lo);
  int64_t wrong = 0, moments = 0;
  for (const auto& info : p.infos()) {
    const auto gi = global_indices(info);
    for (int64_t i = 0; i < info.numel; ++i) {
      const int64_t k = info.offset + i;
      const bool mine = (k >= 2 && k < 2 + n / 3) || (k >= n / 2 && k < n / 2 + n / 5);
      moments += mine;
      wrong += ck.params[size_t(k)] != expected(info.name, gi[i], 0);
      wrong += ck.exp_avg[size_t(k)] != (mine ? expected(info.name, gi[i], 1) : 0.0f);
      wrong += ck.exp_avg_sq[size_t(k)] != (mine ? expected(info.name, gi[i], 2) : 0.0f);
    }
  }
  EXPECT_GT(moments, n / 3);
  EXPECT_EQ(wrong, 0);
}

// LoadOptions::targets with replicas (a no_shard resume): three replicas of one layout read their
// thirds of a range and receive the rest from each other; each ends with the plain load's values
// and moments, having read a third of that range's bytes (and all of a range that is its own),
// and CheckpointData's buffers stay empty. A block damaged anywhere fails the replica that reads
// it, naming the block, and every other with "rank(s) N failed": none of them goes on.
void load_as_replicas(const std::string& dir, int n_ranks, std::vector<std::vector<float>>& got,
                      std::vector<checkpoint::CheckpointData>& cks, std::vector<std::string>& errors) {
  got.assign(size_t(n_ranks), {});
  cks.assign(size_t(n_ranks), {});
  errors = run_ranks(n_ranks, [&](int rank, ProcessGroup& world) {
    ParamStore p;
    build(p, {1, 1, 1}, 0);
    const int64_t n = p.numel(), half = n / 2;
    std::vector<float>& buf = got[size_t(rank)];
    buf.assign(size_t(3 * n), -7.0f);
    checkpoint::LoadOptions lo;
    lo.world = &world;
    lo.read_threads = 2;
    checkpoint::LoadTarget shared{0, half, {buf.data(), buf.data() + n, buf.data() + 2 * n}, &world};
    checkpoint::LoadTarget own{half, n - half, {buf.data() + half, buf.data() + n + half, buf.data() + 2 * n + half}};
    lo.targets = {shared, own};
    cks[size_t(rank)] = checkpoint::load_checkpoint(dir, p, lo);
  });
}

TEST(CheckpointReshard, ReplicasReadAShareAndExchangeTheRest) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout_ranges(t.dir, {2, 1, 1}, true)));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  ParamStore p;
  build(p, {1, 1, 1}, 0);
  const int64_t n = p.numel(), half = n / 2;
  const checkpoint::CheckpointData ref = checkpoint::load_checkpoint(dir, p);
  checkpoint::LoadOptions rest;
  rest.ranges = {{half, n - half}};
  const uint64_t own_bytes = checkpoint::load_checkpoint(dir, p, rest).bytes_read;
  const uint64_t shared_bytes = ref.bytes_read - own_bytes;
  ASSERT_GT(shared_bytes, 0u);
  ASSERT_GT(own_bytes, 0u);

  std::vector<std::vector<float>> got;
  std::vector<checkpoint::CheckpointData> cks;
  std::vector<std::string> errors;
  load_as_replicas(dir, 3, got, cks, errors);
  ASSERT_TRUE(all_ok(errors));
  const std::vector<float>* want[3] = {&ref.params, &ref.exp_avg, &ref.exp_avg_sq};
  uint64_t read_total = 0;
  for (int r = 0; r < 3; ++r) {
    const checkpoint::CheckpointData& ck = cks[size_t(r)];
    EXPECT_TRUE(ck.params.empty() && ck.exp_avg.empty());
    EXPECT_EQ(ck.state.iteration, 5);
    int64_t wrong = 0;
    for (const auto& info : p.infos())
      for (int64_t k = info.offset; k < info.offset + info.numel; ++k)
        for (int s = 0; s < 3; ++s) wrong += got[size_t(r)][size_t(s * n + k)] != (*want[s])[size_t(k)];
    EXPECT_EQ(wrong, 0) << "rank " << r;
    EXPECT_GE(ck.bytes_read, own_bytes);
    EXPECT_LT(ck.bytes_read - own_bytes, shared_bytes / 2) << "rank " << r << " read more than its share";
    // it received the other replicas' shares of the range (three sections, alignment gaps included)
    const int64_t mine = half * (r + 1) / 3 - half * r / 3;
    EXPECT_EQ(ck.bytes_received, uint64_t(3 * (half - mine)) * sizeof(float));
    read_total += ck.bytes_read;
  }
  EXPECT_EQ(read_total, shared_bytes + 3 * own_bytes);  // the shared range read once in all

  // A damaged block: whichever replica reads it fails naming it, the others because it failed.
  const fs::path shard = fs::path(dir) / "rank_00001.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-10, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x5a);
    f.seekp(-10, std::ios::end);
    f.write(&c, 1);
  }
  load_as_replicas(dir, 3, got, cks, errors);
  int named = 0;
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(errors[size_t(r)].empty()) << "rank " << r << " went on";
    named += errors[size_t(r)].find("rank_00001.bin is corrupted: block") != std::string::npos;
    if (errors[size_t(r)].find("rank_00001.bin") == std::string::npos) {
      EXPECT_NE(errors[size_t(r)].find("failed"), std::string::npos) << errors[size_t(r)];
    }
  }
  EXPECT_GE(named, 1);
}

// A damaged block is found by the threaded reads too, and named.
TEST(CheckpointReshard, ThreadedReadsNameADamagedBlock) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout_ranges(t.dir, {1, 1, 1}, false)));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  const fs::path shard = fs::path(dir) / "rank_00000.bin";
  {  // flip a byte near the end: a block of exp_avg_sq
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-10, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x5a);
    f.seekp(-10, std::ios::end);
    f.write(&c, 1);
  }
  ParamStore p;
  build(p, {1, 1, 1}, 0);
  checkpoint::LoadOptions lo;
  lo.read_threads = 3;
  lo.read_chunk_bytes = 100;
  std::string e;
  try {
    checkpoint::load_checkpoint(dir, p, lo);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("rank_00000.bin is corrupted: block"), std::string::npos) << e;
  EXPECT_NE(e.find("of exp_avg_sq fails its CRC-32"), std::string::npos) << e;
}

// The CRC-32 computed (ISA-L) is zlib's, in one call or in pieces: old checkpoints keep loading.
TEST(CheckpointFormat, CrcIsZlibs) {
  std::vector<unsigned char> bytes(100003);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + (i >> 7));
  for (size_t len : {size_t(0), size_t(1), size_t(15), size_t(64), size_t(4097), bytes.size()}) {
    const uLong want = crc32(0, bytes.data(), uInt(len));
    EXPECT_EQ(checkpoint::crc_of(bytes.data(), len), uint32_t(want)) << len;
    const size_t cut = len / 3;
    EXPECT_EQ(checkpoint::crc_update(checkpoint::crc_of(bytes.data(), cut), bytes.data() + cut, len - cut),
              uint32_t(want))
        << len;
  }
}

// `benchmark checkpoint` on two ranks (threads): every phase moves the bytes it should and takes
// time; each rank's shard is about half of the whole.
TEST(CheckpointBench, TwoRanksMeasureEveryPhase) {
  TempDir t;
  std::vector<checkpoint::CheckpointBench> results(2);
  ASSERT_TRUE(all_ok(run_ranks(2, [&](int rank, ProcessGroup& world) {
    ParamStore p;
    build(p, {1, 1, 1}, 0);
    results[size_t(rank)] = checkpoint::bench_checkpoint(p, &world, (t.dir / "bench").string());
  })));
  const checkpoint::CheckpointBench& r = results[0];
  EXPECT_EQ(r.ranks, 2);
  ASSERT_EQ(r.rank_bytes.size(), 2u);
  const uint64_t data = uint64_t(r.parameters) * 12;
  EXPECT_EQ(r.disk_write.bytes, data);
  EXPECT_EQ(r.disk_read.bytes, data);
  EXPECT_GT(r.save.bytes, data);  // the data and two headers
  EXPECT_EQ(r.save.bytes, r.rank_bytes[0] + r.rank_bytes[1]);
  EXPECT_EQ(r.load.bytes, r.save.bytes);
  EXPECT_EQ(r.load_new.bytes, r.save.bytes);
  EXPECT_EQ(r.load_all.bytes, r.save.bytes);
  EXPECT_EQ(r.load_shared.bytes, r.save.bytes);
  EXPECT_NEAR(double(r.rank_bytes[0]), double(r.rank_bytes[1]), 0.2 * double(r.rank_bytes[0]));
  for (const checkpoint::BenchPhase* ph :
       {&r.disk_write, &r.disk_read, &r.save, &r.load, &r.load_new, &r.load_all, &r.load_shared}) {
    EXPECT_GT(ph->seconds, 0);
    EXPECT_EQ(ph->rank_seconds.size(), 2u);
  }
  EXPECT_FALSE(fs::exists(t.dir / "bench" / "checkpoints"));  // cleaned up
}

TEST(CheckpointReshard, MetaRecordsLayoutFilesAndSlices) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 2, 1})));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  std::ifstream in(fs::path(dir) / "meta.json");
  const auto meta = nlohmann::json::parse(in);
  EXPECT_EQ(meta["layout"]["tp"], 2);
  EXPECT_EQ(meta["layout"]["pp"], 2);
  EXPECT_EQ(meta["layout"]["world_size"], 4);
  for (const char* f : {"rank_00000.bin", "rank_00001.bin", "rank_00002.bin", "rank_00003.bin", "config.yaml"}) {
    ASSERT_TRUE(meta["files"].contains(f)) << f;
    EXPECT_EQ(meta["files"][f]["bytes"].get<uint64_t>(), fs::file_size(fs::path(dir) / f)) << f;
  }
  // Layer 1 lives on stage 1 (ranks 2, 3); its QKV weight has three pieces per rank.
  const auto& qkv = meta["tensors"]["decoder.layers.1.linear_qkv.weight"];
  ASSERT_EQ(qkv["shards"].size(), 2u);
  EXPECT_EQ(qkv["shards"][0]["file"], "rank_00002.bin");
  EXPECT_EQ(qkv["shards"][1]["pieces"], nlohmann::json::parse("[[4,4],[10,2],[14,2]]"));
  // The tied embedding is held by both stages: four slices of it.
  EXPECT_EQ(meta["tensors"]["embedding.word_embeddings.weight"]["shards"].size(), 4u);
  checkpoint::CheckpointData ck;
  ParamStore p;
  build(p, {1, 1, 1}, 0);
  ck = checkpoint::load_checkpoint(dir, p);
  EXPECT_EQ(ck.saved_layout.tp, 2);
  EXPECT_EQ(ck.saved_layout.pp, 2);
}

// A tensor saved split along one dim loads into a rank that holds it split along another, in
// non-adjacent pieces: the copies are 2-D boxes.
TEST(CheckpointReshard, SplitAlongAnotherDim) {
  TempDir t;
  ASSERT_TRUE(all_ok(run_ranks(2, [&](int rank, ProcessGroup& world) {
    ParamStore p;
    p.add_sharded("w", {8, 6, 3}, ShardSpec{1, {{rank * 3, 3}}}, ParamInit::Normal, true);
    p.allocate();
    Buffers b = fill(p);
    checkpoint::SaveOptions o;
    o.world = &world;
    o.block_bytes = 16;
    checkpoint::save_checkpoint(t.dir.string(), p, b.m.data(), b.v.data(), {5, 40, 5, 1, "reshard"}, "model: toy\n", o);
  })));
  ParamStore p;
  p.add_sharded("w", {8, 6, 3}, ShardSpec{0, {{5, 3}, {1, 2}}}, ParamInit::Normal, true);
  p.allocate();
  const auto ck = checkpoint::load_checkpoint(checkpoint::resolve_checkpoint(t.dir.string()), p);
  EXPECT_EQ(mismatches(p, ck), 0);
}

TEST(CheckpointReshard, ValuesOnlyLoadSkipsTheMoments) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 1, 1})));
  ParamStore p;
  build(p, {4, 1, 1}, 3);
  checkpoint::LoadOptions o;
  o.optimizer = false;
  const auto ck = checkpoint::load_checkpoint(checkpoint::resolve_checkpoint(t.dir.string()), p, o);
  EXPECT_TRUE(ck.exp_avg.empty());
  ASSERT_EQ(ck.params.size(), size_t(p.numel()));
  const auto& info = p.infos()[size_t(p.find("decoder.layers.0.linear_fc2.weight"))];
  const auto gi = global_indices(info);
  for (int64_t i = 0; i < info.numel; ++i) EXPECT_EQ(ck.params[info.offset + i], expected(info.name, gi[i], 0));
}

TEST(CheckpointReshard, TruncatedShardFileIsNamed) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 2, 1})));
  const fs::path dir = checkpoint::resolve_checkpoint(t.dir.string());
  fs::resize_file(dir / "rank_00001.bin", fs::file_size(dir / "rank_00001.bin") - 10);
  const std::string e = load_error(dir, {1, 1, 1}, 0);
  EXPECT_NE(e.find("rank_00001.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // A layout that needs no slice of that file still loads (tp rank 0 of stage 1 reads rank 2's).
  EXPECT_EQ(load_error(dir, {2, 2, 1}, 2), "(loaded)");
  EXPECT_THROW(checkpoint::verify_checkpoint(dir), Error);
}

TEST(CheckpointReshard, CorruptedBlockAndHeaderAreDetected) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 1, 1})));
  const fs::path dir = checkpoint::resolve_checkpoint(t.dir.string());
  auto flip = [](const fs::path& f, std::streamoff at) {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    char c;
    s.seekg(at);
    s.read(&c, 1);
    c ^= 0x10;
    s.seekp(at);
    s.write(&c, 1);
  };
  const auto size = std::streamoff(fs::file_size(dir / "rank_00000.bin"));
  flip(dir / "rank_00000.bin", size - 3);  // inside the last block of exp_avg_sq
  std::string e = load_error(dir, {1, 1, 1}, 0);
  EXPECT_NE(e.find("rank_00000.bin is corrupted"), std::string::npos) << e;
  EXPECT_NE(e.find("exp_avg_sq"), std::string::npos) << e;
  flip(dir / "rank_00000.bin", size - 3);  // restored
  EXPECT_EQ(load_error(dir, {1, 1, 1}, 0), "(loaded)");
  flip(dir / "rank_00000.bin", 40);  // inside the JSON header
  e = load_error(dir, {1, 1, 1}, 0);
  EXPECT_NE(e.find("rank_00000.bin is corrupted: its header"), std::string::npos) << e;
  EXPECT_THROW(checkpoint::verify_checkpoint(dir), Error);
}

TEST(CheckpointReshard, MissingTensorAndShapeMismatchAreNamed) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 2, 1})));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  // A model with four layers asks for layers the checkpoint lacks.
  std::string e = load_error(dir, {1, 1, 1}, 0, 4);
  EXPECT_NE(e.find("has no tensor decoder.layers.2."), std::string::npos) << e;
  // A wider fc1 weight: the global shapes differ, and the files holding it are named.
  e = load_error(dir, {2, 1, 1}, 1, 2, 7);
  EXPECT_NE(e.find("decoder.layers.0.linear_fc1.weight has global shape [8, 6]"), std::string::npos) << e;
  EXPECT_NE(e.find("[8, 7] in the model"), std::string::npos) << e;
  EXPECT_NE(e.find("rank_00000.bin"), std::string::npos) << e;
}

TEST(CheckpointReshard, PartialCoverageIsRefusedOnSaveAndOnLoad) {
  TempDir t;
  // tp rank 1 wrongly marked as no writer: every rank's save fails, nothing becomes visible.
  const auto errors = save_layout(t.dir, {2, 1, 1}, 5, [](int rank) { return rank == 0; });
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("not fully saved"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank(s) 0 failed"), std::string::npos) << errors[1];
  EXPECT_TRUE(checkpoint::list_checkpoints(t.dir.string()).empty());
  EXPECT_FALSE(fs::exists(t.dir / "latest"));

  // A checkpoint whose meta.json lost one slice: the load names the tensor, the range, the files.
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 1, 1})));
  const fs::path dir = checkpoint::resolve_checkpoint(t.dir.string());
  nlohmann::json meta;
  {
    std::ifstream in(dir / "meta.json");
    meta = nlohmann::json::parse(in);
  }
  meta["tensors"]["decoder.layers.1.linear_fc2.weight"]["shards"].erase(1);
  // Re-sealed as a writer would (meta.json's checksum covers its compact form without the field),
  // so that the load reaches the coverage check.
  meta.erase("meta_crc32");
  const std::string compact = meta.dump();
  meta["meta_crc32"] = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(compact.data()), uInt(compact.size())));
  std::ofstream(dir / "meta.json") << meta.dump(1);
  const std::string e = load_error(dir, {1, 1, 1}, 0);
  EXPECT_NE(e.find("decoder.layers.1.linear_fc2.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("not fully covered: [4, 8) along dim 1"), std::string::npos) << e;
  EXPECT_NE(e.find("rank_00000.bin (dim 1 [0, 4))"), std::string::npos) << e;
  // A tp2 rank 0 needs only columns [0, 4): it still loads.
  EXPECT_EQ(load_error(dir, {2, 1, 1}, 0), "(loaded)");
}

TEST(CheckpointReshard, AFailingRankFailsEveryRankAndKeepsThePreviousCheckpoint) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 2, 1}, 5)));
  ::setenv("PRIMUS_FAULT_CHECKPOINT_FAIL_RANK", "2", 1);
  const auto errors = save_layout(t.dir, {2, 2, 1}, 6);
  ::unsetenv("PRIMUS_FAULT_CHECKPOINT_FAIL_RANK");
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r << " did not fail";
  EXPECT_NE(errors[2].find("injected failure"), std::string::npos) << errors[2];
  EXPECT_NE(errors[0].find("rank(s) 2 failed"), std::string::npos) << errors[0];
  EXPECT_FALSE(fs::exists(t.dir / checkpoint::checkpoint_name(6)));
  EXPECT_EQ(fs::path(checkpoint::resolve_checkpoint(t.dir.string())).filename(), checkpoint::checkpoint_name(5));
  for (const auto& e : fs::directory_iterator(t.dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_EQ(load_layout_mismatches(checkpoint::resolve_checkpoint(t.dir.string()), {1, 1, 1}), 0);
}

TEST(CheckpointReshard, LoadAgreesOverRanks) {
  TempDir t;
  ASSERT_TRUE(all_ok(save_layout(t.dir, {2, 1, 1})));
  const std::string dir = checkpoint::resolve_checkpoint(t.dir.string());
  // Rank 1's model asks for a tensor the checkpoint lacks; rank 0 could load but must not go on.
  const auto errors = run_ranks(2, [&](int rank, ProcessGroup& world) {
    ParamStore p;
    build(p, {2, 1, 1}, rank, rank == 1 ? 4 : 2);
    checkpoint::LoadOptions o;
    o.world = &world;
    checkpoint::load_checkpoint(dir, p, o);
  });
  EXPECT_NE(errors[1].find("has no tensor"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank(s) 1 failed"), std::string::npos) << errors[0];
}

#ifdef PRIMUS_CHECKPOINT_MPI_TEST
// The same checks on real ranks (mpirun -n 4): the collective save over MPI, then loads into
// other layouts, with an agreement over the ranks.
#include "parallel/mpi_process_group.h"

TEST(CheckpointReshardMpi, SaveUnderTp2Pp2LoadUnderTp4AndOneProcess) {
  auto& world = parallel::mpi_world();
  ASSERT_EQ(world.size(), 4) << "run with mpirun -n 4";
  const int rank = world.rank();
  int64_t id = ::getpid();  // rank 0's pid names the shared folder
  world.broadcast(&id, 1, CommType::I64, 0);
  const fs::path save = fs::temp_directory_path() / ("primus_reshard_mpi_" + std::to_string(id));
  auto save_iter = [&](int64_t it) {
    const Layout l{2, 2, 1};
    ParamStore p;
    build(p, l, rank);
    Buffers b = fill(p);
    checkpoint::SaveOptions o;
    o.world = &world;
    o.layout = {4, 2, 2, 1, 1, 1};
    o.block_bytes = 42;
    checkpoint::save_checkpoint(save.string(), p, b.m.data(), b.v.data(), {it, it * 8, it, 1234, "reshard"},
                                "model: toy\n", o);
  };
  ASSERT_NO_THROW(save_iter(5));
  const std::string dir = checkpoint::resolve_checkpoint(save.string());

  // Each rank is one rank of tp4, agreeing over the world; and each also loads the whole model.
  {
    ParamStore p;
    build(p, {4, 1, 1}, rank);
    checkpoint::LoadOptions o;
    o.world = &world;
    const auto ck = checkpoint::load_checkpoint(dir, p, o);
    EXPECT_EQ(mismatches(p, ck), 0);
    EXPECT_EQ(ck.saved_layout.tp, 2);
  }
  EXPECT_EQ(load_layout_mismatches(dir, {1, 1, 1}), 0);

  // The four ranks as replicas of one process (no_shard dp4): each reads a quarter and the MPI
  // broadcasts bring the rest; the result is the plain load's, element for element.
  {
    ParamStore p;
    build(p, {1, 1, 1}, 0);
    const int64_t n = p.numel();
    const auto plain = checkpoint::load_checkpoint(dir, p);
    std::vector<float> buf(size_t(3 * n), -7.0f);
    checkpoint::LoadOptions o;
    o.world = &world;
    o.targets = {{0, n, {buf.data(), buf.data() + n, buf.data() + 2 * n}, &world}};
    const auto ck = checkpoint::load_checkpoint(dir, p, o);
    const std::vector<float>* want[3] = {&plain.params, &plain.exp_avg, &plain.exp_avg_sq};
    int64_t wrong = 0;
    for (const auto& info : p.infos())
      for (int64_t k = info.offset; k < info.offset + info.numel; ++k)
        for (int s = 0; s < 3; ++s) wrong += buf[size_t(s * n + k)] != (*want[s])[size_t(k)];
    EXPECT_EQ(wrong, 0);
    EXPECT_LT(ck.bytes_read, plain.bytes_read / 3);
    EXPECT_GT(ck.bytes_received, plain.bytes_read / 2);
  }

  // Rank 3 fails mid-write: every rank throws, iteration 5 stays the latest.
  if (rank == 3) ::setenv("PRIMUS_FAULT_CHECKPOINT_FAIL_RANK", "3", 1);
  try {
    save_iter(6);
    ADD_FAILURE() << "rank " << rank << ": the save of iteration 6 succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(rank == 3 ? "injected failure" : "rank(s) 3 failed"), std::string::npos)
        << e.what();
  }
  ::unsetenv("PRIMUS_FAULT_CHECKPOINT_FAIL_RANK");
  world.barrier();
  EXPECT_EQ(checkpoint::resolve_checkpoint(save.string()), dir);
  EXPECT_FALSE(fs::exists(save / checkpoint::checkpoint_name(6)));
  world.barrier();
  if (rank == 0) fs::remove_all(save);
}
#endif
