// Where and in what precision a run trains, from the `device` (auto | cpu | cuda) and `bf16`
// keys. The model is the same in every case (model/llama.h); only its backend and precision
// change:
//   bf16: false  fp32 on the CPU backend (kernels/cpu/cpu_backend.h). device: cuda is an error
//                (the GPU backend computes in bf16).
//   bf16: true   bf16 mixed precision: on the GPU when device is cuda, or auto with a GPU
//                present; else on the CPU: cpu_bf16_backend() below.
#pragma once

#include <memory>
#include <string>

#include "config/experiment.h"
#include "kernels/backend.h"
#include "model/llama.h"
#include "parallel/process_group.h"

namespace primus::train {

struct Compute {
  Device device = Device::CPU;
  Precision precision = Precision::Fp32;
  ops::Backend* backend = nullptr;        // the CPU backend, or owned below
  std::unique_ptr<ops::Backend> owned;
  std::string describe() const;  // "cuda (NVIDIA H100 80GB HBM3), bf16 mixed precision"
  // Memory the run's tensors may use, and its name for messages: the GPU's free memory, or the
  // host's available memory (0: unknown).
  uint64_t memory_available() const;
  std::string memory_name() const;
};

bool cuda_built();      // the CUDA backend was compiled in
bool cuda_usable();     // ... and a GPU with a driver is present

// Decides from the config; local_rank picks the GPU (local_rank modulo the GPUs present). Throws
// primus::Error naming the key when the request cannot be met (device: cuda without a GPU or
// without the CUDA build, cuda with bf16: false).
Compute choose_compute(const config::TrainingArgs& args, int local_rank);

// bf16 on the CPU: the bf16 backend (kernels/cpu/bf16) where the CPU has AVX512-BF16, with AMX
// through oneDNN where it has that too (a one-line message names the path when AMX is missing);
// else, with a warning, the reference backend. PRIMUS_CPU_BF16=reference picks the reference
// backend on purpose (tests, checks); any value but auto and reference is an error.
std::unique_ptr<ops::Backend> cpu_bf16_backend();

// The communicator for the run's tensors: `host_world` itself for CPU tensors; for GPU tensors
// with more than one rank, an NCCL group bootstrapped through host_world (MPI). Returns nullptr
// when host_world is the right one.
std::unique_ptr<parallel::ProcessGroup> device_world(const Compute& compute, parallel::ProcessGroup& host_world);

}  // namespace primus::train
