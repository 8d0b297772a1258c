#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/suggest.h"
#include "parallel/process_group.h"
#include "safe/disk.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::train {
namespace {

// Format 1 was one process's flat buffers (model.bin, optimizer.bin); format 2 is sharded; format 3
// adds the checkpoint's identity (run id and iteration) to every shard header and to meta.json,
// the save order, and a checksum over meta.json itself. Format 2 is still read (without those checks).
constexpr int kFormatVersion = 3;
constexpr int kOldestReadVersion = 2;
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
  explicit FileWriter(fs::path p, uint64_t expected_bytes = 0) : path_(std::move(p)), expected_(expected_bytes) {
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
      if (n <= 0) safe::fail_write(path_.string(), n < 0 ? errno : ENOSPC, std::max(expected_, written_ + bytes) - written_);
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
  uint64_t expected_ = 0;  // the file's final size, for "bytes needed" in a write error
  int fd_ = -1;
  uint64_t written_ = 0;
};

struct Written {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

Written write_whole_file(const fs::path& p, const void* data, size_t bytes) {
  FileWriter w(p, bytes);
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
Written write_shard(const fs::path& path, int rank, const TrainState& state, const ParamStore& params,
                    const float* const data[kSections], int64_t block_bytes) {
  const uint64_t n = uint64_t(params.numel());
  const uint64_t section_bytes = n * sizeof(float);
  json h;
  h["format"] = "primus-shard";
  h["version"] = kFormatVersion;
  h["rank"] = rank;
  h["run_id"] = state.run_id;  // ties the shard to its meta.json
  h["iteration"] = state.iteration;
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
  const uint64_t file_bytes = data_offset_for(header_bytes) + kSections * section_bytes;
  safe::require_free(path.parent_path().string(), file_bytes, "checkpoint shard " + path.filename().string() + " in");

  FileWriter w(path, file_bytes);
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
    if (s == 0) maybe_kill_after(path.filename().string() + ":half");  // crash tests: a half-written shard
    // Fault injection for the agreement tests: this rank fails halfway through its file.
    const char* fail_rank = std::getenv("PRIMUS_FAULT_CHECKPOINT_FAIL_RANK");
    if (s == 0 && fail_rank && std::atoi(fail_rank) == rank)
      fail("injected failure while writing {} (PRIMUS_FAULT_CHECKPOINT_FAIL_RANK={})", path.string(), rank);
  }
  w.finish();
  return {w.written(), crc};
}

// Checkpoint JSON (meta.json, shard headers) holds integers and strings only; a floating-point
// number there is damage, and converting one to an integer would be undefined (1e79 to uint64).
void reject_floats(const json& root, const std::string& name) {
  std::vector<const json*> todo{&root};  // iterative: nesting depth is the input's to choose
  while (!todo.empty()) {
    const json& j = *todo.back();
    todo.pop_back();
    if (j.is_number_float()) fail("checkpoint file {} is malformed: a non-integer number ({})", name, j.dump());
    if (j.is_structured())
      for (const auto& v : j) todo.push_back(&v);
  }
}

// A shard file's parsed prefix and header, checked for consistency with the file's size.
struct ShardHeader {
  json header;
  std::string run_id;  // "" in format 2
  int64_t iteration = -1;
  uint64_t numel = 0, block_bytes = 0, section_bytes = 0, data_offset = 0;
  std::vector<uint32_t> block_crcs[kSections];
  uint32_t head_crc = 0;  // CRC-32 of the bytes before the data (prefix, header, padding)
};

// Reads the 24-byte prefix `prefix` and returns the header length it announces, checked against
// the file's size.
uint64_t header_length(const char* prefix, uint64_t size, const std::string& name) {
  if (std::memcmp(prefix, kMagic, 8) != 0) fail("checkpoint file {} is not a primus shard file (bad magic)", name);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, prefix + 8, 8);
  if (size < kPrefixBytes || header_bytes > size - kPrefixBytes)
    fail("checkpoint file {} is truncated: its header says {} bytes of header, the file has {}", name, header_bytes,
         size);
  return header_bytes;
}

ShardHeader parse_header(const char* prefix, const std::string& text, uint64_t size, const std::string& name) {
  ShardHeader h;
  uint32_t header_crc = 0;
  std::memcpy(&header_crc, prefix + 16, 4);
  if (crc_of(text.data(), text.size()) != header_crc)
    fail("checkpoint file {} is corrupted: its header's CRC-32 does not match", name);
  try {
    h.header = json::parse(text);
    reject_floats(h.header, name);
    h.numel = h.header.at("numel");
    h.block_bytes = h.header.at("block_bytes");
    const int version = h.header.value("version", 0);
    if (version >= 3) {
      h.run_id = h.header.at("run_id").get<std::string>();
      h.iteration = h.header.at("iteration").get<int64_t>();
    }
    for (int s = 0; s < kSections; ++s)
      h.block_crcs[s] = h.header.at("sections").at(kSectionNames[s]).at("block_crc32").get<std::vector<uint32_t>>();
    if (!h.header.at("tensors").is_array()) fail("checkpoint file {} has a malformed header: tensors is not a list", name);
  } catch (const json::exception& e) {
    fail("checkpoint file {} has a malformed header: {}", name, e.what());
  }
  if (h.numel > size / (kSections * sizeof(float)))
    fail("checkpoint file {} is truncated or corrupt: its header claims {} elements in {} bytes", name, h.numel, size);
  h.section_bytes = h.numel * sizeof(float);
  h.data_offset = data_offset_for(text.size());
  const uint64_t blocks = h.block_bytes > 0 ? (h.section_bytes + h.block_bytes - 1) / h.block_bytes : 0;
  if (h.block_bytes == 0 || h.data_offset + kSections * h.section_bytes != size)
    fail("checkpoint file {} is truncated or padded: {} bytes, its header describes {}", name, size,
         h.data_offset + kSections * h.section_bytes);
  for (int s = 0; s < kSections; ++s)
    if (h.block_crcs[s].size() != blocks)
      fail("checkpoint file {} has a malformed header: {} block checksums for {}, expected {}", name,
           h.block_crcs[s].size(), kSectionNames[s], blocks);
  const std::vector<char> pad(h.data_offset - kPrefixBytes - text.size(), 0);
  h.head_crc = crc_update(crc_update(crc_of(prefix, kPrefixBytes), text.data(), text.size()), pad.data(), pad.size());
  return h;
}

// The whole file's CRC-32 as the header's checksums describe it: the head's CRC combined with the
// CRC of every block. Every block a reader uses is checked against its block CRC, so data read
// through a shard whose described CRC equals meta.json's is the data meta.json recorded.
uint32_t described_file_crc(const ShardHeader& h) {
  uint32_t crc = h.head_crc;
  for (int s = 0; s < kSections; ++s)
    for (size_t b = 0; b < h.block_crcs[s].size(); ++b) {
      const uint64_t len = std::min<uint64_t>(h.block_bytes, h.section_bytes - b * h.block_bytes);
      crc = uint32_t(crc32_combine(crc, h.block_crcs[s][b], z_off_t(len)));
    }
  return crc;
}

// What a reader expects of a shard: from meta.json.
struct ShardExpect {
  uint64_t bytes = ~uint64_t(0);  // ~0: unknown (at save, reading a shard just written)
  std::optional<uint32_t> crc;    // the whole file's CRC-32
  std::optional<std::string> run_id;
  int64_t iteration = -1;
};

// Reads slices of one shard file: verifies its size, its header's CRC, that it belongs to its
// meta.json (run id, iteration, whole-file CRC), and the CRC of every block it reads (one cached
// block per section, since slices are read in increasing order).
class ShardReader {
 public:
  ShardReader(fs::path path, const ShardExpect& expect) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("checkpoint file {} is missing or unreadable: {}", path_.string(), std::strerror(errno));
    const uint64_t size = fs::file_size(path_);
    if (expect.bytes != ~uint64_t(0) && size != expect.bytes)
      fail("checkpoint file {} is truncated or padded: {} bytes, meta.json says {}", path_.string(), size,
           expect.bytes);
    char prefix[kPrefixBytes];
    pread_all(prefix, kPrefixBytes, 0, "its prefix");
    const uint64_t header_bytes = header_length(prefix, size, path_.string());
    std::string text(header_bytes, '\0');
    pread_all(text.data(), header_bytes, kPrefixBytes, "its header");
    ShardHeader h = parse_header(prefix, text, size, path_.string());
    if (expect.run_id && (h.run_id != *expect.run_id || h.iteration != expect.iteration))
      fail("checkpoint file {} does not belong to its checkpoint: it was saved by run '{}' at iteration {}, "
           "meta.json is of run '{}' at iteration {} (a shard copied from another checkpoint?)",
           path_.string(), h.run_id, h.iteration, *expect.run_id, expect.iteration);
    if (expect.crc && described_file_crc(h) != *expect.crc)
      fail("checkpoint file {} does not match its meta.json: its CRC-32 differs from the one recorded at save "
           "(a shard copied from another checkpoint or rank, or a damaged one)",
           path_.string());
    header_ = std::move(h.header);
    numel_ = h.numel;
    block_bytes_ = h.block_bytes;
    section_bytes_ = h.section_bytes;
    data_offset_ = h.data_offset;
    for (int s = 0; s < kSections; ++s) block_crcs_[s] = std::move(h.block_crcs[s]);
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

// meta.json's own checksum: the CRC-32 of its compact form without the field that holds it.
uint32_t meta_checksum(json meta) {
  meta.erase("meta_crc32");
  const std::string text = meta.dump();
  return crc_of(text.data(), text.size());
}

// Parses and checks meta.json's text (`name` for messages): JSON, format version, its checksum.
json parse_meta_text(const std::string& text, const std::string& name, const std::string& dir) {
  json meta;
  try {
    meta = json::parse(text);
  } catch (const json::exception& e) {
    fail("checkpoint file {} is not valid JSON (truncated or corrupted): {}", name, e.what());
  }
  reject_floats(meta, name);
  const json* v = meta.is_object() && meta.contains("format_version") ? &meta["format_version"] : nullptr;
  const int version = v && v->is_number_integer() ? v->get<int>() : 0;
  if (version == 1)
    fail("checkpoint {} is in format 1 (one process's flat buffers), which this version no longer reads; "
         "it reads formats {} to {}",
         dir, kOldestReadVersion, kFormatVersion);
  if (version < kOldestReadVersion || version > kFormatVersion)
    fail("checkpoint {}: format_version {} is not one of the supported {} to {}", dir, v ? v->dump() : "(none)",
         kOldestReadVersion, kFormatVersion);
  if (version >= 3) {
    const json* c = meta.contains("meta_crc32") ? &meta["meta_crc32"] : nullptr;
    if (!c || !c->is_number_unsigned() || c->get<uint64_t>() != meta_checksum(meta))
      fail("checkpoint file {} was altered or damaged: its checksum (meta_crc32) does not match its contents", name);
    try {
      (void)meta.at("run_id").get<std::string>();
      (void)meta.at("iteration").get<int64_t>();
      (void)meta.at("save_seq").get<int64_t>();
    } catch (const json::exception& e) {
      fail("checkpoint file {} is missing a field: {}", name, e.what());
    }
  }
  if (!meta.contains("files") || !meta["files"].is_object())
    fail("checkpoint file {} lists no files", name);
  try {
    for (const auto& [file, f] : meta["files"].items()) {
      (void)f.at("bytes").get<uint64_t>();
      (void)f.at("crc32").get<uint32_t>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        fail("checkpoint file {} names a file outside its folder: '{}'", name, file);
    }
  } catch (const json::exception& e) {
    fail("checkpoint file {} is malformed: {}", name, e.what());
  }
  return meta;
}

json read_meta(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail("checkpoint folder {} does not exist", dir.string());
  const fs::path p = dir / "meta.json";
  std::vector<char> bytes = read_file(p);
  return parse_meta_text(std::string(bytes.begin(), bytes.end()), p.string(), dir.string());
}

// What meta.json says about one of its shard files.
ShardExpect shard_expect(const json& meta, const std::string& file) {
  ShardExpect e;
  const json& f = meta.at("files").at(file);
  e.bytes = f.at("bytes").get<uint64_t>();
  e.crc = f.at("crc32").get<uint32_t>();
  if (meta.at("format_version").get<int>() >= 3) {
    e.run_id = meta.at("run_id").get<std::string>();
    e.iteration = meta.at("iteration").get<int64_t>();
  }
  return e;
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
  if (!p.pieces.empty() && (p.dim < 0 || p.dim >= int(global.size())))
    return fmt::format("shard dim {} out of range", p.dim);
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
    out.state.run_id = meta.value("run_id", std::string());
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
    if (!r) r = std::make_unique<ShardReader>(dir / file, shard_expect(meta, file));
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

// The identity in a checkpoint folder's meta.json, or nullopt when it cannot be read or verified.
std::optional<CheckpointIdentity> identity_of(const fs::path& dir) {
  try {
    const json meta = read_meta(dir);
    return CheckpointIdentity{meta.value("run_id", std::string()), meta.at("iteration").get<int64_t>(),
                              meta.value("save_seq", int64_t(0))};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::vector<fs::path> checkpoint_folders(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string().starts_with("iter_")) out.push_back(e.path());
  return out;
}

std::string latest_name(const fs::path& root) {
  std::ifstream in(root / "latest");
  std::string name;
  in >> name;
  return name;
}

// One more than the highest save_seq in the folder: the order of saves, whatever the iterations.
int64_t next_save_seq(const fs::path& root) {
  int64_t seq = 0;
  for (const fs::path& d : checkpoint_folders(root))
    if (auto id = identity_of(d)) seq = std::max(seq, id->save_seq);
  return seq + 1;
}

// A save may replace a checkpoint folder of its own run (a restart redoing iterations); another
// run's only with `overwrite`. A folder whose meta.json cannot be read is moved aside, not deleted.
void replace_check(const fs::path& final_dir, const std::string& run_id, bool overwrite) {
  if (!fs::exists(final_dir) || overwrite) return;
  const auto id = identity_of(final_dir);
  if (!id) {
    const fs::path aside = final_dir.parent_path() /
                           fmt::format("damaged_{}_{}", final_dir.filename().string(), std::time(nullptr));
    fs::rename(final_dir, aside);
    fsync_path(final_dir.parent_path(), true);
    return;
  }
  if (id->run_id != run_id)
    fail("{} holds a checkpoint of another run ('{}'{}), which this run ('{}') would overwrite; pass --overwrite "
         "to replace it, or choose another save path",
         final_dir.string(), id->run_id.empty() ? "(before run ids)" : id->run_id,
         id->run_id.empty() ? "" : fmt::format(", saved as save {}", id->save_seq), run_id);
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

  // 1. Rank 0 checks that the save replaces no other run's checkpoint and makes the temporary
  // folder; the others wait for it.
  std::string err;
  int64_t save_seq = 0;
  if (rank == 0)
    err = caught([&] {
      if (state.run_id.empty()) fail("checkpoint: the training state has no run id (new_run_id())");
      if (fs::exists(root) && !fs::is_directory(root))
        fail("the save path {} is a file, not a folder: checkpoints cannot be written there", root.string());
      fs::create_directories(root);
      replace_check(final_dir, state.run_id, opt.overwrite);
      save_seq = next_save_seq(root);
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
    mine = write_shard(tmp / shard_file_name(rank), rank, state, params, data, opt.block_bytes);
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
      meta["run_id"] = state.run_id;
      meta["save_seq"] = save_seq;
      meta["saved_at"] = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
      meta["layout"] = {{"world_size", size},    {"tp", opt.layout.tp}, {"pp", opt.layout.pp},
                        {"dp", opt.layout.dp},   {"cp", opt.layout.cp}, {"vpp", opt.layout.vpp}};
      json files = json::object(), tensors = json::object();
      for (int r = 0; r < size; ++r) {
        if (records[4 * r + 1] == 0) continue;
        const std::string file = shard_file_name(r);
        files[file] = {{"bytes", records[4 * r + 2]}, {"crc32", records[4 * r + 3]}, {"rank", r}};
        ShardExpect expect;
        expect.bytes = uint64_t(records[4 * r + 2]);
        expect.crc = uint32_t(records[4 * r + 3]);
        expect.run_id = state.run_id;
        expect.iteration = state.iteration;
        ShardReader rd(tmp / file, expect);
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
      meta["meta_crc32"] = meta_checksum(meta);
      const std::string meta_text = meta.dump(1);
      write_whole_file(tmp / "meta.json", meta_text.data(), meta_text.size());
      fsync_path(tmp, true);
      maybe_kill_after("meta.json");

      // Re-saving an iteration of this run after a restart (or one --overwrite allows).
      if (fs::exists(final_dir)) fs::remove_all(final_dir);
      fs::rename(tmp, final_dir);
      fsync_path(root, true);
      maybe_kill_after("renamed");  // complete, but `latest` still names the previous one

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
  struct Item {
    fs::path dir;
    int64_t seq = 0;
    std::string name;
  };
  std::vector<Item> items;
  for (const fs::path& d : checkpoint_folders(root)) {
    const auto id = identity_of(d);
    items.push_back({d, id ? id->save_seq : 0, d.filename().string()});
  }
  const std::string latest = latest_name(root);
  // `latest` first, then by save order, then (no save order: format 2 or unreadable) by iteration;
  // zero-padded names make lexical order numeric order.
  std::sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    if ((a.name == latest) != (b.name == latest)) return a.name == latest;
    if (a.seq != b.seq) return a.seq > b.seq;
    return a.name > b.name;
  });
  for (const Item& i : items) out.push_back(i.dir.string());
  return out;
}

std::vector<std::string> prune_checkpoints(const std::string& save_dir, int64_t keep, const std::string& run_id,
                                           const std::string& just_written) {
  std::vector<std::string> deleted;
  if (keep <= 0) return deleted;
  const fs::path root(save_dir);
  const std::string latest = latest_name(root);
  const std::string written = just_written.empty() ? "" : fs::path(just_written).filename().string();
  std::vector<std::pair<int64_t, fs::path>> mine;  // (save_seq, folder) of this run's checkpoints
  for (const fs::path& d : checkpoint_folders(root)) {
    const auto id = identity_of(d);
    if (id && !run_id.empty() && id->run_id == run_id) mine.push_back({id->save_seq, d});
  }
  std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // The one just written and the one `latest` names count towards `keep` but are never deleted.
  for (size_t i = size_t(keep); i < mine.size(); ++i) {
    const std::string name = mine[i].second.filename().string();
    if (name == written || name == latest) continue;
    fs::remove_all(mine[i].second);
    deleted.push_back(mine[i].second.string());
  }
  return deleted;
}

std::string new_run_id(parallel::ProcessGroup* world) {
  std::random_device rd;
  int64_t mine = int64_t((uint64_t(rd()) << 32) ^ uint64_t(rd()) ^
                         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  if (world && world->size() > 1) {
    std::vector<int64_t> all(size_t(world->size()));
    world->all_gather(&mine, all.data(), 1, parallel::CommType::I64);
    mine = all[0];  // rank 0's
  }
  return fmt::format("{:016x}", uint64_t(mine));
}

std::vector<int64_t> planned_saves(int64_t start, int64_t train_iters, int64_t save_interval) {
  std::vector<int64_t> out;
  if (save_interval > 0)
    for (int64_t it = (start / save_interval + 1) * save_interval; it <= train_iters; it += save_interval)
      out.push_back(it);
  if (train_iters > start && (out.empty() || out.back() != train_iters)) out.push_back(train_iters);
  return out;
}

void check_save_folder(const std::string& save_dir, const std::string& run_id, const std::vector<int64_t>& iterations,
                       bool overwrite) {
  const fs::path root(save_dir);
  if (fs::exists(root) && !fs::is_directory(root))
    fail("the save path {} is a file, not a folder: checkpoints cannot be written there (set `save` to a folder)",
         save_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fail("cannot create the save folder {}: {}", save_dir, ec.message());
  if (::access(root.c_str(), W_OK) != 0)
    fail("the save folder {} is not writable: {}", save_dir, std::strerror(errno));
  if (overwrite) return;
  std::vector<std::string> theirs;
  std::string other;
  for (int64_t it : iterations) {
    const fs::path d = root / checkpoint_name(it);
    if (!fs::exists(d)) continue;
    const auto id = identity_of(d);
    if (id && id->run_id == run_id) continue;
    theirs.push_back(d.filename().string());
    if (other.empty()) other = id ? (id->run_id.empty() ? "(before run ids)" : id->run_id) : "(unreadable)";
  }
  if (!theirs.empty())
    fail("the save folder {} holds checkpoints of another run (run '{}': {}) that this run would overwrite; pass "
         "--overwrite to replace them, or choose another save path (`save`)",
         save_dir, other, fmt::join(theirs, ", "));
}

CheckpointIdentity read_checkpoint_identity(const std::string& dir) {
  const json meta = read_meta(dir);
  return CheckpointIdentity{meta.value("run_id", std::string()), meta.at("iteration").get<int64_t>(),
                            meta.value("save_seq", int64_t(0))};
}

void parse_meta_json(const std::string& text, const std::string& name) {
  const json meta = parse_meta_text(text, name, name);
  try {
    (void)meta.at("iteration").get<int64_t>();
  } catch (const json::exception& e) {
    fail("checkpoint file {} is missing a field: {}", name, e.what());
  }
  (void)parse_index(fs::path(name), meta);
}

void parse_shard_header(const std::string& bytes, const std::string& name) {
  if (bytes.size() < kPrefixBytes) fail("checkpoint file {} is truncated: it ends inside its prefix", name);
  const uint64_t header_bytes = header_length(bytes.data(), bytes.size(), name);
  const std::string text = bytes.substr(kPrefixBytes, header_bytes);
  (void)parse_header(bytes.data(), text, bytes.size(), name);
}

}  // namespace primus::train
