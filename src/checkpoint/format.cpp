// The checkpoint format: shard files and meta.json (docs/checkpoints.md#format).
#include "checkpoint/format.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "safe/disk.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::checkpoint {
namespace {

// Format 1 was one process's flat buffers (model.bin, optimizer.bin); format 2 is sharded; format 3
// adds the checkpoint's identity (run id and iteration) to every shard header and to meta.json,
// the save order, and a checksum over meta.json itself; format 4 lets a shard hold a range of a
// tensor's slice (`range`, the local elements [begin, end)), so that the ranks holding one slice
// (ZeRO / FSDP shards, replicas sharing the writing) each write their part of it, and packs the
// sections (no alignment gaps). kFormatVersion, format.h. Formats 2 and 3 are still read (a
// missing `range` is the whole slice; format 2 without the identity checks).
constexpr int kOldestReadVersion = 2;
// A shard file: magic, u64 header length, u32 header CRC-32, u32 zero, the JSON header, zeros up
// to a multiple of kDataAlign, then the sections values, exp_avg, exp_avg_sq (numel fp32 each).
constexpr char kMagic[8] = {'P', 'R', 'M', 'S', 'H', 'R', 'D', '2'};
constexpr size_t kPrefixBytes = 24;
constexpr uint64_t kDataAlign = 64;
// The pieces of a read window that its CRC and copies go through, small enough to stay in a
// core's cache between the two.
constexpr uint64_t kCachePieceBytes = 256 << 10;

uint64_t data_offset_for(uint64_t header_bytes) {
  return (kPrefixBytes + header_bytes + kDataAlign - 1) / kDataAlign * kDataAlign;
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
      if (n <= 0)
        safe::fail_write(path_.string(), n < 0 ? errno : ENOSPC, std::max(expected_, written_ + bytes) - written_);
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

json pieces_json(const std::vector<ShardPiece>& pieces) {
  json a = json::array();
  for (const auto& p : pieces) a.push_back({p.global_start, p.length});
  return a;
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
    if (!h.header.at("tensors").is_array())
      fail("checkpoint file {} has a malformed header: tensors is not a list", name);
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

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("checkpoint file {} is missing or unreadable", p.string());
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
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
  if (!meta.contains("files") || !meta["files"].is_object()) fail("checkpoint file {} lists no files", name);
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

Placement placement_json(const json& t) {
  std::vector<ShardPiece> pieces;
  for (const auto& p : t.at("pieces")) pieces.push_back({p.at(0).get<int64_t>(), p.at(1).get<int64_t>()});
  return make_placement(t.at("shape").get<Shape>(), t.at("shard_dim").get<int>(), std::move(pieces));
}

}  // namespace

uint32_t crc_update(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {  // ISA-L takes 64-bit lengths, but keep calls bounded
    const uint64_t n = std::min<size_t>(bytes, size_t(1) << 30);
    crc = crc32_gzip_refl(crc, p, n);  // the same CRC-32 as zlib's crc32 (CheckpointFormat.CrcIsZlibs)
    p += n;
    bytes -= n;
  }
  return crc;
}
uint32_t crc_of(const void* data, size_t bytes) { return crc_update(0, data, bytes); }

std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail("cannot open {} to sync it: {}", p.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync of {} failed: {}", p.string(), std::strerror(errno));
}

Written write_whole_file(const fs::path& p, const void* data, size_t bytes) {
  FileWriter w(p, bytes);
  w.write(data, bytes);
  w.finish();
  return {bytes, crc_of(data, bytes)};
}

void maybe_kill_after(const std::string& file) {
  const char* kill_after = std::getenv("PRIMUS_FAULT_CHECKPOINT_KILL_AFTER");
  if (kill_after && file == kill_after) ::raise(SIGKILL);
}

namespace {

// One run of a shard's section data: `count` floats of tensor elements, in file order.
struct Piece {
  int tensor = 0;                 // into the tensor list
  int64_t begin = 0, count = 0;   // the tensor's local elements [begin, begin + count)
  const float* data[kSections] = {nullptr, nullptr, nullptr};
};

// The tensor elements the ranges hold, tensor by tensor (alignment gaps between tensors are not
// written).
std::vector<Piece> pieces_of(const std::vector<StoredParam>& tensors, const std::vector<SaveRange>& ranges) {
  std::vector<Piece> out;
  for (size_t r = 0; r < ranges.size(); ++r)
    if (ranges[r].numel < 0 || ranges[r].begin < 0 || (r > 0 && ranges[r].begin < ranges[r - 1].begin + ranges[r - 1].numel))
      fail("checkpoint: the ranges a rank writes must be sorted and disjoint (range {} at {})", r, ranges[r].begin);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t a = tensors[t].offset, b = a + tensors[t].numel;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), a,
                               [](int64_t x, const SaveRange& r) { return x < r.begin + r.numel; });
    for (; it != ranges.end() && it->begin < b; ++it) {
      const int64_t lo = std::max(a, it->begin), hi = std::min(b, it->begin + it->numel);
      if (lo >= hi) continue;
      Piece p{int(t), lo - a, hi - lo, {}};
      for (int s = 0; s < kSections; ++s) {
        if (!it->data[s]) fail("checkpoint: no {} data given for tensor {}", kSectionNames[s], tensors[t].name);
        p.data[s] = it->data[s] + (lo - it->begin);
      }
      out.push_back(p);
    }
  }
  return out;
}

// CRC-32 of every block_bytes of one section, streamed over its pieces.
std::vector<uint32_t> block_crcs_of(const std::vector<Piece>& pieces, int section, uint64_t block_bytes) {
  std::vector<uint32_t> crcs;
  uint32_t crc = 0;
  uint64_t in_block = 0;
  for (const Piece& p : pieces) {
    const char* at = reinterpret_cast<const char*>(p.data[section]);
    uint64_t left = uint64_t(p.count) * sizeof(float);
    while (left > 0) {
      const uint64_t n = std::min(left, block_bytes - in_block);
      crc = crc_update(crc, at, n);
      at += n;
      left -= n;
      in_block += n;
      if (in_block == block_bytes) {
        crcs.push_back(crc);
        crc = 0;
        in_block = 0;
      }
    }
  }
  if (in_block > 0) crcs.push_back(crc);
  return crcs;
}

// Writes through a bounded staging buffer: small pieces are gathered into it, large ones go
// straight from the caller's memory.
class StagedWriter {
 public:
  StagedWriter(FileWriter& w, size_t capacity) : w_(w), cap_(capacity) { buf_.reserve(cap_); }
  void write(const void* data, size_t bytes) {
    if (buf_.size() + bytes > cap_) flush();
    if (bytes >= cap_) return w_.write(data, bytes);
    const char* p = static_cast<const char*>(data);
    buf_.insert(buf_.end(), p, p + bytes);
  }
  void flush() {
    if (!buf_.empty()) w_.write(buf_.data(), buf_.size());
    buf_.clear();
  }
  size_t capacity() const { return cap_; }

 private:
  FileWriter& w_;
  size_t cap_;
  std::vector<char> buf_;
};

}  // namespace

// Writes this rank's shard file; returns its size and CRC-32. The whole-file CRC is combined from
// the header's and the blocks' CRCs, so the data is checksummed in one pass over memory before it
// is written.
Written write_shard(const fs::path& path, int rank, const std::string& run_id, int64_t iteration,
                    const std::vector<StoredParam>& tensors, const std::vector<SaveRange>& ranges,
                    int64_t block_bytes, const RunState& state) {
  const std::vector<Piece> pieces = pieces_of(tensors, ranges);
  uint64_t n = 0;
  json list = json::array();
  for (const Piece& pc : pieces) {
    const StoredParam& p = tensors[size_t(pc.tensor)];
    list.push_back({{"name", p.name},
                    {"shape", p.shape},
                    {"global_shape", p.global_shape},
                    {"offset", n},
                    {"range", {pc.begin, pc.begin + pc.count}},
                    {"shard_dim", p.shard.pieces.empty() ? -1 : p.shard.dim},
                    {"pieces", pieces_json(p.shard.pieces)}});
    n += uint64_t(pc.count);
  }
  const uint64_t section_bytes = n * sizeof(float);
  json h;
  h["format"] = "primus-shard";
  h["version"] = kFormatVersion;
  h["rank"] = rank;
  h["run_id"] = run_id;  // ties the shard to its meta.json
  h["iteration"] = iteration;
  h["dtype"] = "float32";
  h["numel"] = n;
  h["block_bytes"] = block_bytes;
  h["tensors"] = std::move(list);
  // name -> the floats' bit patterns (the header holds integers only: reject_floats)
  for (const auto& [name, values] : state) {
    std::vector<uint32_t> bits(values.size());
    std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
    h["state"][name] = bits;
  }
  std::vector<std::vector<uint32_t>> block_crcs(kSections);
  for (int s = 0; s < kSections; ++s) {
    block_crcs[s] = block_crcs_of(pieces, s, uint64_t(block_bytes));
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
  StagedWriter out(w, size_t(std::min<uint64_t>(kWriteBufferBytes, file_bytes)));
  out.write(prefix, kPrefixBytes);
  out.write(header.data(), header.size());
  out.write(pad.data(), pad.size());
  uint32_t crc = crc_of(prefix, kPrefixBytes);
  crc = crc_update(crc, header.data(), header.size());
  crc = crc_update(crc, pad.data(), pad.size());
  for (int s = 0; s < kSections; ++s) {
    for (const Piece& pc : pieces) out.write(pc.data[s], size_t(pc.count) * sizeof(float));
    for (size_t b = 0; b < block_crcs[s].size(); ++b) {
      const uint64_t len = std::min<uint64_t>(uint64_t(block_bytes), section_bytes - b * uint64_t(block_bytes));
      crc = uint32_t(crc32_combine(crc, block_crcs[s][b], z_off_t(len)));
    }
    if (s == 0) {
      out.flush();
      maybe_kill_after(path.filename().string() + ":half");  // crash tests: a half-written shard
    }
    // Fault injection for the agreement tests: this rank fails halfway through its file.
    const char* fail_rank = std::getenv("PRIMUS_FAULT_CHECKPOINT_FAIL_RANK");
    if (s == 0 && fail_rank && std::atoi(fail_rank) == rank)
      fail("injected failure while writing {} (PRIMUS_FAULT_CHECKPOINT_FAIL_RANK={})", path.string(), rank);
  }
  out.flush();
  w.finish();
  return {w.written(), crc};
}

ShardReader::ShardReader(fs::path path, const ShardExpect& expect) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("checkpoint file {} is missing or unreadable: {}", path_.string(), std::strerror(errno));
  const uint64_t size = fs::file_size(path_);
  if (expect.bytes != ~uint64_t(0) && size != expect.bytes)
    fail("checkpoint file {} is truncated or padded: {} bytes, meta.json says {}", path_.string(), size, expect.bytes);
  char prefix[kPrefixBytes];
  pread_all(fd_, prefix, kPrefixBytes, 0, "its prefix");
  const uint64_t header_bytes = header_length(prefix, size, path_.string());
  std::string text(header_bytes, '\0');
  pread_all(fd_, text.data(), header_bytes, kPrefixBytes, "its header");
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

ShardReader::~ShardReader() {
  if (fd_ >= 0) ::close(fd_);
  for (int fd : section_fd_)
    if (fd >= 0) ::close(fd);
}

void ShardReader::read(int section, uint64_t first, uint64_t count, float* dst) {
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

void ShardReader::pread_all(int fd, void* dst, uint64_t bytes, uint64_t at, const char* what) const {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, off_t(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading {} of checkpoint file {} failed: {}", what, path_.string(), std::strerror(errno));
    if (n == 0) fail("checkpoint file {} is truncated: it ends inside {}", path_.string(), what);
    p += n;
    at += uint64_t(n);
    bytes -= uint64_t(n);
  }
}

void ShardReader::load_block(int section, uint64_t b) {
  Block& c = cache_[section];
  const uint64_t start = b * block_bytes_;
  c.index = -1;
  c.bytes.resize(std::min<uint64_t>(block_bytes_, section_bytes_ - start));
  const std::string what = fmt::format("block {} of {}", b, kSectionNames[section]);
  int& fd = section_fd_[section];
  if (fd < 0) fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("checkpoint file {} is unreadable: {}", path_.string(), std::strerror(errno));
  pread_all(fd, c.bytes.data(), c.bytes.size(), data_offset_ + uint64_t(section) * section_bytes_ + start, what.c_str());
  if (crc_of(c.bytes.data(), c.bytes.size()) != block_crcs_[section][b]) fail_block(section, b);
  c.index = int64_t(b);
}

void ShardReader::fail_block(int section, uint64_t b) const {
  fail("checkpoint file {} is corrupted: block {} of {} fails its CRC-32{}", path_.string(), b, kSectionNames[section],
       section == 0 ? "" : " (optimizer state: --no_load_optim true resumes the weights without it)");
}

void ShardReader::check_run(uint64_t first, uint64_t count) const {
  if (first + count > numel_ || first + count < first)
    fail("checkpoint file {}: elements [{}, {}) lie outside its {} elements (meta.json and the file disagree)",
         path_.string(), first, first + count, numel_);
}

ShardReader::Descriptor ShardReader::open_descriptor(bool direct) const {
  Descriptor d;
  if (direct) {
    d.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    d.direct = d.fd >= 0;
  }
  if (d.fd < 0) d.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);  // O_DIRECT refused (tmpfs, ...)
  if (d.fd < 0) fail("checkpoint file {} is unreadable: {}", path_.string(), std::strerror(errno));
  return d;
}

ShardReader::Descriptor::~Descriptor() {
  if (fd >= 0) ::close(fd);
}

void ShardReader::Window::Free::operator()(char* p) const { std::free(p); }

ShardReader::Window::Window(uint64_t bytes) : bytes_(std::max<uint64_t>(1, bytes)) {
  void* p = nullptr;
  // Room for a window's bytes widened to aligned ends on both sides.
  if (::posix_memalign(&p, kAlign, bytes_ + 2 * kAlign) != 0) throw std::bad_alloc();
  data_.reset(static_cast<char*>(p));
}

void ShardReader::read_blocks(Descriptor& d, int section, uint64_t b0, uint64_t b1, const std::vector<ByteRun>& runs,
                              Window& window) const {
  // Reading straight into the destinations (through the page cache) and taking the CRCs there
  // afterwards costs the kernel's copy plus two passes over the destinations; here the disk fills
  // the window (O_DIRECT: no copy by the CPU), and each cache-sized piece of it is checked and
  // copied out while it is in the cache.
  const uint64_t start = b0 * block_bytes_, end = std::min(b1 * block_bytes_, section_bytes_);
  const uint64_t file_at = data_offset_ + uint64_t(section) * section_bytes_;
  const std::string what = fmt::format("blocks {} to {} of {}", b0, b1 - 1, kSectionNames[section]);
  size_t next_run = 0;
  uint64_t b = b0, in_block = 0, block_len = std::min(block_bytes_, section_bytes_ - b * block_bytes_);
  uint32_t crc = 0;
  for (uint64_t w0 = start; w0 < end;) {
    const uint64_t w1 = std::min(end, w0 + window.bytes());
    const char* bytes = read_window(d, file_at + w0, file_at + w1, window, what);
    for (uint64_t p0 = w0; p0 < w1;) {
      const uint64_t p1 = std::min(w1, p0 + kCachePieceBytes);
      const char* piece = bytes + (p0 - w0);
      for (uint64_t at = 0; at < p1 - p0;) {  // the blocks' CRCs over the piece
        const uint64_t n = std::min(p1 - p0 - at, block_len - in_block);
        crc = crc_update(crc, piece + at, n);
        at += n;
        in_block += n;
        if (in_block == block_len) {
          if (crc != block_crcs_[section][b]) fail_block(section, b);
          ++b;
          crc = 0;
          in_block = 0;
          if (b < b1) block_len = std::min(block_bytes_, section_bytes_ - b * block_bytes_);
        }
      }
      for (; next_run < runs.size(); ++next_run) {  // the runs' parts inside the piece
        const ByteRun& r = runs[next_run];
        PRIMUS_CHECK(r.begin >= start && r.begin + r.bytes <= end,
                     "checkpoint file {}: a read run outside its chunk", path_.string());
        const uint64_t x = std::max(r.begin, p0), y = std::min(r.begin + r.bytes, p1);
        if (x < y) std::memcpy(r.dst + (x - r.begin), piece + (x - p0), size_t(y - x));
        if (r.begin + r.bytes > p1) break;  // it continues in the next piece
      }
      p0 = p1;
    }
    w0 = w1;
  }
}

const char* ShardReader::read_window(Descriptor& d, uint64_t from, uint64_t to, Window& window,
                                     const std::string& what) const {
  if (!d.direct) {
    pread_all(d.fd, window.data(), to - from, from, what.c_str());
    return window.data();
  }
  // O_DIRECT wants the offset, the length and the buffer aligned: the range is widened to aligned
  // ends (past the file's end a read is short, which is fine once `to` is reached).
  const uint64_t a = from / Window::kAlign * Window::kAlign;
  const uint64_t z = (to + Window::kAlign - 1) / Window::kAlign * Window::kAlign;
  uint64_t got = 0;
  while (a + got < to) {
    const ssize_t n = ::pread(d.fd, window.data() + got, size_t(z - a - got), off_t(a + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && got == 0) {  // the file system took O_DIRECT at open, not here
      d = open_descriptor(false);
      return read_window(d, from, to, window, what);
    }
    if (n < 0) fail("reading {} of checkpoint file {} failed: {}", what, path_.string(), std::strerror(errno));
    if (n == 0) fail("checkpoint file {} is truncated: it ends inside {}", path_.string(), what);
    got += uint64_t(n);
  }
  return window.data() + (from - a);
}

void ShardBatch::add(ShardReader& reader, int section, uint64_t first, uint64_t count, float* dst) {
  if (count == 0) return;
  reader.check_run(first, count);
  Group& g = groups_[{&reader, section}];
  g.reader = &reader;
  g.section = section;
  g.runs.push_back({first, count, dst});
}

void ShardBatch::run(const LoadOptions& o) {
  const int threads = o.read_threads;
  const uint64_t chunk_bytes = uint64_t(std::max<int64_t>(1, o.read_chunk_bytes));
  struct Task {
    Group* group;
    uint64_t b0, b1;
    std::vector<ByteRun> runs;
  };
  std::vector<Task> tasks;
  std::vector<std::pair<Group*, ReadRun>> one_by_one;  // read through ShardReader::read afterwards
  for (auto& [key, g] : groups_) {
    std::sort(g.runs.begin(), g.runs.end(), [](const ReadRun& l, const ReadRun& r) { return l.first < r.first; });
    const uint64_t bb = g.reader->block_bytes();
    const uint64_t chunk_blocks = std::max<uint64_t>(1, chunk_bytes / bb);
    uint64_t read_to = 0;  // elements: the end of the runs taken so far
    for (const ReadRun& r : g.runs) {
      if (r.first < read_to) {
        one_by_one.push_back({&g, r});
        continue;
      }
      read_to = r.first + r.count;
      // In bytes: a block need not hold whole elements.
      ByteRun run{r.first * sizeof(float), r.count * sizeof(float), reinterpret_cast<char*>(r.dst)};
      while (run.bytes > 0) {  // tasks: stretches of touched blocks, at most chunk_blocks each
        const uint64_t b = run.begin / bb;
        Task* t = tasks.empty() ? nullptr : &tasks.back();
        if (!t || t->group != &g || b > t->b1 || b >= t->b0 + chunk_blocks) {
          tasks.push_back({&g, b, b, {}});
          t = &tasks.back();
        }
        const uint64_t n = std::min(run.bytes, (t->b0 + chunk_blocks) * bb - run.begin);
        t->runs.push_back({run.begin, n, run.dst});
        t->b1 = std::max(t->b1, (run.begin + n + bb - 1) / bb);
        run.begin += n;
        run.bytes -= n;
        run.dst += n;
      }
    }
  }
  // Each thread reads a contiguous stretch of the tasks (about the same bytes each) through
  // descriptors of its own: the kernel's readahead follows one sequential stream per descriptor,
  // and threads interleaving offsets on one descriptor would defeat it.
  const int n = int(std::clamp<size_t>(size_t(threads), 1, std::max<size_t>(1, tasks.size())));
  uint64_t total = 0;
  for (const Task& t : tasks) total += t.b1 - t.b0;
  std::vector<size_t> first(size_t(n) + 1, tasks.size());
  first[0] = 0;
  for (size_t i = 0, k = 1, seen = 0; i < tasks.size() && k < size_t(n); ++i) {
    seen += tasks[i].b1 - tasks[i].b0;
    while (k < size_t(n) && seen * uint64_t(n) >= total * k) first[k++] = i + 1;
  }
  std::vector<std::string> errors(tasks.size());
  std::atomic<bool> failed{false};
  auto work = [&](int k) {
    ShardReader::Window window(uint64_t(std::max<int64_t>(1, o.read_window_bytes)));
    std::map<const ShardReader*, ShardReader::Descriptor> fds;
    for (size_t i = first[size_t(k)]; i < first[size_t(k) + 1] && !failed; ++i) {
      const Task& t = tasks[i];
      try {
        auto& fd = fds[t.group->reader];
        if (!fd.valid()) fd = t.group->reader->open_descriptor(o.read_direct);
        t.group->reader->read_blocks(fd, t.group->section, t.b0, t.b1, t.runs, window);
      } catch (const std::exception& e) {
        errors[i] = e.what();
        failed = true;  // stop early: the load fails anyway
      }
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < n; ++k) pool.emplace_back(work, k);
  work(0);
  for (std::thread& t : pool) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
  for (auto& [g, r] : one_by_one) g->reader->read(g->section, r.first, r.count, r.dst);
  groups_.clear();
}

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

void write_meta(const fs::path& dir, json meta) {
  meta["format_version"] = kFormatVersion;
  meta.erase("meta_crc32");
  meta["meta_crc32"] = meta_checksum(meta);
  const std::string text = meta.dump(1);
  write_whole_file(dir / "meta.json", text.data(), text.size());
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

// The slices of a tensor are grouped by placement: the ranks that hold one slice may each have
// written a range of it (format 4), and replicas the whole of it; the slice is their union, which
// must cover it.
std::map<std::string, SavedTensor> parse_index(const fs::path& dir, const json& meta) {
  std::map<std::string, SavedTensor> index;
  try {
    for (const auto& [name, t] : meta.at("tensors").items()) {
      SavedTensor& st = index[name];
      st.global = t.at("global_shape").get<Shape>();
      std::map<std::string, size_t> by_placement;  // placement's JSON -> index into st.entries
      for (const auto& s : t.at("shards")) {
        Part part;
        part.file = s.at("file").get<std::string>();
        part.offset = s.at("offset").get<int64_t>();
        const Placement place = placement_json(s);
        const std::string problem = placement_problem(place, st.global);
        const int64_t numel = numel_of(place.shape);
        part.end = numel;
        if (s.contains("range")) {
          part.begin = s.at("range").at(0).get<int64_t>();
          part.end = s.at("range").at(1).get<int64_t>();
        }
        if (!problem.empty() || part.offset < 0 || part.begin < 0 || part.begin >= part.end || part.end > numel)
          fail("checkpoint {}: meta.json's entry for tensor {} in {} is inconsistent: {}", dir.string(), name,
               part.file,
               !problem.empty() ? problem
               : part.offset < 0 ? std::string("negative offset")
                                 : fmt::format("range [{}, {}) of a slice of {} elements", part.begin, part.end, numel));
        if (!meta.at("files").contains(part.file))
          fail("checkpoint {}: tensor {} is said to be in {}, which meta.json does not list", dir.string(), name,
               part.file);
        const std::string key = json{s.at("shape"), s.at("shard_dim"), s.at("pieces")}.dump();
        auto [it, added] = by_placement.emplace(key, st.entries.size());
        if (added) st.entries.push_back(Entry{part.file, place, {}});
        Entry& e = st.entries[it->second];
        if (!added && e.file.find(part.file) == std::string::npos) e.file += "+" + part.file;
        e.parts.push_back(std::move(part));
      }
      for (Entry& e : st.entries) {
        std::sort(e.parts.begin(), e.parts.end(), [](const Part& l, const Part& r) { return l.begin < r.begin; });
        const int64_t numel = numel_of(e.place.shape);
        int64_t covered = 0, gap_end = numel;
        for (const Part& p : e.parts) {
          if (p.begin > covered) {
            gap_end = p.begin;
            break;
          }
          covered = std::max(covered, p.end);
        }
        if (covered < numel)
          fail("checkpoint {}: tensor {} is not fully saved: elements [{}, {}) of its slice ({}, {}) are in none "
               "of its files ({})",
               dir.string(), name, covered, gap_end, describe(e.place), shape_str(e.place.shape), e.file);
      }
    }
  } catch (const json::exception& e) {
    fail("checkpoint {}/meta.json is malformed: {}", dir.string(), e.what());
  }
  return index;
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

}  // namespace primus::checkpoint
