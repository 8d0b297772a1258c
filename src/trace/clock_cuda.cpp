// The CUDA clock: a mark is an event recorded on a stream, taken from a pool that lives as long as
// the clock. resolve() waits for the device and turns each event into host microseconds through
// the reference event recorded at the window's start, when the device was idle.
#include <cuda_runtime_api.h>

#include "core/error.h"
#include "kernels/cuda/runtime.h"
#include "parallel/nccl_process_group.h"
#include "trace/clock.h"

namespace primus::trace {
namespace {

class CudaClock final : public Clock {
 public:
  ~CudaClock() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    if (ref_) cudaEventDestroy(ref_);
  }
  std::string name() const override { return "CUDA events"; }

  Mark device(void* stream) override {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      PRIMUS_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    cudaEvent_t e = pool_[used_];
    PRIMUS_CUDA_CHECK(cudaEventRecord(e, stream ? static_cast<cudaStream_t>(stream) : cuda::stream()));
    host_us_.push_back(-1.0 - double(used_));  // an event's index until resolved
    ++used_;
    return Mark(host_us_.size() - 1);
  }

  void start_window() override {
    if (!ref_) PRIMUS_CUDA_CHECK(cudaEventCreate(&ref_));
    PRIMUS_CUDA_CHECK(cudaDeviceSynchronize());
    PRIMUS_CUDA_CHECK(cudaEventRecord(ref_, cuda::stream()));
    PRIMUS_CUDA_CHECK(cudaEventSynchronize(ref_));
    ref_us_ = host_now_us();
  }

  std::vector<double> resolve() override {
    PRIMUS_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> out = host_us_;
    for (double& t : out) {
      if (t >= 0) continue;
      float ms = 0;
      PRIMUS_CUDA_CHECK(cudaEventElapsedTime(&ms, ref_, pool_[size_t(-1.0 - t)]));
      t = ref_us_ + 1e3 * double(ms);
    }
    return out;
  }

  void clear() override {
    Clock::clear();
    used_ = 0;
  }

 private:
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  cudaEvent_t ref_ = nullptr;
  double ref_us_ = 0;
};

}  // namespace

std::unique_ptr<Clock> cuda_clock() { return std::make_unique<CudaClock>(); }

void* comm_stream_of(parallel::ProcessGroup& group) {
  if (auto* nccl = dynamic_cast<parallel::NcclProcessGroup*>(&group)) return nccl->comm_stream();
  return nullptr;
}

}  // namespace primus::trace
