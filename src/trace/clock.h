// Where a trace's times come from. A Mark is a point in time taken now and read later: on the host
// the steady clock (the same on every process of a machine), on a GPU a CUDA event recorded on a
// stream, resolved into the host's clock once the window's work is done (resolve()). Reading an
// event's time while the window runs would make the host wait for the GPU; marks avoid that.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace primus::parallel {
class ProcessGroup;
}

namespace primus::trace {

using Mark = uint32_t;

// Microseconds of the host's steady clock.
double host_now_us();

class Clock {
 public:
  virtual ~Clock() = default;
  virtual std::string name() const = 0;  // "host steady clock", "CUDA events"
  // Now, on the host.
  Mark host();
  // When the work queued so far on `stream` is done (nullptr: the compute stream). On the host
  // clock, now.
  virtual Mark device(void* stream) { return host(); }
  // At the window's start, after the ranks' barrier: the device clock's reference point.
  virtual void start_window() {}
  // Microseconds of every mark taken since the last clear(), in the host's clock. Waits for the
  // device when there are device marks.
  virtual std::vector<double> resolve() { return host_us_; }
  virtual void clear() { host_us_.clear(); }

 protected:
  std::vector<double> host_us_;  // per mark; device marks hold their event's index until resolved
};

// Every mark on the host: the CPU backends run each op on the calling thread.
std::unique_ptr<Clock> host_clock();
// CUDA events on the compute stream and the communication streams (clock_cuda.cpp; built with
// the CUDA backend, else it throws primus::Error).
std::unique_ptr<Clock> cuda_clock();
// The communication stream of a GPU process group (NcclProcessGroup), nullptr for others.
void* comm_stream_of(parallel::ProcessGroup& group);

}  // namespace primus::trace
