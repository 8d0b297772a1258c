#!/usr/bin/env python3
"""PyTorch peer of `primus-cli direct -- benchmark gemm` on the GPU: torch.mm at the same shape.

    python3 benchmarks/cuda/gemm_peer.py -M 8192 -N 6144 -K 4096 --trans-b [--dtype bf16] [--json]

Same problem and conventions as ours: row-major D[M, N] = op(A) op(B), op(A) = A^T when
--trans-a (A stored [K, M]), op(B) = B^T when --trans-b (B stored [N, K], a linear layer's
weight); inputs uniform in [-1, 1); bf16 in and out (or fp32 without TF32, as our
CUBLAS_COMPUTE_32F); the mean of --iters runs after --warmup, timed with CUDA events;
TFLOP/s = 2*M*N*K / time. The output is preallocated (out=), as our benchmark writes into one D.
Prints the line ours prints, or with --json one JSON object with the same keys.
"""

import argparse
import json
import sys

import torch
from cuda_timing import cuda_time_ms


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-M", type=int, default=4096)
    p.add_argument("-N", type=int, default=4096)
    p.add_argument("-K", type=int, default=4096)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--trans-a", action="store_true")
    p.add_argument("--trans-b", action="store_true")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    for name in ("M", "N", "K"):
        if getattr(a, name) <= 0:
            sys.exit(f"error: -{name} must be positive, got {getattr(a, name)}")
    if a.iters < 1 or a.warmup < 0:
        sys.exit("error: --iters must be >= 1 and --warmup >= 0")
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device for PyTorch")

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as CUBLAS_COMPUTE_32F
    dev = torch.device("cuda")
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(1234)

    def uniform(*shape):
        return (torch.rand(*shape, device=dev, generator=gen) * 2 - 1).to(dt)

    A = uniform(a.K, a.M) if a.trans_a else uniform(a.M, a.K)
    B = uniform(a.N, a.K) if a.trans_b else uniform(a.K, a.N)
    opA = A.t() if a.trans_a else A
    opB = B.t() if a.trans_b else B
    D = torch.empty(a.M, a.N, device=dev, dtype=dt)

    def fn():
        torch.mm(opA, opB, out=D)

    ms = cuda_time_ms(fn, a.warmup, a.iters)
    flops = 2.0 * a.M * a.N * a.K
    tflops = flops / (ms * 1e9) if ms > 0 else 0.0
    name = torch.cuda.get_device_name(dev)
    op = ("T" if a.trans_a else "N") + ("T" if a.trans_b else "N")
    if a.json:
        print(json.dumps({"op": "gemm", "impl": f"torch {torch.__version__} torch.mm", "device": "cuda",
                          "device_name": name, "dtype": a.dtype, "out_dtype": a.dtype, "trans_a": a.trans_a,
                          "trans_b": a.trans_b, "m": a.M, "n": a.N, "k": a.K, "ms": ms, "tflops": tflops}))
    else:
        print(f"gemm {a.dtype} {op} m={a.M} n={a.N} k={a.K} on cuda ({name}): {ms:.4f} ms, {tflops:.4g} TFLOP/s"
              f"   [torch {torch.__version__} torch.mm]")


if __name__ == "__main__":
    main()
