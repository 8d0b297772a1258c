#include "safe/early_exit.h"

#include <signal.h>

#include <atomic>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "parallel/process_group.h"

namespace primus::safe {
namespace {

std::atomic<int> g_signal{0};
struct sigaction g_previous {};
void on_exit_signal(int sig) { g_signal = sig; }

}  // namespace

EarlyExit::EarlyExit(bool signal_handler, double duration_minutes)
    : signal_handler_(signal_handler), minutes_(duration_minutes), start_(std::chrono::steady_clock::now()) {
  if (minutes_ < 0) fail("exit_duration_in_mins must not be negative, got {}", minutes_);
  if (signal_handler_) {
    g_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_exit_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, &g_previous);
  }
}

EarlyExit::~EarlyExit() {
  if (signal_handler_) ::sigaction(SIGTERM, &g_previous, nullptr);
}

bool EarlyExit::due(parallel::ProcessGroup& world) {
  if (!signal_handler_ && minutes_ <= 0) return false;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() / 60;
  // A signal on any rank, or any rank past the time (one all-reduce of both flags).
  std::vector<int32_t> flags{signal_handler_ && g_signal != 0, minutes_ > 0 && minutes > minutes_};
  world.all_reduce(flags, parallel::ReduceOp::Max);
  const bool signal_any = flags[0] != 0, time_any = flags[1] != 0;
  if (signal_any)
    reason_ = "received SIGTERM";
  else if (time_any)
    reason_ = fmt::format("{:.2f} minutes passed (exit_duration_in_mins {})", minutes, minutes_);
  return signal_any || time_any;
}

}  // namespace primus::safe
