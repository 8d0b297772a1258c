#include "trace/clock.h"

#include <chrono>

#include "core/error.h"

namespace primus::trace {

double host_now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Mark Clock::host() {
  host_us_.push_back(host_now_us());
  return Mark(host_us_.size() - 1);
}

namespace {
class HostClock final : public Clock {
 public:
  std::string name() const override { return "host steady clock"; }
};
}  // namespace

std::unique_ptr<Clock> host_clock() { return std::make_unique<HostClock>(); }

}  // namespace primus::trace

#ifndef PRIMUS_HAVE_CUDA
namespace primus::trace {
std::unique_ptr<Clock> cuda_clock() { fail("GPU traces need the CUDA backend, which this build lacks"); }
void* comm_stream_of(parallel::ProcessGroup&) { return nullptr; }
}  // namespace primus::trace
#endif
