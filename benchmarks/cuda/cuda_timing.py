"""Timing shared by the PyTorch peers: the mean of `iters` runs after `warmup` untimed ones, timed
with CUDA events on the current stream, as ours (cuda::time_ms) times its kernels."""

import torch


def cuda_time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters
