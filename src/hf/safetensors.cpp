#include "hf/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/bounded_json.h"
#include "core/dtype.h"
#include "core/error.h"

namespace primus::hf {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
// A header larger than this is not a real model's (HF's own reader refuses above 100 MB).
constexpr uint64_t kMaxHeader = 100u << 20;
// The largest real index (DeepSeek-V3's, 91k tensors) is about 9 MB.
constexpr uint64_t kMaxIndex = uint64_t(64) << 20;

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);  // zero and subnormals
    uint32_t b;
    std::memcpy(&b, &f, 4);
    b |= sign;
    std::memcpy(&f, &b, 4);
    return f;
  }
  uint32_t b = exp == 31 ? sign | 0x7F800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  std::memcpy(&f, &b, 4);
  return f;
}

std::string read_range(const std::string& file, uint64_t off, uint64_t n) {
  std::ifstream f(file, std::ios::binary);
  if (!f) fail("cannot open safetensors file '{}'", file);
  std::string out(n, '\0');
  f.seekg(std::streamoff(off));
  f.read(out.data(), std::streamsize(n));
  if (uint64_t(f.gcount()) != n) fail("safetensors file '{}' is truncated (wanted bytes {}..{})", file, off, off + n);
  return out;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : where_(path) {
  std::error_code ec;
  fs::path p(path);
  if (!fs::exists(p, ec)) fail("safetensors path '{}' does not exist", path);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / kIndexName, ec)) {
      read_index(p);
      return;
    }
    p /= "model.safetensors";
    if (!fs::exists(p, ec))
      fail("folder '{}' holds neither model.safetensors nor {}", path, kIndexName);
  }
  read_header(p.string());
}

void SafetensorsReader::read_index(const fs::path& dir) {
  const std::string index = (dir / kIndexName).string();
  JsonLimits limits;
  limits.max_bytes = kMaxIndex;
  limits.unique_keys = true;  // a tensor named twice in weight_map
  const json j = read_json_file(index, fmt::format("safetensors index '{}'", index), limits);
  try {
    std::vector<std::string> files;
    for (auto& [name, file] : j.at("weight_map").items()) {
      const std::string fn = file.get<std::string>();
      if (fn.find('/') != std::string::npos || fn.find("..") != std::string::npos)
        fail("{}: tensor '{}' names file '{}' outside the folder", index, name, fn);
      files.push_back(fn);
    }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    // A single model.safetensors beside an index that does not name it: two models in one folder
    // (e.g. a sharded export over a single-file one), and no way to tell which one is meant.
    std::error_code ec;
    if (fs::exists(dir / "model.safetensors", ec) &&
        !std::binary_search(files.begin(), files.end(), std::string("model.safetensors")))
      fail("folder '{}' holds model.safetensors and {}, which names other files ({}): they are two different "
           "models; keep the one you mean and move the other out of the folder",
           dir.string(), kIndexName, fmt::join(files, ", "));
    for (const auto& fn : files) read_header((dir / fn).string());
    for (auto& [name, file] : j.at("weight_map").items()) {
      auto it = tensors_.find(name);
      if (it == tensors_.end() || it->second.file != (dir / file.get<std::string>()).string())
        fail("{}: tensor '{}' is not in its file '{}'", index, name, file.get<std::string>());
    }
  } catch (const json::exception& e) {
    fail("'{}' is not a valid safetensors index: {}", index, e.what());
  }
}

void SafetensorsReader::read_header(const std::string& file) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) fail("cannot read safetensors file '{}': {}", file, ec.message());
  if (size < 8) fail("safetensors file '{}' is too short ({} bytes)", file, size);
  const std::string len_bytes = read_range(file, 0, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(len_bytes[i]);
  if (n > kMaxHeader || n > size - 8) fail("safetensors file '{}': header length {} does not fit the file", file, n);
  JsonLimits limits;
  limits.unique_keys = true;  // a tensor named twice: the JSON reader would keep the last one silently
  const json h = parse_json(read_range(file, 8, n), fmt::format("the header of safetensors file '{}'", file), limits);
  if (!h.is_object()) fail("safetensors file '{}': the header is not a JSON object", file);
  const uint64_t data = 8 + n, data_size = size - data;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    TensorEntry t;
    t.name = name;
    t.file = file;
    // Sizes and offsets must be whole numbers as written: 1e33 (a float to JSON) converted to an
    // integer is undefined behaviour.
    auto whole = [&](const json& x, const char* field) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("safetensors file '{}': tensor '{}' has {} holding {}, not a size", file, t.name, field, x.dump());
      return x.get<uint64_t>();
    };
    try {
      t.dtype = v.at("dtype").get<std::string>();
      const json& shape = v.at("shape");
      const json& off = v.at("data_offsets");
      if (!shape.is_array() || !off.is_array() || off.size() != 2)
        fail("safetensors file '{}': tensor '{}' needs a shape list and two data_offsets", file, name);
      for (const json& d : shape) t.shape.push_back(int64_t(whole(d, "shape")));
      t.begin = whole(off[0], "data_offsets"), t.end = whole(off[1], "data_offsets");
    } catch (const json::exception& e) {
      fail("safetensors file '{}': tensor '{}' has a malformed entry: {}", file, name, e.what());
    }
    const int64_t es = dtype_size(t.dtype);
    if (es == 0) fail("safetensors file '{}': tensor '{}' has unknown dtype '{}'", file, name, t.dtype);
    uint64_t bytes = uint64_t(es);  // the shape's size, without overflow: no larger than the file
    for (int64_t d : t.shape)
      if (d < 0 || __builtin_mul_overflow(bytes, uint64_t(d), &bytes) || bytes > size)
        fail("safetensors file '{}': tensor '{}' has shape [{}], which does not fit the file ({} bytes)", file, name,
             fmt::join(t.shape, ", "), size);
    if (t.begin > t.end || t.end > data_size || t.end - t.begin != bytes)
      fail("safetensors file '{}': tensor '{}' ({} {}) has data_offsets [{}, {}] that do not match its size or the "
           "file ({} data bytes)", file, name, t.dtype, fmt::join(t.shape, "x"), t.begin, t.end, data_size);
    if (tensors_.count(name)) fail("safetensors: tensor '{}' appears twice ({} and {})", name, tensors_[name].file, file);
    ranges.emplace_back(t.begin, t.end);
    tensors_[name] = t;
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail("safetensors file '{}': tensors overlap", file);
  data_start_[file] = data;
}

const TensorEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("'{}' has no tensor '{}'", where_, name);
  return it->second;
}

std::string SafetensorsReader::raw(const std::string& name) const {
  const TensorEntry& t = entry(name);
  return read_range(t.file, data_start_.at(t.file) + t.begin, t.end - t.begin);
}

std::vector<float> SafetensorsReader::as_f32(const std::string& name) const {
  const TensorEntry& t = entry(name);
  const std::string b = raw(name);
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == "F32") {
    std::memcpy(out.data(), b.data(), b.size());
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      if (t.dtype == "BF16") {
        uint32_t u = uint32_t(h) << 16;
        std::memcpy(&out[i], &u, 4);
      } else {
        out[i] = half_to_float(h);
      }
    }
  } else {
    fail("'{}': tensor '{}' has dtype {}; weights must be F32, BF16 or F16", where_, name, t.dtype);
  }
  return out;
}

std::string f32_to_bytes(const std::vector<float>& v, const std::string& dtype) {
  std::string out;
  if (dtype == "F32") {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
  } else if (dtype == "BF16") {
    out.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t b = bf16::from_float(v[i]).bits;
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  } else {
    fail("cannot write weights as {} (F32 or BF16)", dtype);
  }
  return out;
}

namespace {

void write_file(const fs::path& path, const std::vector<const TensorOut*>& ts,
                const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const TensorOut* t : ts) {
    const int64_t es = dtype_size(t->dtype);
    int64_t n = 1;
    for (int64_t d : t->shape) n *= d;
    if (es == 0 || uint64_t(n * es) != t->bytes.size())
      fail("safetensors: tensor '{}' has {} bytes, its shape and dtype {} need {}", t->name, t->bytes.size(), t->dtype,
           n * es);
    h[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {off, off + t->bytes.size()}}};
    off += t->bytes.size();
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as HF writes it
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot create '{}'", tmp.string());
    char len[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = char((n >> (8 * i)) & 0xFF);
    f.write(len, 8);
    f.write(header.data(), std::streamsize(header.size()));
    for (const TensorOut* t : ts) f.write(t->bytes.data(), std::streamsize(t->bytes.size()));
    f.flush();
    if (!f) fail("cannot write '{}' (disk full?)", tmp.string());
  }
  fs::rename(tmp, path);
}

}  // namespace

std::vector<std::string> write_safetensors(const std::string& dir, const std::vector<TensorOut>& tensors,
                                           uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  fs::create_directories(dir);
  std::vector<std::vector<const TensorOut*>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const TensorOut& t : tensors) {
    if (in_shard > 0 && in_shard + t.bytes.size() > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(&t);
    in_shard += t.bytes.size();
    total += t.bytes.size();
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_file(fs::path(dir) / "model.safetensors", shards[0], metadata);
    written.push_back((fs::path(dir) / "model.safetensors").string());
    return written;
  }
  json map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    write_file(fs::path(dir) / name, shards[i], metadata);
    for (const TensorOut* t : shards[i]) map[t->name] = name;
    written.push_back((fs::path(dir) / name).string());
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  std::ofstream(fs::path(dir) / kIndexName) << index.dump(2) << "\n";
  written.push_back((fs::path(dir) / kIndexName).string());
  return written;
}

}  // namespace primus::hf
