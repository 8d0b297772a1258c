// The one model in bf16 on GPUs under tensor and pipeline parallelism (run under mpirun, one GPU
// per rank): the trainer with device: cuda, its mesh groups over NCCL, against the same layout on
// the CPU reference backend (device: cpu, MPI). The two agree at bf16's resolution, iteration by
// iteration. tests/emulated runs it on emulated GPUs with the emulated NCCL, one per rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <yaml-cpp/yaml.h>

#include "checkpoint/checkpoint.h"
#include "config/experiment.h"
#include "core/launch_env.h"
#include "gpu_per_rank.h"
#include "gpu_test_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "parallel/mpi_process_group.h"
#include "support/relative_error.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace primus {
namespace {

std::vector<double> metric(const fs::path& run_dir, const char* key) {
  std::vector<double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

// How far the run's training moved its weights: the final checkpoint's weights (read into one
// process's layout) minus the initial ones.
std::vector<float> weight_update(const fs::path& run_dir, uint64_t seed) {
  const std::string ck = checkpoint::resolve_checkpoint((run_dir / "checkpoints").string());
  const YAML::Node cfg = YAML::Load(checkpoint::read_checkpoint_config(ck));
  LlamaModel model(model_spec_from_yaml(cfg["modules"]["pre_trainer"]["model_spec"], ck), cpu::cpu_backend(),
                   Precision::Fp32);
  model.init_weights(seed);
  const float* init = model.params().values().data<float>();
  std::vector<float> delta = checkpoint::load_checkpoint(ck, model.params()).params;
  for (size_t i = 0; i < delta.size(); ++i) delta[i] -= init[i];
  return delta;
}

// Steps of each run: three compare the losses, gradient norms and the optimizer's moves (each case
// trains twice on the emulated GPU's CPU time, which is most of the test suite's slowest test).
constexpr int kIters = 3;

// Trains the layout on the GPUs and on the CPU reference backend; compares the losses.
void expect_gpu_matches_reference(const std::string& layout_yaml) {
  PRIMUS_REQUIRE_A_GPU_PER_RANK();
  auto& world = parallel::mpi_world();
  const fs::path dir = gputest::shared_temp_dir("primus_gpu_parallel_");
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier();
  // Head dim 64 (flash attention's), 2 heads and 2 query groups (split by tp 2), 4 microbatches per
  // step; the layout sets num_layers.
  const std::string common = R"(
modules:
  pre_trainer:
    model: tiny
    overrides:
      hidden_size: 128
      num_attention_heads: 2
      num_query_groups: 2
      ffn_hidden_size: 256
      vocab_size: 512
      micro_batch_size: 2
      global_batch_size: 8
      seq_length: 64
      train_iters: )" + std::to_string(kIters) + R"(
      lr: 1.0e-3
      lr_warmup_iters: 1
      log_interval: 1
      eval_interval: 0
      mock_data: true
      bf16: true
)" + layout_yaml;
  std::vector<std::vector<double>> loss, norm;
  for (const char* device : {"cuda", "cpu"}) {
    const fs::path cfg_file = dir / (std::string(device) + ".yaml");
    if (world.rank() == 0)
      std::ofstream(cfg_file) << "exp_name: " << device << "\nworkspace: " << (dir / "ws").string() << common
                              << "      device: " << device << "\n";
    world.barrier();
    const auto cfg = config::load_experiment(cfg_file.string());
    const auto summary = train::pretrain(cfg);
    EXPECT_EQ(summary.iterations, kIters);
    world.barrier();
    loss.push_back(metric(dir / "ws" / device, "lm_loss"));
    norm.push_back(metric(dir / "ws" / device, "grad_norm"));
  }
  if (world.rank() == 0) {
    ASSERT_EQ(loss[0].size(), size_t(kIters));
    ASSERT_EQ(loss[1].size(), size_t(kIters));
    // cuBLASLt's and flash attention's fp32 sums run in other orders than the reference's, and
    // each op rounds to bf16: agreement at bf16's resolution. (Measured: 1e-5 relative on the
    // losses, 1e-4 on the gradient norms.)
    for (size_t i = 0; i < loss[0].size(); ++i) {
      EXPECT_NEAR(loss[0][i], loss[1][i], 1e-3 * loss[1][i]) << "loss, iteration " << i + 1;
      EXPECT_NEAR(norm[0][i], norm[1][i], 1e-2 * norm[1][i]) << "gradient norm, iteration " << i + 1;
    }
    // The optimizer's steps on the GPU (sharded or not) move the weights as the reference's do.
    const double err = test::relative_l2_error(weight_update(dir / "ws" / "cuda", 1234),
                                               weight_update(dir / "ws" / "cpu", 1234));
    EXPECT_LT(err, 0.05) << "relative error of the weight updates";
    std::printf("relative error of the GPU weight updates against the reference: %.2e\n", err);
    fs::remove_all(dir);
  }
}

// Two ranks: each case is a two-way layout.
TEST(GpuParallelTraining, TensorParallelWithSequenceParallel) {
  expect_gpu_matches_reference("      num_layers: 2\n      tensor_model_parallel_size: 2\n      sequence_parallel: true\n");
}

TEST(GpuParallelTraining, PipelineParallel1f1b) {
  expect_gpu_matches_reference("      num_layers: 2\n      pipeline_model_parallel_size: 2\n");
}

// V-shape: both directions between the two ranks carry activations and gradients, which NCCL
// matches in posting order (the executor posts in the peer's send order).
TEST(GpuParallelTraining, PipelineParallelZbv) {
  expect_gpu_matches_reference("      num_layers: 4\n      pipeline_model_parallel_size: 2\n      pipeline_schedule: zbv\n");
}

TEST(GpuParallelTraining, DataParallelWithTheDistributedOptimizer) {
  expect_gpu_matches_reference("      num_layers: 2\n      use_distributed_optimizer: true\n      ddp_bucket_size: 20000\n");
}

// ZeRO-3 / FSDP (docs/context_parallel.md): each rank's shards on its GPU, units all-gathered in
// bf16 over NCCL for their passes and their gradients reduce-scattered as their W passes finish;
// and ZeRO-2, whose working weights stay whole.
TEST(GpuParallelTraining, FullyShardedDataParallel) {
  expect_gpu_matches_reference("      num_layers: 2\n      use_torch_fsdp2: true\n");
}

TEST(GpuParallelTraining, Zero2ShardsTheGradients) {
  expect_gpu_matches_reference("      num_layers: 2\n      data_parallel_sharding_strategy: optim_grads\n");
}

// Expert parallelism (docs/moe.md): each rank holds 2 of the 4 experts of every layer, and the
// token rows cross the NCCL ep group both ways, in the forward and in the backward, under each
// dispatcher; against the same layout on the CPU reference backend (MPI).
TEST(GpuParallelTraining, ExpertParallelAllToAll) {
  expect_gpu_matches_reference("      num_layers: 2\n      num_experts: 4\n      moe_ffn_hidden_size: 128\n"
                               "      moe_router_topk: 2\n      moe_aux_loss_coeff: 0.01\n"
                               "      expert_model_parallel_size: 2\n      moe_token_dispatcher_type: alltoall\n");
}

// FSDP beside expert parallel: the dense tensors sharded over dp, the experts over edp (one rank
// here, so whole), each block gathered and reduced in two parts over two NCCL groups.
TEST(GpuParallelTraining, ExpertParallelWithFsdp) {
  expect_gpu_matches_reference("      num_layers: 2\n      num_experts: 4\n      moe_ffn_hidden_size: 128\n"
                               "      moe_router_topk: 2\n      moe_aux_loss_coeff: 0.01\n"
                               "      expert_model_parallel_size: 2\n      use_torch_fsdp2: true\n");
}

// The experts split over tp (expert_tensor_parallel_size = tp, the default) with sequence
// parallelism: the rows all-gathered over the NCCL tp group, the experts' partial outputs
// reduce-scattered, the routing weights' and shared gate's gradients all-reduced in fp64.
TEST(GpuParallelTraining, ExpertsSplitOverTensorParallel) {
  expect_gpu_matches_reference("      num_layers: 2\n      num_experts: 4\n      moe_ffn_hidden_size: 128\n"
                               "      moe_router_topk: 2\n      moe_aux_loss_coeff: 0.01\n"
                               "      moe_shared_expert_intermediate_size: 128\n      moe_shared_expert_gate: true\n"
                               "      tensor_model_parallel_size: 2\n      sequence_parallel: true\n");
}

// ZeRO-1 beside expert parallel: the dense AdamW state sharded over dp, the experts' over edp by
// their own distributed optimizer, its packed buffers on the GPU and reduced over NCCL.
TEST(GpuParallelTraining, ExpertParallelWithTheDistributedOptimizer) {
  expect_gpu_matches_reference("      num_layers: 2\n      num_experts: 4\n      moe_ffn_hidden_size: 128\n"
                               "      moe_router_topk: 2\n      moe_aux_loss_coeff: 0.01\n"
                               "      expert_model_parallel_size: 2\n      use_distributed_optimizer: true\n"
                               "      ddp_bucket_size: 20000\n");
}

TEST(GpuParallelTraining, ExpertParallelAllGather) {
  expect_gpu_matches_reference("      num_layers: 2\n      num_experts: 4\n      moe_ffn_hidden_size: 128\n"
                               "      moe_router_topk: 2\n      moe_aux_loss_coeff: 0.01\n"
                               "      expert_model_parallel_size: 2\n      moe_token_dispatcher_type: allgather\n");
}

}  // namespace
}  // namespace primus
