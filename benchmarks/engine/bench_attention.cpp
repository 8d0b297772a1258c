// CPU attention kernels alone: forward and backward time and GFLOP/s (causal FLOPs: 4*b*h*s*s/2*d
// forward, 2.5x that backward) on the benchmark models' shapes and a long GQA one. Best of 5.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/attention.h"

using namespace primus;
using namespace primus::cpu;
using Clock = std::chrono::steady_clock;

int main() {
  const AttentionShape shapes[] = {{8, 256, 6, 6, 48}, {4, 512, 12, 12, 64}, {2, 1024, 8, 2, 128}};
  for (const auto& s : shapes) {
    std::vector<float> qkv(s.batch * s.seq * s.qkv_stride()), out(s.batch * s.seq * s.heads * s.head_dim),
        lse(s.batch * s.heads * s.seq), dout(out.size()), dqkv(qkv.size());
    Rng rng(1);
    for (auto& x : qkv) x = float(rng.normal());
    for (auto& x : dout) x = float(rng.normal());
    attention_forward(qkv.data(), out.data(), lse.data(), s);  // warm-up
    double tf = 1e9, tb = 1e9;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = Clock::now();
      attention_forward(qkv.data(), out.data(), lse.data(), s);
      const auto t1 = Clock::now();
      attention_backward(qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data(), s);
      const auto t2 = Clock::now();
      tf = std::min(tf, std::chrono::duration<double>(t1 - t0).count());
      tb = std::min(tb, std::chrono::duration<double>(t2 - t1).count());
    }
    const double flops = 4.0 * s.batch * s.heads * s.seq * s.seq / 2 * s.head_dim;
    std::printf("batch %ld seq %ld heads %ld groups %ld dim %ld: forward %.2f ms (%.1f GFLOP/s), backward %.2f ms (%.1f GFLOP/s)\n",
                s.batch, s.seq, s.heads, s.groups, s.head_dim, tf * 1e3, flops / tf / 1e9, tb * 1e3,
                2.5 * flops / tb / 1e9);
  }
  return 0;
}
