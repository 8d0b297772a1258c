// The checkpoint format (docs/checkpoints.md#format): shard files and meta.json.
//
// A shard file: magic "PRMSHRD2", u64 header length, u32 header CRC-32, u32 zero, a JSON header
// (format version, the writer's rank, run id and iteration, its tensors with their global shapes,
// slices and the range of each slice it holds, a CRC-32 per block of each section), zeros up to a
// multiple of 64 bytes, then the sections values, exp_avg, exp_avg_sq (numel fp32 each). meta.json lists every file with its
// size and CRC-32, indexes every tensor's slices, and carries a checksum of itself.
//
// Readers verify everything they use: sizes, the header's CRC, that a shard belongs to its
// meta.json (run id, iteration, whole-file CRC), each block they read. Every parser here takes
// untrusted bytes and either returns or throws primus::Error (fuzz/ runs them).
// A part of src/checkpoint; its callers use checkpoint/checkpoint.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"  // RunState
#include "checkpoint/reshard.h"
#include "model/param_store.h"

namespace primus::checkpoint {

inline constexpr int kFormatVersion = 4;  // the version written (format.cpp: what each adds)
inline constexpr int kSections = 3;       // values, exp_avg, exp_avg_sq
inline constexpr const char* kSectionNames[kSections] = {"values", "exp_avg", "exp_avg_sq"};

// CRC-32 (zlib's and gzip's polynomial and conventions, so crc32_combine applies), computed with
// ISA-L's folding implementation (PCLMUL): several times zlib's speed on the load's path.
uint32_t crc_update(uint32_t crc, const void* data, size_t bytes);
uint32_t crc_of(const void* data, size_t bytes);

std::string shard_file_name(int rank);  // "rank_00003.bin"

// fsync of a file or a folder (after a rename in it); throws primus::Error naming it.
void fsync_path(const std::filesystem::path& p, bool directory);

// Fault injection for the crash tests: SIGKILL right after writing `file` (or reaching the point
// of that name) when PRIMUS_FAULT_CHECKPOINT_KILL_AFTER names it.
void maybe_kill_after(const std::string& file);

struct Written {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
// Writes and fsyncs a whole file; a full disk is an error with the bytes needed (safe/disk.h).
Written write_whole_file(const std::filesystem::path& p, const void* data, size_t bytes);

// Writes a rank's shard file: the elements of `tensors` (a store's layout) that `ranges` cover,
// packed, with their three sections' data from the ranges, and its run state, tied to its
// checkpoint by run id and iteration; returns its size and CRC-32. Host memory beyond the data:
// the header and a staging buffer of kWriteBufferBytes.
inline constexpr size_t kWriteBufferBytes = 4u << 20;
Written write_shard(const std::filesystem::path& path, int rank, const std::string& run_id, int64_t iteration,
                    const std::vector<StoredParam>& tensors, const std::vector<SaveRange>& ranges,
                    int64_t block_bytes, const RunState& state = {});

// What a reader expects of a shard: from meta.json.
struct ShardExpect {
  uint64_t bytes = ~uint64_t(0);  // ~0: unknown (at save, reading a shard just written)
  std::optional<uint32_t> crc;    // the whole file's CRC-32
  std::optional<std::string> run_id;
  int64_t iteration = -1;
};
ShardExpect shard_expect(const nlohmann::json& meta, const std::string& file);

// A run of elements of one section of a shard to read into host memory: elements
// [first, first + count) into dst.
struct ReadRun {
  uint64_t first = 0, count = 0;
  float* dst = nullptr;
};

// The same in bytes of the section: [begin, begin + bytes) into dst.
struct ByteRun {
  uint64_t begin = 0, bytes = 0;
  char* dst = nullptr;
};

// Reads slices of one shard file: verifies its size, its header's CRC, that it belongs to its
// meta.json (run id, iteration, whole-file CRC), and the CRC of every block it reads (one cached
// block per section, since slices are read in increasing order).
class ShardReader {
 public:
  ShardReader(std::filesystem::path path, const ShardExpect& expect);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const nlohmann::json& header() const { return header_; }
  uint64_t numel() const { return numel_; }
  const std::filesystem::path& path() const { return path_; }

  // Copies `count` floats from element `first` of a section into dst.
  void read(int section, uint64_t first, uint64_t count, float* dst);

  // The batched way (ShardBatch): checks a run against the file, and reads the blocks
  // [b0, b1) of a section through `d`, streamed through `window`: each window's bytes read, its
  // blocks' CRCs checked over it in cache-sized pieces, the bytes of `runs` (sorted, disjoint,
  // inside those blocks) copied from each piece to their destinations while it is in the cache.
  // Thread-safe (positional reads, no shared state).
  void check_run(uint64_t first, uint64_t count) const;
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t section_bytes() const { return section_bytes_; }
  // A descriptor of the file of its own (closed with it), for one reading thread. `direct`: opened
  // with O_DIRECT (reads go from the disk to the window without the page cache's copy); where the
  // file system refuses it, the descriptor is buffered.
  struct Descriptor {
    int fd = -1;
    bool direct = false;
    Descriptor() = default;
    Descriptor(Descriptor&& o) noexcept : fd(std::exchange(o.fd, -1)), direct(o.direct) {}
    Descriptor& operator=(Descriptor&& o) noexcept {
      std::swap(fd, o.fd);
      std::swap(direct, o.direct);
      return *this;
    }
    ~Descriptor();
    bool valid() const { return fd >= 0; }
  };
  Descriptor open_descriptor(bool direct) const;
  // A read buffer aligned for O_DIRECT, one per reading thread; `bytes`: what one read asks for.
  class Window {
   public:
    explicit Window(uint64_t bytes);
    char* data() { return data_.get(); }
    uint64_t bytes() const { return bytes_; }
    static constexpr uint64_t kAlign = 4096;

   private:
    struct Free {
      void operator()(char* p) const;
    };
    std::unique_ptr<char, Free> data_;
    uint64_t bytes_;
  };
  void read_blocks(Descriptor& d, int section, uint64_t b0, uint64_t b1, const std::vector<ByteRun>& runs,
                   Window& window) const;

 private:
  struct Block {
    int64_t index = -1;
    std::vector<char> bytes;
  };
  void pread_all(int fd, void* dst, uint64_t bytes, uint64_t at, const char* what) const;
  // Reads the file's bytes [from, to) into the window (at most window.bytes()); returns where they
  // start in it.
  const char* read_window(Descriptor& d, uint64_t from, uint64_t to, Window& window, const std::string& what) const;
  [[noreturn]] void fail_block(int section, uint64_t b) const;
  void load_block(int section, uint64_t b);

  std::filesystem::path path_;
  int fd_ = -1;
  // One descriptor per section: a tensor's values and moments are read together from three places
  // of the file, and the kernel's readahead follows one sequential stream per descriptor.
  int section_fd_[kSections] = {-1, -1, -1};
  nlohmann::json header_;
  uint64_t numel_ = 0, block_bytes_ = 0, section_bytes_ = 0, data_offset_ = 0;
  std::vector<uint32_t> block_crcs_[kSections];
  Block cache_[kSections];
};

// Reads many runs from many shards: runs are gathered per (shard, section), then read in chunks
// of about LoadOptions::read_chunk_bytes of whole blocks, through a window (with O_DIRECT when
// read_direct and the file system allows it) into their destinations, each
// chunk's blocks checked against their CRCs, by a few threads at once (one thread's CRC overlaps
// another's read). Runs whose source elements overlap an earlier run's go
// through ShardReader::read.
class ShardBatch {
 public:
  void add(ShardReader& reader, int section, uint64_t first, uint64_t count, float* dst);
  // Reads everything added as `o` says (read_threads, read_chunk_bytes, read_direct,
  // read_window_bytes); the failure of the earliest read that failed is thrown after all threads
  // end.
  void run(const LoadOptions& o);

 private:
  struct Group {
    ShardReader* reader = nullptr;
    int section = 0;
    std::vector<ReadRun> runs;
  };
  std::map<std::pair<const ShardReader*, int>, Group> groups_;
};

// meta.json of a checkpoint folder, parsed and checked: JSON, format version, its own checksum,
// the file list (no name outside the folder).
nlohmann::json read_meta(const std::filesystem::path& dir);
// Writes `meta` as <dir>/meta.json with its format version and its own checksum, fsynced.
void write_meta(const std::filesystem::path& dir, nlohmann::json meta);
// A small file of the checkpoint (config.yaml), verified against meta.json's size and CRC-32.
std::vector<char> read_verified(const std::filesystem::path& dir, const nlohmann::json& meta, const std::string& name);
// meta.json's tensor index: each tensor's global shape and slices, checked for consistency.
std::map<std::string, SavedTensor> parse_index(const std::filesystem::path& dir, const nlohmann::json& meta);

// The parsers above on untrusted bytes, for the fuzz targets (fuzz/): each either returns or
// throws primus::Error, never crashes. `name` is used in messages.
void parse_meta_json(const std::string& text, const std::string& name);
void parse_shard_header(const std::string& bytes, const std::string& name);

}  // namespace primus::checkpoint
