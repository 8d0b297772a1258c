#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::data {

size_t dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::u8: case TokenDType::i8: return 1;
    case TokenDType::i16: case TokenDType::u16: return 2;
    case TokenDType::i32: case TokenDType::f32: return 4;
    case TokenDType::i64: case TokenDType::f64: return 8;
  }
  fail("unknown dtype code {}", static_cast<int>(t));
}

const char* dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::u8: return "uint8";
    case TokenDType::i8: return "int8";
    case TokenDType::i16: return "int16";
    case TokenDType::i32: return "int32";
    case TokenDType::i64: return "int64";
    case TokenDType::f64: return "float64";
    case TokenDType::f32: return "float32";
    case TokenDType::u16: return "uint16";
  }
  return "unknown";
}

TokenDType optimal_dtype(int64_t vocab_size) { return vocab_size < 65500 ? TokenDType::u16 : TokenDType::i32; }

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat '{}': {}", path, std::strerror(errno));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("cannot map '{}': {}", path, std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  idx_ = std::make_unique<MappedFile>(idx_path);
  bin_ = std::make_unique<MappedFile>(bin_path);
  const uint8_t* p = idx_->data();
  const size_t n = idx_->size();
  constexpr size_t kHeader = 9 + 8 + 1 + 8 + 8;
  if (n < kHeader) fail("index '{}' is truncated: {} bytes, a header alone is {}", idx_path, n, kHeader);
  if (std::memcmp(p, kIndexMagic, 9) != 0)
    fail("'{}' is not a Megatron index: it does not start with MMIDIDX\\x00\\x00", idx_path);
  uint64_t version, seqs, docs;
  std::memcpy(&version, p + 9, 8);
  if (version != kIndexVersion) fail("index '{}' has version {}, only version 1 is known", idx_path, version);
  uint8_t code = p[17];
  if (code < 1 || code > 8) fail("index '{}' has unknown dtype code {} (known: 1..8)", idx_path, code);
  dtype_ = static_cast<TokenDType>(code);
  if (dtype_ == TokenDType::f32 || dtype_ == TokenDType::f64)
    fail("index '{}' stores {} values, not token ids", idx_path, dtype_name(dtype_));
  std::memcpy(&seqs, p + 18, 8);
  std::memcpy(&docs, p + 26, 8);
  // Overflow-safe size check before any span is formed.
  if (seqs > n / 12 || docs > n / 8)
    fail("index '{}' is truncated or corrupt: it claims {} sequences and {} document entries in {} bytes", idx_path,
         seqs, docs, n);
  size_t want = kHeader + seqs * 4 + seqs * 8 + docs * 8;
  const bool paired = n == want + kPairTrailerBytes && std::memcmp(p + want, kPairMagic, 8) == 0;
  if (n != want && n != want + seqs && !paired)  // + seqs: Megatron's multimodal sequence modes
    fail("index '{}' is {} bytes but its header ({} sequences, {} document entries) needs {}: truncated or corrupt",
         idx_path, n, seqs, docs, want);
  sizes_ = {reinterpret_cast<const int32_t*>(p + kHeader), seqs};
  pointers_ = {reinterpret_cast<const int64_t*>(p + kHeader + seqs * 4), seqs};
  doc_idx_ = {reinterpret_cast<const int64_t*>(p + kHeader + seqs * 12), docs};

  const int64_t item = static_cast<int64_t>(dtype_size(dtype_));
  int64_t expect = 0;
  for (size_t i = 0; i < seqs; ++i) {
    if (sizes_[i] < 0) fail("index '{}': sequence {} has negative length {}", idx_path, i, sizes_[i]);
    if (pointers_[i] != expect)
      fail("index '{}': sequence {} starts at byte {}, expected {} (index corrupt)", idx_path, i, pointers_[i], expect);
    expect += sizes_[i] * item;
    num_tokens_ += sizes_[i];
  }
  if (static_cast<uint64_t>(expect) != bin_->size())
    fail("'{}' is {} bytes but its index '{}' describes {} bytes ({} tokens of {}): the files do not match", bin_path,
         bin_->size(), idx_path, expect, num_tokens_, dtype_name(dtype_));
  if (paired) {
    uint64_t bin_bytes = 0;
    uint32_t crc = 0;
    std::memcpy(&bin_bytes, p + want + 8, 8);
    std::memcpy(&crc, p + want + 16, 4);
    if (bin_bytes != bin_->size() || crc != sampled_crc(bin_->data(), bin_->size()))
      fail("'{}' is not the .bin that '{}' was written with (its content differs from what the index recorded: "
           "{} bytes, sampled CRC-32 {:08x}; the .bin has {} bytes, CRC-32 {:08x}): the pair comes from two corpora, "
           "or one of them was replaced",
           bin_path, idx_path, bin_bytes, crc, bin_->size(), sampled_crc(bin_->data(), bin_->size()));
  }
  if (docs == 0 || doc_idx_[0] != 0 || doc_idx_[docs - 1] != static_cast<int64_t>(seqs))
    fail("index '{}': document indices must run from 0 to the sequence count {}", idx_path, seqs);
  for (size_t d = 1; d < docs; ++d)
    if (doc_idx_[d] < doc_idx_[d - 1]) fail("index '{}': document indices decrease at entry {}", idx_path, d);
}

void IndexedDataset::append(size_t i, int64_t offset, int64_t length, std::vector<int32_t>& out) const {
  if (i >= sizes_.size()) fail("sequence {} is out of range: '{}' has {}", i, prefix_, sizes_.size());
  int64_t size = sizes_[i];
  if (length < 0) length = size - offset;
  if (offset < 0 || length < 0 || offset + length > size)
    fail("tokens [{}, {}) are outside sequence {} of length {} in '{}'", offset, offset + length, i, size, prefix_);
  const uint8_t* base = bin_->data() + pointers_[i];
  size_t at = out.size();
  out.resize(at + length);
  int32_t* dst = out.data() + at;
  // memcpy per element: the .bin has no alignment guarantee for a sequence pointer.
  auto copy = [&]<typename T>(T) {
    const uint8_t* src = base + offset * sizeof(T);
    for (int64_t k = 0; k < length; ++k) {
      T v;
      std::memcpy(&v, src + k * sizeof(T), sizeof(T));
      dst[k] = static_cast<int32_t>(v);
    }
  };
  switch (dtype_) {
    case TokenDType::u8: copy(uint8_t{}); break;
    case TokenDType::i8: copy(int8_t{}); break;
    case TokenDType::i16: copy(int16_t{}); break;
    case TokenDType::u16: copy(uint16_t{}); break;
    case TokenDType::i32: std::memcpy(dst, base + offset * 4, length * 4); break;
    case TokenDType::i64: copy(int64_t{}); break;
    default: fail("'{}' stores {} values, not token ids", prefix_, dtype_name(dtype_));
  }
}

std::vector<int32_t> IndexedDataset::get(size_t i, int64_t offset, int64_t length) const {
  std::vector<int32_t> out;
  append(i, offset, length, out);
  return out;
}

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& prefix, TokenDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  if (dtype != TokenDType::u8 && dtype != TokenDType::u16 && dtype != TokenDType::i32 && dtype != TokenDType::i64 &&
      dtype != TokenDType::i16 && dtype != TokenDType::i8)
    fail("cannot write tokens as {}", dtype_name(dtype));
  // Temporary names in the output's folder (rename stays within one file system).
  const std::string tag = fmt::format(".tmp.{}.{}", ::getpid(), reinterpret_cast<uintptr_t>(this));
  bin_tmp_ = prefix + ".bin" + tag;
  idx_tmp_ = prefix + ".idx" + tag;
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  if (!bin_) fail("cannot create '{}': {}", bin_tmp_, std::strerror(errno));
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) {  // abandoned: nothing of it may remain
    std::remove(bin_tmp_.c_str());
    std::remove(idx_tmp_.c_str());
  }
}

void IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) {
  if (finalized_) fail("'{}': add_item after finalize", prefix_);
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("'{}': a sequence of {} tokens does not fit the index's int32 length", prefix_, tokens.size());
  size_t item = dtype_size(dtype_);
  buf_.resize(tokens.size() * item);
  char* b = buf_.data();
  auto put = [&]<typename T>(T lo, T hi) {
    for (size_t k = 0; k < tokens.size(); ++k) {
      int64_t v = tokens[k];
      if (v < static_cast<int64_t>(lo) || v > static_cast<int64_t>(hi))
        fail("token id {} does not fit the dataset dtype {} of '{}'", v, dtype_name(dtype_), prefix_);
      T t = static_cast<T>(v);
      std::memcpy(b + k * sizeof(T), &t, sizeof(T));
    }
  };
  switch (dtype_) {
    case TokenDType::u8: put(uint8_t{0}, uint8_t{255}); break;
    case TokenDType::i8: put(int8_t{-128}, int8_t{127}); break;
    case TokenDType::i16: put(int16_t{-32768}, int16_t{32767}); break;
    case TokenDType::u16: put(uint16_t{0}, uint16_t{65535}); break;
    case TokenDType::i32: std::memcpy(b, tokens.data(), tokens.size() * 4); break;
    case TokenDType::i64: put(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()); break;
    default: break;
  }
  if (!buf_.empty() && std::fwrite(b, 1, buf_.size(), bin_) != buf_.size())
    fail("cannot write '{}': {}", bin_tmp_, std::strerror(errno));
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetBuilder::end_document() { doc_idx_.push_back(static_cast<int64_t>(sizes_.size())); }

void IndexedDatasetBuilder::finalize() {
  if (finalized_) return;
  const bool bin_ok = std::fflush(bin_) == 0 && ::fsync(::fileno(bin_)) == 0;
  const int bin_err = errno;
  const bool closed = std::fclose(bin_) == 0;
  bin_ = nullptr;
  if (!bin_ok || !closed) fail("cannot write '{}': {}", bin_tmp_, std::strerror(bin_ok ? errno : bin_err));
  uint32_t crc = 0;
  uint64_t bin_bytes = 0;
  {
    MappedFile bin(bin_tmp_);
    bin_bytes = bin.size();
    crc = sampled_crc(bin.data(), bin.size());
  }
  std::FILE* f = std::fopen(idx_tmp_.c_str(), "wb");
  if (!f) fail("cannot create '{}': {}", idx_tmp_, std::strerror(errno));
  uint64_t version = kIndexVersion, seqs = sizes_.size(), docs = doc_idx_.size();
  uint8_t code = static_cast<uint8_t>(dtype_);
  std::vector<int64_t> pointers(seqs);
  int64_t at = 0;
  for (size_t i = 0; i < seqs; ++i) pointers[i] = at, at += static_cast<int64_t>(sizes_[i]) * dtype_size(dtype_);
  char trailer[kPairTrailerBytes] = {};
  std::memcpy(trailer, kPairMagic, 8);
  std::memcpy(trailer + 8, &bin_bytes, 8);
  std::memcpy(trailer + 16, &crc, 4);
  bool ok = std::fwrite(kIndexMagic, 1, 9, f) == 9 && std::fwrite(&version, 8, 1, f) == 1 &&
            std::fwrite(&code, 1, 1, f) == 1 && std::fwrite(&seqs, 8, 1, f) == 1 && std::fwrite(&docs, 8, 1, f) == 1 &&
            std::fwrite(sizes_.data(), 4, seqs, f) == seqs && std::fwrite(pointers.data(), 8, seqs, f) == seqs &&
            std::fwrite(doc_idx_.data(), 8, docs, f) == docs &&
            std::fwrite(trailer, 1, kPairTrailerBytes, f) == kPairTrailerBytes;
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) fail("cannot write '{}': {}", idx_tmp_, std::strerror(errno));
  // Into place: the .bin first, so that a reader never pairs the new .idx with the old .bin (and
  // a reader that pairs the old .idx with the new .bin is refused by the trailer).
  if (std::rename(bin_tmp_.c_str(), (prefix_ + ".bin").c_str()) != 0)
    fail("cannot rename '{}' to '{}.bin': {}", bin_tmp_, prefix_, std::strerror(errno));
  if (std::rename(idx_tmp_.c_str(), (prefix_ + ".idx").c_str()) != 0)
    fail("cannot rename '{}' to '{}.idx': {}", idx_tmp_, prefix_, std::strerror(errno));
  finalized_ = true;
}

uint32_t sampled_crc(const uint8_t* data, size_t size) {
  constexpr size_t kPage = 4096, kPages = 64;
  uLong crc = crc32(0, nullptr, 0);
  if (size == 0) return uint32_t(crc);
  const size_t len = std::min(kPage, size);
  for (size_t k = 0; k < kPages; ++k) {
    const size_t at = (size - len) / (kPages - 1) * k;
    crc = crc32(crc, data + at, uInt(len));
  }
  return uint32_t(crc);
}

}  // namespace primus::data
