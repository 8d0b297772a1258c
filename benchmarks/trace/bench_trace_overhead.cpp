// What the profiler adds to one op of the op set: a small op (add of two 16-element rows) called
// many times on the CPU backend directly, through the profiler's decorator outside its window
// (profiling on, not recording: one branch), and inside it (recording: two clock reads and an
// event). Rounds of the three alternate; the medians and the differences per call are printed.
// docs/profiling.md multiplies the difference by the ops of a step.
//
//   build/benchmarks/trace/bench_trace_overhead [calls per round (200000)] [rounds (7)]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "parallel/self_process_group.h"
#include "trace/profiler.h"

using namespace primus;

int main(int argc, char** argv) {
  const int64_t calls = argc > 1 ? std::atoll(argv[1]) : 200000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  const auto dir = std::filesystem::temp_directory_path() / ("primus_trace_overhead_" + std::to_string(::getpid()));
  parallel::SelfProcessGroup world;
  ops::Backend& plain = cpu::cpu_backend();
  Tensor a = Tensor::zeros({1, 16}), b = Tensor::zeros({1, 16});
  auto per_call_ns = [&](ops::Backend& be) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) be.add(a, b, a);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / double(calls);
  };
  std::vector<double> off, outside, inside;
  for (int r = 0; r < rounds; ++r) {
    off.push_back(per_call_ns(plain));
    // A window of step 2 only: step 1 is outside it, step 2 records.
    trace::Profiler p({true, 1, 2, {0}, 2}, world, dir, trace::host_clock());
    ops::Backend& traced = p.wrap(plain);
    p.step_begin(1);
    outside.push_back(per_call_ns(traced));
    p.step_end(1);
    p.step_begin(2);
    inside.push_back(per_call_ns(traced));
    p.step_end(2);  // writes the trace (not timed)
  }
  std::filesystem::remove_all(dir);
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double o = med(off), w = med(outside), i = med(inside);
  std::printf("add of 16 floats, %lld calls x %d rounds, medians per call:\n", (long long)calls, rounds);
  std::printf("  profiling off (the backend itself)       %8.1f ns\n", o);
  std::printf("  profiling on, outside the window         %8.1f ns  (+%.1f ns)\n", w, w - o);
  std::printf("  profiling on, inside the window (traced) %8.1f ns  (+%.1f ns)\n", i, i - o);
  return 0;
}
