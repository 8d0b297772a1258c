// Which accelerator this host has: NVIDIA (nvidia-smi), AMD (rocm-smi, else /sys/class/kfd), or
// none ("CPU"). Model names are normalised (H100, H200, A100, B200, MI300X, MI325X, MI355X, MI250X,
// ...) because configs/envs/<MODEL>.sh is chosen by that name.
//
// PRIMUS_FAKE_GPUS="NVIDIA H100 80GB HBM3,NVIDIA H100 80GB HBM3" replaces detection (tests, and
// preparing a launch for a machine you are not on); PRIMUS_FAKE_GPUS=none means no GPU.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::cli {

struct DeviceInfo {
  std::string vendor = "cpu";  // nvidia | amd | cpu
  std::string model = "CPU";   // normalised model, "CPU" without GPUs
  std::vector<std::string> names;  // as reported, one per GPU
  std::string driver_version;      // "" when unknown
  std::string toolkit_version;     // CUDA / ROCm version, "" when unknown
  std::string source = "none";     // nvidia-smi | rocm-smi | kfd | PRIMUS_FAKE_GPUS | none
  int count() const { return static_cast<int>(names.size()); }
  nlohmann::json to_json() const;
};

// "NVIDIA H100 80GB HBM3" -> "H100", "AMD Instinct MI300X" -> "MI300X"; unknown names become an
// upper-case identifier built from the name ("Tesla T4" -> "TESLA_T4").
std::string normalise_gpu_name(const std::string& name);

// AMD PCI device ids of the Instinct parts, for /sys/class/kfd when rocm-smi is absent.
std::string amd_model_from_device_id(unsigned device_id);

DeviceInfo detect_devices();

}  // namespace primus::cli
