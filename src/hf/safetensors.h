// safetensors, Hugging Face's weight format: an 8-byte little-endian header length N, N bytes of
// JSON ({"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
// {..}}), then the raw little-endian tensor bytes, offsets relative to the end of the header.
// A sharded model is several such files plus model.safetensors.index.json, whose "weight_map"
// names the file of each tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace primus::hf {

struct TensorEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the file's data section
  std::string file;             // the .safetensors file that holds it
  int64_t numel() const;
};

// Bytes per element of a safetensors dtype name; 0 when the name is unknown.
int64_t dtype_size(const std::string& dtype);

// Reads a model.safetensors file, a folder with model.safetensors, or a folder with
// model.safetensors.index.json and its shards. Headers are checked on open (offsets inside the
// file, sizes matching shapes, no overlaps, no tensor named twice, nesting and size bounded:
// core/bounded_json.h); errors name the file and the tensor. A folder holding both an index and a
// model.safetensors that the index does not name is refused: they are two models.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorEntry& entry(const std::string& name) const;  // error naming the tensor when absent
  std::string raw(const std::string& name) const;           // the tensor's bytes as stored
  std::vector<float> as_f32(const std::string& name) const;  // F32, BF16 or F16, widened exactly

 private:
  void read_index(const std::filesystem::path& dir);
  void read_header(const std::string& file);
  std::string where_;
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, uint64_t> data_start_;  // file -> offset of its data section
};

struct TensorOut {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Writes `tensors` into `dir` as model.safetensors, or, when they exceed max_shard_bytes, as
// model-0000i-of-0000n.safetensors shards with model.safetensors.index.json (tensors are never
// split; a shard closes before the tensor that would overflow it). Files are written under a
// temporary name and renamed. Returns the files written.
std::vector<std::string> write_safetensors(const std::string& dir, const std::vector<TensorOut>& tensors,
                                           uint64_t max_shard_bytes,
                                           const std::map<std::string, std::string>& metadata = {});

// fp32 <-> bf16 bytes (little-endian). To bf16 rounds to nearest even (NaN stays NaN).
std::string f32_to_bytes(const std::vector<float>& v, const std::string& dtype);

}  // namespace primus::hf
