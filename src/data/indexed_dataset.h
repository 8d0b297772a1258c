// Megatron's indexed dataset: a .bin of token arrays back to back, and an .idx that says where each
// sequence starts. The .idx layout (megatron/core/datasets/indexed_dataset.py, little-endian):
//
//   9 bytes   magic "MMIDIDX\x00\x00"
//   u64       version = 1
//   u8        dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
//   u64       sequence count S
//   u64       document count D (= number of documents + 1)
//   int32[S]  sequence lengths, in elements
//   int64[S]  sequence pointers, byte offsets into the .bin
//   int64[D]  document indices: 0, then the sequence count after each document
//   (int8[S]  sequence modes, only in Megatron's multimodal datasets; accepted and ignored)
//
//   (24 bytes  this project's pairing trailer, after everything else: "PRMSTIE1", u64 the .bin's
//              size, u32 a CRC-32 of 64 pages sampled evenly through the .bin, u32 zero. Readers of
//              Megatron's format ignore trailing bytes; an .idx without it, as Megatron writes
//              them, is read as before.)
//
// Both files are memory-mapped; opening checks every field against the other file, so a .bin that
// does not match its .idx, a truncated file or an unknown dtype is an error, never garbage. With
// the trailer, a .bin from another corpus that happens to have the size the .idx describes is
// refused too.
//
// The builder writes both files under temporary names beside the outputs and renames them into
// place when finished (.bin first, then .idx): a job that has the old files mapped keeps reading
// them (no SIGBUS), and a failed or interrupted run leaves the old dataset as it was.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace primus::data {

enum class TokenDType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };

size_t dtype_size(TokenDType t);
const char* dtype_name(TokenDType t);
// Megatron's choice: uint16 when every id fits (vocab < 65500), else int32.
TokenDType optimal_dtype(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr char kPairMagic[8] = {'P', 'R', 'M', 'S', 'T', 'I', 'E', '1'};
inline constexpr size_t kPairTrailerBytes = 24;

// The CRC-32 of 64 pages (4 KiB) sampled evenly through a .bin: cheap to check on every open.
uint32_t sampled_crc(const uint8_t* data, size_t size);

// A read-only mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class IndexedDataset {
 public:
  // Opens `prefix`.idx and `prefix`.bin (Megatron's path_prefix convention).
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  size_t num_sequences() const { return sizes_.size(); }
  size_t num_documents() const { return doc_idx_.empty() ? 0 : doc_idx_.size() - 1; }
  std::span<const int32_t> sequence_lengths() const { return sizes_; }
  std::span<const int64_t> sequence_pointers() const { return pointers_; }
  std::span<const int64_t> document_indices() const { return doc_idx_; }
  int64_t num_tokens() const { return num_tokens_; }

  // Tokens [offset, offset+length) of sequence i, widened to int32 (length -1 = to the end).
  std::vector<int32_t> get(size_t i, int64_t offset = 0, int64_t length = -1) const;
  // Appends instead of returning (the GPT dataset concatenates pieces of several sequences).
  void append(size_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const;

 private:
  std::string prefix_;
  std::unique_ptr<MappedFile> idx_, bin_;
  TokenDType dtype_;
  std::span<const int32_t> sizes_;
  std::span<const int64_t> pointers_, doc_idx_;
  int64_t num_tokens_ = 0;
};

// Writes a .bin as sequences arrive and the .idx at finalize(). Memory: 12 bytes per sequence.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(const std::string& prefix, TokenDType dtype);
  ~IndexedDatasetBuilder();
  // One sequence (Megatron: one sentence; without sentence splitting, one document).
  void add_item(std::span<const int32_t> tokens);
  // Closes the current document (all sequences added since the last end_document).
  void end_document();
  // Writes the .idx and closes both files.
  void finalize();
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::string prefix_;
  std::string bin_tmp_, idx_tmp_;  // where the files are written until finalize renames them
  TokenDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<char> buf_;
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace primus::data
