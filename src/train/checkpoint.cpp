#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::train {
namespace {

constexpr int kFormatVersion = 1;

uint32_t crc_of(const void* data, size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes 32-bit lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(crc);
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) fail("cannot open {} to sync it", p.string());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync of {} failed", p.string());
}

// Writes, flushes and fsyncs one file; returns its CRC.
uint32_t write_file(const fs::path& p, const void* data, size_t bytes) {
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create {}", p.string());
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    out.flush();
    if (!out) fail("writing {} failed (disk full?)", p.string());
  }
  fsync_path(p, false);
  return crc_of(data, bytes);
}

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("checkpoint file {} is missing or unreadable", p.string());
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// Verifies size and CRC recorded in meta.json, then returns the bytes.
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
  if (meta.value("format_version", 0) != kFormatVersion)
    fail("checkpoint {}: format_version {} is not the supported {}", dir.string(), meta.value("format_version", 0),
         kFormatVersion);
  return meta;
}

}  // namespace

std::string checkpoint_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string save_checkpoint(const std::string& save_dir, const ParamStore<float>& params, const float* exp_avg,
                            const float* exp_avg_sq, const TrainState& state, const std::string& config_yaml) {
  const fs::path root(save_dir);
  fs::create_directories(root);
  const fs::path final_dir = root / checkpoint_name(state.iteration);
  const fs::path tmp = root / fmt::format(".{}.tmp-{}", checkpoint_name(state.iteration), ::getpid());
  // Temporary folders left by writers that died are garbage: no `latest` ever named them.
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().starts_with(".iter_")) fs::remove_all(e.path());
  fs::create_directories(tmp);

  const size_t n = static_cast<size_t>(params.numel());
  json meta;
  meta["format_version"] = kFormatVersion;
  meta["iteration"] = state.iteration;
  meta["consumed_samples"] = state.consumed_samples;
  meta["optimizer_step"] = state.optimizer_step;
  meta["seed"] = state.seed;
  meta["numel"] = n;
  json layout = json::array();
  for (const auto& p : params.infos())
    layout.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
  meta["parameters"] = layout;
  // Fault injection for the crash tests: die like a killed rank right after writing one file.
  const char* kill_after = std::getenv("PRIMUS_FAULT_CHECKPOINT_KILL_AFTER");
  auto record = [&](const char* name, const void* data, size_t bytes) {
    meta["files"][name] = {{"bytes", bytes}, {"crc32", write_file(tmp / name, data, bytes)}};
    if (kill_after && std::string(kill_after) == name) ::raise(SIGKILL);
  };
  record("model.bin", params.values().data<float>(), n * sizeof(float));
  std::vector<float> moments(2 * n);
  std::copy(exp_avg, exp_avg + n, moments.begin());
  std::copy(exp_avg_sq, exp_avg_sq + n, moments.begin() + n);
  record("optimizer.bin", moments.data(), moments.size() * sizeof(float));
  record("config.yaml", config_yaml.data(), config_yaml.size());
  const std::string meta_text = meta.dump(1);
  write_file(tmp / "meta.json", meta_text.data(), meta_text.size());
  fsync_path(tmp, true);

  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // re-saving the same iteration after a restart
  fs::rename(tmp, final_dir);
  fsync_path(root, true);

  const std::string latest = checkpoint_name(state.iteration) + "\n";
  write_file(root / ".latest.tmp", latest.data(), latest.size());
  fs::rename(root / ".latest.tmp", root / "latest");
  fsync_path(root, true);
  return final_dir.string();
}

CheckpointData load_checkpoint(const std::string& dir_text, const ParamStore<float>& params) {
  const fs::path dir(dir_text);
  const json meta = read_meta(dir);
  CheckpointData out;
  try {
    out.state.iteration = meta.at("iteration");
    out.state.consumed_samples = meta.at("consumed_samples");
    out.state.optimizer_step = meta.at("optimizer_step");
    out.state.seed = meta.at("seed");
    // The layout must match the model exactly: same tensors, same shapes, same places.
    const auto& layout = meta.at("parameters");
    const auto& infos = params.infos();
    if (layout.size() != infos.size())
      fail("checkpoint {} holds {} parameter tensors, the model has {}", dir.string(), layout.size(), infos.size());
    for (size_t i = 0; i < infos.size(); ++i) {
      const auto& l = layout[i];
      if (l.at("name") != infos[i].name || l.at("shape").get<Shape>() != infos[i].shape ||
          l.at("offset").get<int64_t>() != infos[i].offset)
        fail("checkpoint {}: parameter {} is {} {} there but {} {} in the model", dir.string(), i,
             l.at("name").get<std::string>(), l.at("shape").dump(), infos[i].name,
             json(infos[i].shape).dump());
    }
  } catch (const json::exception& e) {
    fail("checkpoint {}/meta.json is missing a field: {}", dir.string(), e.what());
  }
  const size_t n = static_cast<size_t>(params.numel());
  std::vector<char> model = read_verified(dir, meta, "model.bin");
  if (model.size() != n * sizeof(float))
    fail("checkpoint file {} holds {} values, the model has {}", (dir / "model.bin").string(), model.size() / 4, n);
  std::vector<char> optim = read_verified(dir, meta, "optimizer.bin");
  if (optim.size() != 2 * n * sizeof(float))
    fail("checkpoint file {} holds {} values, expected {}", (dir / "optimizer.bin").string(), optim.size() / 4, 2 * n);
  std::vector<char> config = read_verified(dir, meta, "config.yaml");
  out.params.resize(n);
  std::memcpy(out.params.data(), model.data(), model.size());
  out.exp_avg.resize(n);
  out.exp_avg_sq.resize(n);
  std::memcpy(out.exp_avg.data(), optim.data(), n * sizeof(float));
  std::memcpy(out.exp_avg_sq.data(), optim.data() + n * sizeof(float), n * sizeof(float));
  out.config_yaml.assign(config.begin(), config.end());
  return out;
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
