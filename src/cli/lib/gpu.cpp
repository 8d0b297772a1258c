#include "cli/lib/gpu.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "cli/lib/process.h"

namespace primus::cli {
namespace fs = std::filesystem;
namespace {

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!trim(item).empty()) out.push_back(trim(item));
  return out;
}

std::string vendor_of(const std::string& name) {
  std::string u = name;
  std::transform(u.begin(), u.end(), u.begin(), ::toupper);
  if (u.find("NVIDIA") != std::string::npos || std::regex_search(u, std::regex(R"(\b[HABL]\d{2,3}|\bGB\d{3})")))
    return "nvidia";
  if (u.find("AMD") != std::string::npos || u.find("INSTINCT") != std::string::npos ||
      std::regex_search(u, std::regex(R"(\bMI\d{3})")))
    return "amd";
  return "nvidia";  // unknown names come from nvidia-smi more often than not
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string cuda_toolkit_version() {
  // version.json ships with every CUDA since 11; nvcc is the fallback.
  std::string j = read_file("/usr/local/cuda/version.json");
  std::smatch m;
  if (std::regex_search(j, m, std::regex(R"re("cuda"\s*:\s*\{[^}]*"version"\s*:\s*"([^"]+)")re"))) return m[1];
  if (auto nvcc = find_program("nvcc")) {
    auto c = run_capture({*nvcc, "--version"});
    if (std::regex_search(c.out, m, std::regex(R"(release ([0-9.]+))"))) return m[1];
  }
  return "";
}

std::string rocm_version() {
  for (const char* p : {"/opt/rocm/.info/version", "/opt/rocm/.info/version-dev"}) {
    std::string v = trim(read_file(p));
    if (!v.empty()) return v;
  }
  return "";
}

bool detect_nvidia(DeviceInfo& d) {
  auto smi = find_program("nvidia-smi");
  if (!smi) return false;
  auto c = run_capture({*smi, "--query-gpu=name,driver_version", "--format=csv,noheader"});
  if (c.exit_code != 0) return false;  // installed but no driver/GPU: treat as none
  for (auto& line : split(c.out, '\n')) {
    auto cols = split(line, ',');
    if (cols.empty()) continue;
    d.names.push_back(cols[0]);
    if (cols.size() > 1) d.driver_version = cols[1];
  }
  if (d.names.empty()) return false;
  d.vendor = "nvidia";
  d.source = "nvidia-smi";
  d.toolkit_version = cuda_toolkit_version();
  return true;
}

bool detect_amd_smi(DeviceInfo& d) {
  auto smi = find_program("rocm-smi");
  if (!smi) return false;
  auto c = run_capture({*smi, "--showproductname", "--csv"});
  if (c.exit_code != 0) return false;
  // CSV header: device,Card series,Card model,Card vendor,Card SKU,...; the series names the part.
  auto lines = split(c.out, '\n');
  int col = -1;
  for (auto& line : lines) {
    auto cols = split(line, ',');
    if (col < 0) {
      for (size_t i = 0; i < cols.size(); ++i)
        if (cols[i] == "Card series" || cols[i] == "Card Series") col = static_cast<int>(i);
      continue;
    }
    if (static_cast<int>(cols.size()) > col && cols[0].rfind("card", 0) == 0) d.names.push_back(cols[col]);
  }
  if (d.names.empty()) return false;
  d.vendor = "amd";
  d.source = "rocm-smi";
  d.driver_version = trim(read_file("/sys/module/amdgpu/version"));
  d.toolkit_version = rocm_version();
  return true;
}

bool detect_kfd(DeviceInfo& d) {
  fs::path nodes = "/sys/class/kfd/kfd/topology/nodes";
  std::error_code ec;
  if (!fs::is_directory(nodes, ec)) return false;
  std::vector<fs::path> dirs;
  for (auto& e : fs::directory_iterator(nodes, ec)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (auto& n : dirs) {
    std::string props = read_file(n / "properties");
    std::smatch m;
    // CPU nodes report gfx_target_version 0.
    if (!std::regex_search(props, m, std::regex(R"(gfx_target_version\s+(\d+))")) || m[1] == "0") continue;
    unsigned id = 0;
    if (std::regex_search(props, m, std::regex(R"(device_id\s+(\d+))"))) id = std::stoul(m[1]);
    std::string model = amd_model_from_device_id(id);
    d.names.push_back(model.empty() ? fmt::format("AMD GPU device 0x{:04x}", id) : "AMD Instinct " + model);
  }
  if (d.names.empty()) return false;
  d.vendor = "amd";
  d.source = "kfd";
  d.driver_version = trim(read_file("/sys/module/amdgpu/version"));
  d.toolkit_version = rocm_version();
  return true;
}

}  // namespace

nlohmann::json DeviceInfo::to_json() const {
  return {{"vendor", vendor}, {"model", model},   {"count", count()},
          {"names", names},   {"driver_version", driver_version},
          {"toolkit_version", toolkit_version},   {"source", source}};
}

std::string normalise_gpu_name(const std::string& name) {
  std::string u = name;
  std::transform(u.begin(), u.end(), u.begin(), ::toupper);
  // Known parts, most specific first (GB200 before B200, H200 NVL still H200).
  static const std::vector<std::pair<std::regex, std::string>> known = {
      {std::regex(R"(GB200)"), "GB200"},   {std::regex(R"(\bB200)"), "B200"},
      {std::regex(R"(\bB100)"), "B100"},   {std::regex(R"(\bH200)"), "H200"},
      {std::regex(R"(\bH100)"), "H100"},   {std::regex(R"(\bH800)"), "H800"},
      {std::regex(R"(\bA100)"), "A100"},   {std::regex(R"(\bA800)"), "A800"},
      {std::regex(R"(\bL40S)"), "L40S"},   {std::regex(R"(MI355X)"), "MI355X"},
      {std::regex(R"(MI350X)"), "MI350X"}, {std::regex(R"(MI325X)"), "MI325X"},
      {std::regex(R"(MI300X)"), "MI300X"}, {std::regex(R"(MI300A)"), "MI300A"},
      {std::regex(R"(MI308X)"), "MI308X"}, {std::regex(R"(MI250X)"), "MI250X"},
      {std::regex(R"(MI250)"), "MI250"},   {std::regex(R"(MI210)"), "MI210"},
  };
  for (auto& [re, model] : known)
    if (std::regex_search(u, re)) return model;
  std::string id;
  for (char c : u) {
    if (std::isalnum(static_cast<unsigned char>(c))) id += c;
    else if (!id.empty() && id.back() != '_') id += '_';
  }
  while (!id.empty() && id.back() == '_') id.pop_back();
  for (const char* prefix : {"NVIDIA_", "AMD_"})
    if (id.rfind(prefix, 0) == 0) id = id.substr(std::string(prefix).size());
  return id.empty() ? "UNKNOWN_GPU" : id;
}

std::string amd_model_from_device_id(unsigned id) {
  switch (id) {
    case 0x74a1: return "MI300X";
    case 0x74a5: return "MI325X";
    case 0x74a0: return "MI300A";
    case 0x74a2: return "MI308X";
    case 0x75a3: return "MI355X";
    case 0x75a0: return "MI350X";
    case 0x7408: return "MI250X";
    case 0x740c: return "MI250X";  // MI250/MI250X share the id; MI250X is the one in clusters
    case 0x740f: return "MI210";
    default: return "";
  }
}

DeviceInfo detect_devices() {
  DeviceInfo d;
  if (const char* fake = std::getenv("PRIMUS_FAKE_GPUS"); fake && *fake) {
    d.source = "PRIMUS_FAKE_GPUS";
    if (std::string(fake) != "none") {
      d.names = split(fake, ',');
      d.vendor = vendor_of(d.names.front());
      d.driver_version = "fake";
    }
  } else if (!detect_nvidia(d) && !detect_amd_smi(d) && !detect_kfd(d)) {
    d = DeviceInfo{};
  }
  // The first GPU decides the preset; mixed nodes keep every name in `names`.
  if (!d.names.empty()) d.model = normalise_gpu_name(d.names.front());
  return d;
}

}  // namespace primus::cli
