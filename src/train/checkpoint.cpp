#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/suggest.h"
#include "parallel/process_group.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::train {
namespace {

// Format 1 was one process's flat buffers (model.bin, optimizer.bin); format 2 is sharded.
constexpr int kFormatVersion = 2;
// A shard file: magic, u64 header length, u32 header CRC-32, u32 zero, the JSON header, zeros up
// to a multiple of kDataAlign, then the sections values, exp_avg, exp_avg_sq (numel fp32 each).
constexpr char kMagic[8] = {'P', 'R', 'M', 'S', 'H', 'R', 'D', '2'};
constexpr size_t kPrefixBytes = 24;
constexpr uint64_t kDataAlign = 64;
constexpr int kSections = 3;
const char* const kSectionNames[kSections] = {"values", "exp_avg", "exp_avg_sq"};

uint32_t crc_update(uint32_t crc, const void* data, size_t bytes) {
  uLong c = crc;
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes 32-bit lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    c = crc32(c, p, n);
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}
uint32_t crc_of(const void* data, size_t bytes) { return crc_update(0, data, bytes); }

std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

uint64_t data_offset_for(uint64_t header_bytes) {
  return (kPrefixBytes + header_bytes + kDataAlign - 1) / kDataAlign * kDataAlign;
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail("cannot open {} to sync it: {}", p.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync of {} failed: {}", p.string(), std::strerror(errno));
}

// A file written with plain POSIX calls, so that every error has its errno and fsync is direct.
class FileWriter {
 public:
  explicit FileWriter(fs::path p) : path_(std::move(p)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create {}: {}", path_.string(), std::strerror(errno));
  }
  ~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, 1u << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("writing {} failed: {}", path_.string(), n < 0 ? std::strerror(errno) : "no progress");
      p += n;
      bytes -= size_t(n);
      written_ += uint64_t(n);
    }
  }
  void finish() {  // fsync and close
    if (::fsync(fd_) != 0) fail("fsync of {} failed: {}", path_.string(), std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail("closing {} failed: {}", path_.string(), std::strerror(errno));
  }
  uint64_t written() const { return written_; }

 private:
  fs::path path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

struct Written {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

Written write_whole_file(const fs::path& p, const void* data, size_t bytes) {
  FileWriter w(p);
  w.write(data, bytes);
  w.finish();
  return {bytes, crc_of(data, bytes)};
}

// Fault injection for the crash tests: die like a killed rank right after writing one file.
void maybe_kill_after(const std::string& file) {
  const char* kill_after = std::getenv("PRIMUS_FAULT_CHECKPOINT_KILL_AFTER");
  if (kill_after && file == kill_after) ::raise(SIGKILL);
}

json pieces_json(const std::vector<ShardPiece>& pieces) {
  json a = json::array();
  for (const auto& p : pieces) a.push_back({p.global_start, p.length});
  return a;
}

// Writes this rank's shard file; returns its size and CRC-32. The whole-file CRC is combined from
// the header's and the blocks' CRCs, so the data is checksummed in one pass.
Written write_shard(const fs::path& path, int rank, const ParamStore& params, const float* const data[kSections],
                    int64_t block_bytes) {
  const uint64_t n = uint64_t(params.numel());
  const uint64_t section_bytes = n * sizeof(float);
  json h;
  h["format"] = "primus-shard";
  h["version"] = kFormatVersion;
  h["rank"] = rank;
  h["dtype"] = "float32";
  h["numel"] = n;
  h["block_bytes"] = block_bytes;
  json tensors = json::array();
  for (const StoredParam& p : params.infos())
    tensors.push_back({{"name", p.name},
                       {"shape", p.shape},
                       {"global_shape", p.global_shape},
                       {"offset", p.offset},
                       {"shard_dim", p.shard.pieces.empty() ? -1 : p.shard.dim},
                       {"pieces", pieces_json(p.shard.pieces)}});
  h["tensors"] = tensors;
  std::vector<std::vector<uint32_t>> block_crcs(kSections);
  for (int s = 0; s < kSections; ++s) {
    if (n > 0 && data[s] == nullptr) fail("checkpoint: no {} buffer given for rank {}", kSectionNames[s], rank);
    const char* bytes = reinterpret_cast<const char*>(data[s]);
    for (uint64_t off = 0; off < section_bytes; off += uint64_t(block_bytes))
      block_crcs[s].push_back(crc_of(bytes + off, std::min<uint64_t>(uint64_t(block_bytes), section_bytes - off)));
    h["sections"][kSectionNames[s]] = {{"block_crc32", block_crcs[s]}};
  }
  const std::string header = h.dump();
  char prefix[kPrefixBytes] = {};
  std::memcpy(prefix, kMagic, 8);
  const uint64_t header_bytes = header.size();
  const uint32_t header_crc = crc_of(header.data(), header.size());
  std::memcpy(prefix + 8, &header_bytes, 8);  // little-endian hosts only (x86-64, aarch64)
  std::memcpy(prefix + 16, &header_crc, 4);
  const std::vector<char> pad(data_offset_for(header_bytes) - kPrefixBytes - header_bytes, 0);

  FileWriter w(path);
  w.write(prefix, kPrefixBytes);
  w.write(header.data(), header.size());
  w.write(pad.data(), pad.size());
  uint32_t crc = crc_of(prefix, kPrefixBytes);
  crc = crc_update(crc, header.data(), header.size());
  crc = crc_update(crc, pad.data(), pad.size());
  for (int s = 0; s < kSections; ++s) {
    if (section_bytes > 0) w.write(data[s], section_bytes);
    for (size_t b = 0; b < block_crcs[s].size(); ++b) {
      const uint64_t len = std::min<uint64_t>(uint64_t(block_bytes), section_bytes - b * uint64_t(block_bytes));
      crc = uint32_t(crc32_combine(crc, block_crcs[s][b], z_off_t(len)));
    }
    // Fault injection for the agreement tests: this rank fails halfway through its file.
    const char* fail_rank = std::getenv("PRIMUS_FAULT_CHECKPOINT_FAIL_RANK");
    if (s == 0 && fail_rank && std::atoi(fail_rank) == rank)
      fail("injected failure while writing {} (PRIMUS_FAULT_CHECKPOINT_FAIL_RANK={})", path.string(), rank);
  }
  w.finish();
  return {w.written(), crc};
}

// Reads slices of one shard file: verifies its size, its header's CRC, and the CRC of every block
// it reads (one cached block per section, since slices are read in increasing order).
class ShardReader {
 public:
  ShardReader(fs::path path, uint64_t expected_bytes) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("checkpoint file {} is missing or unreadable: {}", path_.string(), std::strerror(errno));
    const uint64_t size = fs::file_size(path_);
    if (expected_bytes != ~uint64_t(0) && size != expected_bytes)
      fail("checkpoint file {} is truncated or padded: {} bytes, meta.json says {}", path_.string(), size,
           expected_bytes);
    char prefix[kPrefixBytes];
    pread_all(prefix, kPrefixBytes, 0, "its prefix");
    if (std::memcmp(prefix, kMagic, 8) != 0) fail("checkpoint file {} is not a primus shard file (bad magic)", path_.string());
    uint64_t header_bytes = 0;
    uint32_t header_crc = 0;
    std::memcpy(&header_bytes, prefix + 8, 8);
    std::memcpy(&header_crc, prefix + 16, 4);
    if (kPrefixBytes + header_bytes > size)
      fail("checkpoint file {} is truncated: its header says {} bytes of header, the file has {}", path_.string(),
           header_bytes, size);
    std::string text(header_bytes, '\0');
    pread_all(text.data(), header_bytes, kPrefixBytes, "its header");
    if (crc_of(text.data(), text.size()) != header_crc)
      fail("checkpoint file {} is corrupted: its header's CRC-32 does not match", path_.string());
    try {
      header_ = json::parse(text);
      numel_ = header_.at("numel");
      block_bytes_ = header_.at("block_bytes");
      for (int s = 0; s < kSections; ++s)
        block_crcs_[s] = header_.at("sections").at(kSectionNames[s]).at("block_crc32").get<std::vector<uint32_t>>();
    } catch (const json::exception& e) {
      fail("checkpoint file {} has a malformed header: {}", path_.string(), e.what());
    }
    section_bytes_ = numel_ * sizeof(float);
    data_offset_ = data_offset_for(header_bytes);
    const uint64_t blocks = block_bytes_ > 0 ? (section_bytes_ + block_bytes_ - 1) / block_bytes_ : 0;
    if (block_bytes_ == 0 || data_offset_ + kSections * section_bytes_ != size)
      fail("checkpoint file {} is truncated or padded: {} bytes, its header describes {}", path_.string(), size,
           data_offset_ + kSections * section_bytes_);
    for (int s = 0; s < kSections; ++s)
      if (block_crcs_[s].size() != blocks)
        fail("checkpoint file {} has a malformed header: {} block checksums for {}, expected {}", path_.string(),
             block_crcs_[s].size(), kSectionNames[s], blocks);
  }
  ~ShardReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const json& header() const { return header_; }
  uint64_t numel() const { return numel_; }
  const fs::path& path() const { return path_; }

  // Copies `count` floats from element `first` of a section into dst.
  void read(int section, uint64_t first, uint64_t count, float* dst) {
    if (first + count > numel_)
      fail("checkpoint file {}: elements [{}, {}) lie outside its {} elements (meta.json and the file disagree)",
           path_.string(), first, first + count, numel_);
    uint64_t off = first * sizeof(float), left = count * sizeof(float);
    char* out = reinterpret_cast<char*>(dst);
    Block& c = cache_[section];
    while (left > 0) {
      const uint64_t b = off / block_bytes_;
      if (c.index != int64_t(b)) load_block(section, b);
      const uint64_t in_block = off - b * block_bytes_;
      const uint64_t n = std::min<uint64_t>(left, c.bytes.size() - in_block);
      std::memcpy(out, c.bytes.data() + in_block, n);
      out += n;
      off += n;
      left -= n;
    }
  }

 private:
  struct Block {
    int64_t index = -1;
    std::vector<char> bytes;
  };

  void pread_all(void* dst, uint64_t bytes, uint64_t at, const char* what) {
    char* p = static_cast<char*>(dst);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, bytes, off_t(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("reading {} of checkpoint file {} failed: {}", what, path_.string(), std::strerror(errno));
      if (n == 0) fail("checkpoint file {} is truncated: it ends inside {}", path_.string(), what);
      p += n;
      at += uint64_t(n);
      bytes -= uint64_t(n);
    }
  }

  void load_block(int section, uint64_t b) {
    Block& c = cache_[section];
    const uint64_t start = b * block_bytes_;
    c.index = -1;
    c.bytes.resize(std::min<uint64_t>(block_bytes_, section_bytes_ - start));
    const std::string what = fmt::format("block {} of {}", b, kSectionNames[section]);
    pread_all(c.bytes.data(), c.bytes.size(), data_offset_ + uint64_t(section) * section_bytes_ + start, what.c_str());
    if (crc_of(c.bytes.data(), c.bytes.size()) != block_crcs_[section][b])
      fail("checkpoint file {} is corrupted: {} fails its CRC-32", path_.string(), what);
    c.index = int64_t(b);
  }

  fs::path path_;
  int fd_ = -1;
  json header_;
  uint64_t numel_ = 0, block_bytes_ = 0, section_bytes_ = 0, data_offset_ = 0;
  std::vector<uint32_t> block_crcs_[kSections];
  Block cache_[kSections];
};

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("checkpoint file {} is missing or unreadable", p.string());
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// Verifies size and CRC recorded in meta.json, then returns the bytes (small files only).
std::vector<char> read_verified(const fs::path& dir, const json& meta, const std::string& name) {
  if (!meta.contains("files") || !meta["files"].contains(name))
    fail("checkpoint {}: meta.json does not list {}", dir.string(), name);
  const auto& f = meta["files"][name];
  std::vector<char> bytes = read_file(dir / name);
  if (bytes.size() != f.at("bytes").get<size_t>())
    fail("checkpoint file {} is truncated or padded: {} bytes, meta.json says {}", (dir / name).string(), bytes.size(),
         f.at("bytes").get<size_t>());
  if (crc_of(bytes.data(), bytes.size()) != f.at("crc32").get<uint32_t>())
    fail("checkpoint file {} is corrupted: its CRC-32 does not match meta.json", (dir / name).string());
  return bytes;
}

json read_meta(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail("checkpoint folder {} does not exist", dir.string());
  const fs::path p = dir / "meta.json";
  std::vector<char> bytes = read_file(p);
  json meta;
  try {
    meta = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    fail("checkpoint file {} is not valid JSON (truncated or corrupted): {}", p.string(), e.what());
  }
  const int version = meta.is_object() ? meta.value("format_version", 0) : 0;
  if (version == 1)
    fail("checkpoint {} is in format 1 (one process's flat buffers), which this version no longer reads; "
         "it reads format {}",
         dir.string(), kFormatVersion);
  if (version != kFormatVersion)
    fail("checkpoint {}: format_version {} is not the supported {}", dir.string(), version, kFormatVersion);
  return meta;
}

// ---- resharding -------------------------------------------------------------------------------

struct Interval {
  int64_t a = 0, b = 0;  // [a, b)
};

// Parts of `x` not covered by `covered` (sorted, disjoint).
std::vector<Interval> subtract(Interval x, const std::vector<Interval>& covered) {
  std::vector<Interval> out;
  int64_t at = x.a;
  for (const Interval& c : covered) {
    if (c.b <= at) continue;
    if (c.a >= x.b) break;
    if (c.a > at) out.push_back({at, c.a});
    at = std::max(at, c.b);
    if (at >= x.b) break;
  }
  if (at < x.b) out.push_back({at, x.b});
  return out;
}

void insert(std::vector<Interval>& covered, Interval x) {
  covered.push_back(x);
  std::sort(covered.begin(), covered.end(), [](const Interval& l, const Interval& r) { return l.a < r.a; });
  std::vector<Interval> merged;
  for (const Interval& c : covered) {
    if (!merged.empty() && c.a <= merged.back().b)
      merged.back().b = std::max(merged.back().b, c.b);
    else
      merged.push_back(c);
  }
  covered = std::move(merged);
}

// A slice of a global tensor: its local tensor concatenates, along dim, the pieces (global start,
// length); local_start[i] is where piece i begins in the local tensor. dim -1: the whole tensor.
struct Placement {
  Shape shape;  // local
  int dim = -1;
  std::vector<ShardPiece> pieces;
  std::vector<int64_t> local_start;
};

// One saved slice of a tensor: where it lives and what it holds.
struct Entry {
  std::string file;
  int64_t offset = 0;  // elements, into the file's sections
  Placement place;
};

Placement make_placement(Shape shape, int dim, std::vector<ShardPiece> pieces) {
  Placement p;
  p.shape = std::move(shape);
  p.dim = pieces.empty() ? -1 : dim;
  p.pieces = std::move(pieces);
  int64_t at = 0;
  for (const ShardPiece& pc : p.pieces) {
    p.local_start.push_back(at);
    at += pc.length;
  }
  return p;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::string describe(const Placement& p) {
  if (p.dim < 0) return "whole";
  std::vector<std::string> parts;
  for (const ShardPiece& pc : p.pieces) parts.push_back(fmt::format("[{}, {})", pc.global_start, pc.global_start + pc.length));
  return fmt::format("dim {} {}", p.dim, fmt::join(parts, "+"));
}

// Checks that a placement is possible for a tensor of `global` shape; returns the problem or "".
std::string placement_problem(const Placement& p, const Shape& global) {
  if (p.shape.size() != global.size())
    return fmt::format("local shape {} has another rank than the global {}", shape_str(p.shape), shape_str(global));
  if (p.dim >= int(global.size())) return fmt::format("shard dim {} out of range", p.dim);
  int64_t sum = 0;
  for (const ShardPiece& pc : p.pieces) {
    if (pc.global_start < 0 || pc.length <= 0 || pc.global_start + pc.length > global[p.dim])
      return fmt::format("piece [{}, +{}) outside dim {} of size {}", pc.global_start, pc.length, p.dim, global[p.dim]);
    sum += pc.length;
  }
  for (size_t k = 0; k < global.size(); ++k) {
    const int64_t want = int(k) == p.dim ? sum : global[k];
    if (p.shape[k] != want)
      return fmt::format("local shape {} does not match its pieces ({})", shape_str(p.shape), describe(p));
  }
  return "";
}

// The work of filling one target placement from saved entries: calls copy(entry, box_lo, box_hi,
// src_shift, dst_shift) for disjoint boxes that together cover the target, reading each global
// element once (replicas and overlapping slices are skipped), and returns the ranges along the
// saved dim that no entry covers (empty: complete). All saved slices of one tensor share a dim
// (they come from one layout), so coverage is tracked along that dim only.
using CopyFn = std::function<void(const Entry&, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                                  const std::vector<int64_t>& src_shift, const std::vector<int64_t>& dst_shift)>;

struct PlanResult {
  int dim = 0;
  std::vector<Interval> gaps;
};

PlanResult plan(const std::string& tensor, const Shape& global, const Placement& target,
                const std::vector<const Entry*>& entries, const CopyFn& copy) {
  if (global.empty()) {  // a scalar: any copy holds all of it
    if (entries.empty()) return {0, {{0, 1}}};
    copy(*entries.front(), {}, {}, {}, {});
    return {0, {}};
  }
  int ds = -1;
  for (const Entry* e : entries) {
    if (e->place.dim < 0) continue;
    if (ds >= 0 && e->place.dim != ds)
      fail("tensor {} is split along dim {} in {} but along dim {} in another file; one checkpoint has one layout",
           tensor, e->place.dim, e->file, ds);
    ds = e->place.dim;
  }
  if (ds < 0) ds = target.dim >= 0 ? target.dim : 0;
  const int dt = target.dim;

  struct Need {
    Interval range;
    int64_t local_start = 0;
    std::vector<Interval> covered;
  };
  std::vector<Need> needs;
  if (dt == ds)
    for (size_t i = 0; i < target.pieces.size(); ++i)
      needs.push_back({{target.pieces[i].global_start, target.pieces[i].global_start + target.pieces[i].length},
                       target.local_start[i], {}});
  else  // the target holds all of dim ds
    needs.push_back({{0, global[ds]}, 0, {}});

  // Whole copies first: one file then serves the tensor.
  std::vector<const Entry*> order(entries);
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* l, const Entry* r) { return (l->place.dim < 0) > (r->place.dim < 0); });
  const size_t R = global.size();
  for (const Entry* e : order) {
    std::vector<ShardPiece> src_pieces = e->place.pieces;
    std::vector<int64_t> src_local = e->place.local_start;
    if (e->place.dim < 0) {
      src_pieces = {{0, global[ds]}};
      src_local = {0};
    }
    for (size_t sp = 0; sp < src_pieces.size(); ++sp) {
      const Interval s{src_pieces[sp].global_start, src_pieces[sp].global_start + src_pieces[sp].length};
      for (Need& need : needs) {
        const Interval x{std::max(s.a, need.range.a), std::min(s.b, need.range.b)};
        if (x.a >= x.b) continue;
        for (const Interval& sub : subtract(x, need.covered)) {
          std::vector<int64_t> lo(R, 0), hi(global.begin(), global.end()), src_shift(R, 0), dst_shift(R, 0);
          lo[ds] = sub.a;
          hi[ds] = sub.b;
          src_shift[ds] = src_local[sp] - s.a;
          dst_shift[ds] = need.local_start - need.range.a;
          if (dt >= 0 && dt != ds) {
            for (size_t tp = 0; tp < target.pieces.size(); ++tp) {
              lo[dt] = target.pieces[tp].global_start;
              hi[dt] = lo[dt] + target.pieces[tp].length;
              dst_shift[dt] = target.local_start[tp] - lo[dt];
              copy(*e, lo, hi, src_shift, dst_shift);
            }
          } else {
            copy(*e, lo, hi, src_shift, dst_shift);
          }
          insert(need.covered, sub);
        }
      }
    }
  }
  PlanResult r;
  r.dim = ds;
  for (const Need& need : needs)
    for (const Interval& g : subtract(need.range, need.covered)) r.gaps.push_back(g);
  return r;
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int k = int(s.size()) - 2; k >= 0; --k) st[k] = st[k + 1] * s[k + 1];
  return st;
}

// Calls run(src_offset, dst_offset, count) for the contiguous runs of the box [lo, hi) of a global
// tensor, in increasing source order; local coordinate = global + shift on each side.
void for_each_run(const Shape& src_shape, const Shape& dst_shape, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, const std::vector<int64_t>& src_shift,
                  const std::vector<int64_t>& dst_shift,
                  const std::function<void(int64_t, int64_t, int64_t)>& run) {
  const int R = int(lo.size());
  if (R == 0) return run(0, 0, 1);
  // Dims after the deepest restricted or shifted one are whole on both sides: one run spans them.
  int m = 0;
  for (int k = 0; k < R; ++k)
    if (lo[k] != 0 || hi[k] != src_shape[k] || hi[k] != dst_shape[k] || src_shift[k] != 0 || dst_shift[k] != 0) m = k;
  const std::vector<int64_t> ss = strides_of(src_shape), ds = strides_of(dst_shape);
  const int64_t count = (hi[m] - lo[m]) * ss[m];  // ss[m] == ds[m]: the dims after m match
  for (int k = 0; k <= m; ++k)
    if (hi[k] <= lo[k]) return;
  std::vector<int64_t> x(lo.begin(), lo.begin() + m);
  while (true) {
    int64_t so = (lo[m] + src_shift[m]) * ss[m], d = (lo[m] + dst_shift[m]) * ds[m];
    for (int k = 0; k < m; ++k) {
      so += (x[k] + src_shift[k]) * ss[k];
      d += (x[k] + dst_shift[k]) * ds[k];
    }
    run(so, d, count);
    int k = m - 1;
    for (; k >= 0; --k) {
      if (++x[k] < hi[k]) break;
      x[k] = lo[k];
    }
    if (k < 0) return;
  }
}

Placement placement_json(const json& t) {
  std::vector<ShardPiece> pieces;
  for (const auto& p : t.at("pieces")) pieces.push_back({p.at(0).get<int64_t>(), p.at(1).get<int64_t>()});
  return make_placement(t.at("shape").get<Shape>(), t.at("shard_dim").get<int>(), std::move(pieces));
}

// Each saved tensor: its global shape and its slices, as meta.json indexes them.
struct SavedTensor {
  Shape global;
  std::vector<Entry> entries;
};

std::map<std::string, SavedTensor> parse_index(const fs::path& dir, const json& meta) {
  std::map<std::string, SavedTensor> index;
  try {
    for (const auto& [name, t] : meta.at("tensors").items()) {
      SavedTensor& st = index[name];
      st.global = t.at("global_shape").get<Shape>();
      for (const auto& s : t.at("shards")) {
        Entry e;
        e.file = s.at("file").get<std::string>();
        e.offset = s.at("offset").get<int64_t>();
        e.place = placement_json(s);
        const std::string problem = placement_problem(e.place, st.global);
        if (!problem.empty() || e.offset < 0)
          fail("checkpoint {}: meta.json's entry for tensor {} in {} is inconsistent: {}", dir.string(), name, e.file,
               problem.empty() ? "negative offset" : problem);
        if (!meta.at("files").contains(e.file))
          fail("checkpoint {}: tensor {} is said to be in {}, which meta.json does not list", dir.string(), name,
               e.file);
        st.entries.push_back(std::move(e));
      }
    }
  } catch (const json::exception& e) {
    fail("checkpoint {}/meta.json is malformed: {}", dir.string(), e.what());
  }
  return index;
}

std::string files_holding(const SavedTensor& st) {
  std::vector<std::string> parts;
  for (const Entry& e : st.entries) parts.push_back(fmt::format("{} ({})", e.file, describe(e.place)));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

std::string gaps_str(const PlanResult& r) {
  std::vector<std::string> parts;
  for (const Interval& g : r.gaps) parts.push_back(fmt::format("[{}, {})", g.a, g.b));
  return fmt::format("{} along dim {}", fmt::join(parts, ", "), r.dim);
}

CheckpointData load_local(const fs::path& dir, const ParamStore& params, bool optimizer) {
  const json meta = read_meta(dir);
  CheckpointData out;
  try {
    out.state.iteration = meta.at("iteration");
    out.state.consumed_samples = meta.at("consumed_samples");
    out.state.optimizer_step = meta.at("optimizer_step");
    out.state.seed = meta.at("seed");
    const json& l = meta.at("layout");
    out.saved_layout = {l.at("world_size").get<int>(), l.at("tp").get<int>(), l.at("pp").get<int>(),
                        l.at("dp").get<int>(),         l.at("cp").get<int>(), l.at("vpp").get<int>()};
  } catch (const json::exception& e) {
    fail("checkpoint {}/meta.json is missing a field: {}", dir.string(), e.what());
  }
  const std::map<std::string, SavedTensor> index = parse_index(dir, meta);
  std::vector<std::string> names;
  for (const auto& [name, st] : index) names.push_back(name);

  const size_t n = size_t(params.numel());
  out.params.assign(n, 0.0f);
  if (optimizer) {
    out.exp_avg.assign(n, 0.0f);
    out.exp_avg_sq.assign(n, 0.0f);
  }
  float* dst[kSections] = {out.params.data(), out.exp_avg.data(), out.exp_avg_sq.data()};
  const int sections = optimizer ? kSections : 1;

  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  auto reader = [&](const std::string& file) -> ShardReader& {
    auto& r = readers[file];
    if (!r) r = std::make_unique<ShardReader>(dir / file, meta.at("files").at(file).at("bytes").get<uint64_t>());
    return *r;
  };

  for (const StoredParam& info : params.infos()) {
    auto it = index.find(info.name);
    if (it == index.end())
      fail("checkpoint {} has no tensor {}{}", dir.string(), info.name, did_you_mean(info.name, names));
    const SavedTensor& st = it->second;
    if (st.global != info.global_shape)
      fail("checkpoint {}: tensor {} has global shape {} there ({}) but {} in the model", dir.string(), info.name,
           shape_str(st.global), files_holding(st), shape_str(info.global_shape));
    const Placement target = make_placement(info.shape, info.shard.dim, info.shard.pieces);
    std::vector<const Entry*> entries;
    for (const Entry& e : st.entries) entries.push_back(&e);
    const PlanResult r = plan(info.name, st.global, target, entries,
                              [&](const Entry& e, const auto& lo, const auto& hi, const auto& ss, const auto& dsh) {
                                ShardReader& rd = reader(e.file);
                                if (uint64_t(e.offset + numel_of(e.place.shape)) > rd.numel())
                                  fail("checkpoint {}: tensor {} lies outside {} ({} elements)", dir.string(),
                                       info.name, e.file, rd.numel());
                                for_each_run(e.place.shape, info.shape, lo, hi, ss, dsh,
                                             [&](int64_t so, int64_t d, int64_t count) {
                                               PRIMUS_CHECK(so >= 0 && so + count <= numel_of(e.place.shape) &&
                                                                d >= 0 && d + count <= info.numel,
                                                            "tensor {}: copy run outside a local tensor", info.name);
                                               for (int s = 0; s < sections; ++s)
                                                 rd.read(s, uint64_t(e.offset + so), uint64_t(count),
                                                         dst[s] + info.offset + d);
                                             });
                              });
    if (!r.gaps.empty())
      fail("checkpoint {}: tensor {} (global shape {}) is not fully covered: {} is in none of its files ({})",
           dir.string(), info.name, shape_str(st.global), gaps_str(r), files_holding(st));
  }
  std::vector<char> config = read_verified(dir, meta, "config.yaml");
  out.config_yaml.assign(config.begin(), config.end());
  return out;
}

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

}  // namespace

std::string checkpoint_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string save_checkpoint(const std::string& save_dir, const ParamStore& params, const float* exp_avg,
                            const float* exp_avg_sq, const TrainState& state, const std::string& config_yaml,
                            const SaveOptions& opt) {
  parallel::ProcessGroup* world = opt.world;
  const int rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  const std::string name = checkpoint_name(state.iteration);
  const fs::path root(save_dir), final_dir = root / name, tmp = root / fmt::format(".{}.tmp", name);
  const std::string what = fmt::format("checkpoint {} not saved", final_dir.string());

  // 1. Rank 0 makes the temporary folder; the others wait for it.
  std::string err;
  if (rank == 0)
    err = caught([&] {
      fs::create_directories(root);
      // Temporary folders left by writers that died are garbage: no `latest` ever named them.
      for (const auto& e : fs::directory_iterator(root))
        if (e.path().filename().string().starts_with(".iter_")) fs::remove_all(e.path());
      fs::create_directories(tmp);
    });
  raise_if_failed(failed_ranks(world, err.empty()), err, what);

  // 2. Writers write their shard file and fsync it; everyone shares (ok, writer, bytes, crc).
  Written mine;
  err = caught([&] {
    if (opt.block_bytes <= 0) fail("checkpoint block_bytes must be positive, not {}", opt.block_bytes);
    if (!opt.writer) return;
    // A store on the GPU (bf16 mixed precision) is written from a host copy of its master weights.
    const Tensor values = params.device() == Device::CPU ? params.values() : params.values().to(Device::CPU);
    const float* data[kSections] = {values.data<float>(), exp_avg, exp_avg_sq};
    mine = write_shard(tmp / shard_file_name(rank), rank, params, data, opt.block_bytes);
  });
  if (err.empty() && opt.writer) maybe_kill_after(shard_file_name(rank));
  const int64_t record[4] = {err.empty() ? 1 : 0, opt.writer ? 1 : 0, int64_t(mine.bytes), int64_t(mine.crc)};
  std::vector<int64_t> records(4 * size_t(size));
  if (world)
    world->all_gather(record, records.data(), 4, parallel::CommType::I64);
  else
    std::copy(record, record + 4, records.begin());
  std::vector<int> failed;
  for (int r = 0; r < size; ++r)
    if (records[4 * r] == 0) failed.push_back(r);
  if (!failed.empty() && rank == 0) {
    std::error_code ec;  // best effort: the next save removes it anyway
    fs::remove_all(tmp, ec);
  }
  raise_if_failed(failed, err, what);

  // 3. Rank 0 indexes the shards, writes config.yaml and meta.json, renames, moves `latest`.
  err = "";
  if (rank == 0)
    err = caught([&] {
      json meta;
      meta["format_version"] = kFormatVersion;
      meta["iteration"] = state.iteration;
      meta["consumed_samples"] = state.consumed_samples;
      meta["optimizer_step"] = state.optimizer_step;
      meta["seed"] = state.seed;
      meta["layout"] = {{"world_size", size},    {"tp", opt.layout.tp}, {"pp", opt.layout.pp},
                        {"dp", opt.layout.dp},   {"cp", opt.layout.cp}, {"vpp", opt.layout.vpp}};
      json files = json::object(), tensors = json::object();
      for (int r = 0; r < size; ++r) {
        if (records[4 * r + 1] == 0) continue;
        const std::string file = shard_file_name(r);
        files[file] = {{"bytes", records[4 * r + 2]}, {"crc32", records[4 * r + 3]}, {"rank", r}};
        ShardReader rd(tmp / file, uint64_t(records[4 * r + 2]));
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
                                     {"shape", t.at("shape")},
                                     {"shard_dim", t.at("shard_dim")},
                                     {"pieces", t.at("pieces")}});
        }
      }
      if (files.empty()) fail("no rank is a writer (SaveOptions::writer is false everywhere)");
      meta["files"] = files;
      meta["tensors"] = tensors;
      // Every tensor saved must be whole across the files: a rank wrongly marked as no writer
      // shows here, at save time, not at the next load.
      for (const auto& [name_, st] : parse_index(tmp, meta)) {
        std::vector<const Entry*> entries;
        for (const Entry& e : st.entries) entries.push_back(&e);
        const PlanResult r =
            plan(name_, st.global, make_placement(st.global, -1, {}), entries, [](auto&&...) {});
        if (!r.gaps.empty())
          fail("tensor {} is not fully saved: {} is in no rank's file ({}); is every tensor-parallel rank and "
               "pipeline stage a writer?",
               name_, gaps_str(r), files_holding(st));
      }
      const Written cfg = write_whole_file(tmp / "config.yaml", config_yaml.data(), config_yaml.size());
      meta["files"]["config.yaml"] = {{"bytes", cfg.bytes}, {"crc32", cfg.crc}};
      maybe_kill_after("config.yaml");
      const std::string meta_text = meta.dump(1);
      write_whole_file(tmp / "meta.json", meta_text.data(), meta_text.size());
      fsync_path(tmp, true);

      if (fs::exists(final_dir)) fs::remove_all(final_dir);  // re-saving the same iteration after a restart
      fs::rename(tmp, final_dir);
      fsync_path(root, true);

      const std::string latest = name + "\n";
      write_whole_file(root / ".latest.tmp", latest.data(), latest.size());
      fs::rename(root / ".latest.tmp", root / "latest");
      fsync_path(root, true);
    });
  if (!err.empty() && rank == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  raise_if_failed(failed_ranks(world, err.empty()), err, what);
  return final_dir.string();
}

CheckpointData load_checkpoint(const std::string& dir, const ParamStore& params, const LoadOptions& opt) {
  CheckpointData out;
  const std::string err = caught([&] { out = load_local(fs::path(dir), params, opt.optimizer); });
  raise_if_failed(failed_ranks(opt.world, err.empty()), err, fmt::format("checkpoint {} not loaded", dir));
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

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  if (fs::is_regular_file(p / "meta.json")) return p.string();
  if (fs::is_regular_file(p / "latest")) {
    std::ifstream in(p / "latest");
    std::string name;
    in >> name;
    if (name.empty()) fail("{}/latest is empty", p.string());
    return (p / name).string();
  }
  if (!fs::exists(p)) fail("checkpoint path {} does not exist", p.string());
  fail("{} is neither a checkpoint folder (no meta.json) nor a save folder (no latest file)", p.string());
}

std::vector<std::string> list_checkpoints(const std::string& save_dir) {
  std::vector<std::string> out;
  const fs::path root(save_dir);
  if (!fs::is_directory(root)) return out;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.starts_with("iter_")) names.push_back(n);
  }
  std::sort(names.rbegin(), names.rend());  // zero-padded: lexical order is numeric order
  if (fs::is_regular_file(root / "latest")) {
    std::ifstream in(root / "latest");
    std::string latest;
    in >> latest;
    auto it = std::find(names.begin(), names.end(), latest);
    if (it != names.end()) std::rotate(names.begin(), it, it + 1);
  }
  for (const auto& n : names) out.push_back((root / n).string());
  return out;
}

void prune_checkpoints(const std::string& save_dir, int64_t keep) {
  if (keep <= 0) return;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(save_dir))
    if (e.is_directory() && e.path().filename().string().starts_with("iter_")) names.push_back(e.path().string());
  std::sort(names.rbegin(), names.rend());
  for (size_t i = static_cast<size_t>(keep); i < names.size(); ++i) fs::remove_all(names[i]);
}

}  // namespace primus::train
