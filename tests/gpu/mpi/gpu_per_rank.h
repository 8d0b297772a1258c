// For tests run under mpirun with one GPU per rank: skip where a host has fewer GPUs than ranks
// (on the emulated GPU every rank has its own), and a temporary folder shared by the ranks.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include <cuda_runtime_api.h>

#include "core/launch_env.h"
#include "gpu_test_util.h"
#include "parallel/mpi_process_group.h"

#ifdef PRIMUS_EMULATED_GPU
#define PRIMUS_REQUIRE_A_GPU_PER_RANK() PRIMUS_REQUIRE_GPU()
#else
#define PRIMUS_REQUIRE_A_GPU_PER_RANK()                                                              \
  do {                                                                                               \
    if (!::primus::cuda::available()) GTEST_SKIP() << ::primus::cuda::unavailable_reason();          \
    int gpus_ = 0;                                                                                   \
    cudaGetDeviceCount(&gpus_);                                                                      \
    const ::primus::LaunchEnv env_ = ::primus::discover_launch_env();                                \
    if (gpus_ < env_.local_world_size)                                                               \
      GTEST_SKIP() << gpus_ << " GPUs for " << env_.local_world_size << " ranks on this host";       \
  } while (0)
#endif

namespace primus::gputest {

// <tmp>/<prefix><rank 0's pid>, the same path on every rank (rank 0's, broadcast).
inline std::filesystem::path shared_temp_dir(const std::string& prefix) {
  auto& world = parallel::mpi_world();
  std::string name = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
  int64_t n = int64_t(name.size());
  world.broadcast(&n, 1, parallel::CommType::I64, 0);
  name.resize(size_t(n));
  world.broadcast(name.data(), n, parallel::CommType::U8, 0);
  return name;
}

}  // namespace primus::gputest
