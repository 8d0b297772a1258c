#!/usr/bin/env python3
"""PyTorch peer of `primus-cli direct -- benchmark attention` on the GPU:
torch.nn.functional.scaled_dot_product_attention in bf16, forward and forward+backward.

    python3 benchmarks/cuda/attention_peer.py --seq 8192 --heads 32 --kv-heads 8 --head-dim 128 [--batch 1]
        [--no-causal] [--backend auto|flash|efficient|cudnn|math] [--warmup 3] [--iters 10] [--json]

Same inputs as ours: one fused qkv row per token, [batch, seq, (heads + 2*kv_heads) * head_dim],
split and viewed as [batch, heads, seq, head_dim] (the transposed views a model hands to SDPA);
grouped-query attention through enable_gqa=True (key/value heads shared by heads/kv_heads query
heads, as ours; falls back to repeat_interleave on a PyTorch without it). Timing: CUDA events,
the mean of --iters runs after --warmup. The forward runs with autograd on, as in training; the
backward alone is (forward+backward) - forward; the gradients are taken with torch.autograd.grad,
so nothing accumulates between runs.
FLOPs as ours count them: forward 4*b*h*s*s*d, halved when causal; backward 2.5x the forward.
"""

import argparse
import contextlib
import json
import sys

import torch
import torch.nn.functional as F
from cuda_timing import cuda_time_ms


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=0, help="default: --heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", dest="causal", action="store_true", default=True)
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--backend", choices=["auto", "flash", "efficient", "cudnn", "math"], default="auto")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    G = a.kv_heads or a.heads
    B, S, H, D = a.batch, a.seq, a.heads, a.head_dim
    if min(B, S, H, D, G) <= 0:
        sys.exit("error: --batch, --seq, --heads, --kv-heads and --head-dim must be positive")
    if H % G:
        sys.exit(f"error: --heads {H} is not a multiple of --kv-heads {G}")
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device for PyTorch")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1234)
    qkv = (torch.rand(B, S, (H + 2 * G) * D, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    qkv.requires_grad_(True)
    dout = (torch.rand(B, H, S, D, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)

    def backend_ctx():  # a fresh context each time: sdpa_kernel's is single-use
        if a.backend == "auto":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        chosen = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                  "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[a.backend]
        return sdpa_kernel([chosen])

    gqa, repeat = ({"enable_gqa": True} if G != H else {}), False
    if G != H:
        try:
            z = torch.zeros(1, 1, 1, 8, device=dev, dtype=torch.bfloat16)
            F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 8, device=dev, dtype=torch.bfloat16), z, z,
                                           enable_gqa=True)
        except TypeError:  # a PyTorch without enable_gqa
            gqa, repeat = {}, True

    def forward():
        q, k, v = qkv.split([H * D, G * D, G * D], dim=-1)
        q = q.view(B, S, H, D).transpose(1, 2)
        k = k.view(B, S, G, D).transpose(1, 2)
        v = v.view(B, S, G, D).transpose(1, 2)
        if repeat:
            k = k.repeat_interleave(H // G, dim=1)
            v = v.repeat_interleave(H // G, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, **gqa)

    def fwd_bwd():
        out = forward()
        torch.autograd.grad(out, (qkv,), dout)

    with backend_ctx():
        fwd_ms = cuda_time_ms(forward, a.warmup, a.iters)
        both_ms = cuda_time_ms(fwd_bwd, a.warmup, a.iters)
    bwd_ms = max(both_ms - fwd_ms, 0.0)
    fwd = 4.0 * B * H * S * S * D * (0.5 if a.causal else 1.0)
    bwd = 2.5 * fwd

    def tf(flops, ms):
        return flops / (ms * 1e9) if ms > 0 else 0.0

    name = torch.cuda.get_device_name(dev)
    impl = f"torch {torch.__version__} sdpa ({a.backend}{', enable_gqa' if gqa else ''}{', repeat_interleave' if repeat else ''})"
    if a.json:
        print(json.dumps({"op": "attention", "impl": impl, "device": "cuda", "device_name": name, "dtype": "bf16",
                          "batch": B, "seq": S, "heads": H, "kv_heads": G, "head_dim": D, "causal": a.causal,
                          "fwd_ms": fwd_ms, "fwd_tflops": tf(fwd, fwd_ms), "bwd_ms": bwd_ms,
                          "bwd_tflops": tf(bwd, bwd_ms), "fwdbwd_ms": both_ms,
                          "fwdbwd_tflops": tf(fwd + bwd, both_ms)}))
        return
    print(f"attention bf16 {'causal' if a.causal else 'full'} batch {B} seq {S} heads {H} kv-heads {G} head-dim {D} "
          f"on cuda ({name})   [{impl}]")
    print(f"  forward           {fwd_ms:>10.4f} ms {tf(fwd, fwd_ms):>10.4g} TFLOP/s")
    print(f"  backward          {bwd_ms:>10.4f} ms {tf(bwd, bwd_ms):>10.4g} TFLOP/s")
    print(f"  forward+backward  {both_ms:>10.4f} ms {tf(fwd + bwd, both_ms):>10.4g} TFLOP/s")


if __name__ == "__main__":
    main()
