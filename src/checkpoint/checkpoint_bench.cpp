#include "checkpoint/checkpoint_bench.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/format.h"
#include "core/error.h"
#include "parallel/process_group.h"
#include "safe/disk.h"

namespace fs = std::filesystem;

namespace primus::checkpoint {
namespace {

constexpr size_t kChunk = 4u << 20;

// Drops a file's (clean, fsynced) pages from the page cache, so that the next read is the disk's.
void drop_cached(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void write_plain(const fs::path& p, const char* data, uint64_t bytes) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("benchmark checkpoint: cannot create {}: {}", p.string(), std::strerror(errno));
  for (uint64_t at = 0; at < bytes;) {  // the same bytes in the same large writes as a shard's
    const size_t n = size_t(std::min<uint64_t>(uint64_t(1) << 30, bytes - at));
    const ssize_t w = ::write(fd, data + at, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;
      ::close(fd);
      safe::fail_write(p.string(), err, bytes - at);
    }
    at += uint64_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail("benchmark checkpoint: fsync of {} failed", p.string());
}

void read_plain(const fs::path& p, std::vector<char>& buf) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("benchmark checkpoint: cannot read {}: {}", p.string(), std::strerror(errno));
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), kChunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("benchmark checkpoint: reading {} failed: {}", p.string(), std::strerror(errno));
    if (n == 0) break;
  }
  ::close(fd);
}

// User and system CPU time of this process, every thread's.
double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// Runs one phase on every rank between barriers: the slowest rank's time, every rank's time.
class Phases {
 public:
  explicit Phases(parallel::ProcessGroup* world) : world_(world), size_(world ? world->size() : 1) {}
  template <typename Fn>
  BenchPhase run(uint64_t my_bytes, Fn&& fn) {
    if (world_) world_->barrier();
    const double cpu0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double my_cpu = process_cpu_seconds() - cpu0;
    BenchPhase p;
    p.rank_seconds = gather(mine);
    p.seconds = *std::max_element(p.rank_seconds.begin(), p.rank_seconds.end());
    for (double c : gather(my_cpu)) p.cpu_seconds += c;
    for (double b : gather(double(my_bytes))) p.bytes += uint64_t(b);
    return p;
  }
  std::vector<double> gather(double v) const {
    std::vector<double> all(size_t(size_), v);
    if (world_) world_->all_gather(&v, all.data(), 1, parallel::CommType::F64);
    return all;
  }

 private:
  parallel::ProcessGroup* world_;
  int size_;
};

// Loads every tensor of the store into `buffers` (3 x the flat size, this rank's: resident before
// the load as a resuming rank's are), with `replicas`: as one of them (a share read, the rest
// received).
void load_whole(const std::string& dir, const ParamStore& layout, LoadOptions lo, std::vector<float>& buffers,
                    parallel::ProcessGroup* replicas) {
  const size_t flat = size_t(layout.numel());
  lo.targets = {{0, layout.numel(), {buffers.data(), buffers.data() + flat, buffers.data() + 2 * flat}, replicas}};
  (void)load_checkpoint(dir, layout, lo);
}

}  // namespace

CheckpointBench bench_checkpoint(const ParamStore& layout, parallel::ProcessGroup* world, const std::string& dir_text) {
  const int rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  const fs::path dir(dir_text);
  if (rank == 0) {
    fs::remove_all(dir / "checkpoints");
    fs::create_directories(dir);
  }
  if (world) world->barrier();

  // This rank's share of every tensor, and data for it (three sections, distinct values).
  ShardSource source;
  source.layout = &layout;
  std::vector<std::pair<int64_t, int64_t>> owned;
  int64_t numel = 0;
  for (const StoredParam& p : layout.infos()) {
    const int64_t lo = p.numel * rank / size, hi = p.numel * (rank + 1) / size;
    if (lo < hi) owned.push_back({p.offset + lo, hi - lo});
    numel += hi - lo;
  }
  std::vector<float> data(size_t(numel) * 3);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 65521) * 1e-3f + float(rank);
  int64_t at = 0;
  for (const auto& [begin, n] : owned) {
    source.ranges.push_back({begin, n, {&data[size_t(at)], &data[size_t(numel + at)], &data[size_t(2 * numel + at)]}});
    at += n;
  }
  const uint64_t data_bytes = data.size() * sizeof(float);
  safe::require_free(dir.string(), 2 * data_bytes, "benchmark checkpoint's files in");

  CheckpointBench r;
  r.ranks = size;
  r.parameters = 0;
  for (const StoredParam& p : layout.infos()) r.parameters += p.numel;
  Phases phases(world);
  const fs::path plain = dir / fmt::format("disk_{:05d}.bin", rank);
  std::vector<char> buf(kChunk);
  // The disk's speed before and after the checkpoint's phases: the faster of the two is the limit
  // (a shared disk's speed wanders).
  auto measure_disk = [&] {
    const BenchPhase w =
        phases.run(data_bytes, [&] { write_plain(plain, reinterpret_cast<const char*>(data.data()), data_bytes); });
    drop_cached(plain);
    const BenchPhase rd = phases.run(data_bytes, [&] { read_plain(plain, buf); });
    fs::remove(plain);
    if (r.disk_write.seconds == 0 || w.seconds < r.disk_write.seconds) r.disk_write = w;
    if (r.disk_read.seconds == 0 || rd.seconds < r.disk_read.seconds) r.disk_read = rd;
  };
  measure_disk();

  TrainState state;
  state.iteration = 1;
  state.run_id = "benchmark";
  SaveOptions so;
  so.world = world;
  so.overwrite = true;
  SaveReport saved;
  r.save = phases.run(0, [&] { saved = save_checkpoint((dir / "checkpoints").string(), source, state, "benchmark: true\n", so); });
  r.save.bytes = saved.total_bytes;
  for (double b : phases.gather(double(saved.bytes))) r.rank_bytes.push_back(uint64_t(b));
  drop_cached(fs::path(saved.dir) / shard_file_name(rank));
  if (world) world->barrier();

  LoadOptions lo;
  lo.world = world;
  lo.ranges = owned;
  // Into the rank's own state (its flat buffers, resident before the load, as a resuming rank's
  // are), then checked against what was saved.
  const size_t flat = size_t(layout.numel());
  std::vector<float> state_buffers(3 * flat, -1.0f);
  for (int s = 0; s < 3; ++s) lo.into[s] = state_buffers.data() + size_t(s) * flat;
  r.load = phases.run(saved.bytes, [&] { (void)load_checkpoint(saved.dir, layout, lo); });
  r.load.bytes = saved.total_bytes;
  at = 0;
  for (const auto& [begin, n] : owned) {
    for (int s = 0; s < 3; ++s)
      if (std::memcmp(lo.into[s] + begin, &data[size_t(s * numel + at)], size_t(n) * sizeof(float)) != 0)
        fail("benchmark checkpoint: rank {} loaded other values than it saved ({} of elements [{}, {}))", rank,
             kSectionNames[s], begin, begin + n);
    at += n;
  }
  std::vector<float>().swap(state_buffers);
  // Into buffers the load allocates (CheckpointData's: full-size, zeros outside the ranges).
  drop_cached(fs::path(saved.dir) / shard_file_name(rank));
  if (world) world->barrier();
  lo.into[0] = lo.into[1] = lo.into[2] = nullptr;
  r.load_new = phases.run(saved.bytes, [&] { (void)load_checkpoint(saved.dir, layout, lo); });
  r.load_new.bytes = saved.total_bytes;
  lo.ranges.clear();
  // As replicas (no_shard): every rank needs the whole state. Each reading all of it, then each
  // reading a 1/N share and receiving the rest (LoadTarget::replicas); the two must agree.
  auto drop_all = [&] {  // the other ranks' files too: each rank reads them here
    for (int k = 0; k < size; ++k) drop_cached(fs::path(saved.dir) / shard_file_name(k));
    if (world) world->barrier();
  };
  std::vector<float> whole(3 * flat, -1.0f);
  drop_all();
  r.load_all = phases.run(0, [&] { load_whole(saved.dir, layout, lo, whole, nullptr); });
  r.load_all.bytes = saved.total_bytes;
  const uint32_t crc_all = crc_update(0, whole.data(), whole.size() * sizeof(float));
  std::fill(whole.begin(), whole.end(), -1.0f);
  drop_all();
  r.load_shared = phases.run(0, [&] { load_whole(saved.dir, layout, lo, whole, world); });
  const uint32_t crc_shared = crc_update(0, whole.data(), whole.size() * sizeof(float));
  r.load_shared.bytes = saved.total_bytes;
  if (crc_all != crc_shared)
    fail("benchmark checkpoint: rank {} holds other values after the load as replicas than after reading "
         "everything",
         rank);
  measure_disk();
  if (world) world->barrier();
  if (rank == 0) fs::remove_all(dir / "checkpoints");
  return r;
}

}  // namespace primus::checkpoint
