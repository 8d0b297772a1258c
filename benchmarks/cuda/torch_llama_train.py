#!/usr/bin/env python3
"""PyTorch peer of the GPU training benchmark: the same Llama, step and precision on one GPU.

The model is benchmarks/engine/torch_llama.py's architecture (src/model's Llama: fused QKV,
rotate-half RoPE with Llama 3 scaling, GQA, SwiGLU with fused gate+up, RMSNorm, tied or untied
output layer), written for a GPU as a PyTorch user would: fp32 parameters under
torch.autocast(bfloat16) (bf16 GEMMs and attention, fp32 master weights, gradients and
optimizer state, as Primus's bf16 mode), F.scaled_dot_product_attention (causal, GQA), fused
AdamW, global-norm clipping. --compile wraps the model in torch.compile.

    python3 benchmarks/cuda/torch_llama_train.py --model llama3.2_1B --seq-length 4096 \\
        --micro-batch-size 2 --iters 10 --warmup 3 [--compile]

It prints one JSON line: tokens_per_sec, step_time_s, tflops, mfu (against --peak-tflops, the
data-sheet dense bf16 peak: 989.4 for H100 SXM and H200), peak_memory_gb, losses. FLOPs per token
are counted as primus counts them (src/model/model_spec.cpp): 6 per weight per token plus causal
attention's 6 * seq * q_size per layer.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
os.environ.setdefault("OMP_NUM_THREADS", "8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_llama  # noqa: E402  (benchmarks/engine: the model, presets and spec checks)


class GpuLlama(torch_llama.Llama):
    """The CPU peer's model and parameters; norms in fp32 and SDPA attention for bf16 on a GPU."""

    def rmsnorm(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.s["norm_epsilon"])).to(x.dtype) * w.to(x.dtype)

    def forward(self, tokens):
        B, T = tokens.shape
        nh, ng, d = self.nh, self.ng, self.d
        inv_freq = self.inv_freq.to(device=tokens.device, dtype=torch.float32)
        ang = torch.outer(torch.arange(T, device=tokens.device, dtype=torch.float32), inv_freq)
        cos, sin = torch.cos(ang).to(torch.bfloat16), torch.sin(ang).to(torch.bfloat16)
        x = F.embedding(tokens, self.embedding).to(torch.bfloat16)
        for L in self.layers:
            a = F.linear(self.rmsnorm(x, L.input_norm), L.qkv, L.qkv_bias)
            q, k, v = a.split((nh * d, ng * d, ng * d), dim=-1)
            q = self.rope(q.view(B, T, nh, d).transpose(1, 2), cos, sin)
            k = self.rope(k.view(B, T, ng, d).transpose(1, 2), cos, sin)
            v = v.view(B, T, ng, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(ng != nh))
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, nh * d), L.proj)
            gate, up = F.linear(self.rmsnorm(x, L.mlp_norm), L.fc1).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, L.fc2)
        x = self.rmsnorm(x, self.final_norm)
        return F.linear(x, self.output if self.output is not None else self.embedding)


def flops_per_token(s, seq):
    h, f, v = s["hidden_size"], s["ffn_hidden_size"], s["vocab_size"]
    q, kv = s["num_attention_heads"] * s["kv_channels"], s["num_query_groups"] * s["kv_channels"]
    layer = 2 * h + (q + 2 * kv) * h + (q + 2 * kv if s["add_qkv_bias"] else 0) + h * q + 3 * h * f
    return s["num_layers"] * (6.0 * layer + 6.0 * seq * q) + 6.0 * h + 6.0 * v * h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama3.2_1B", help="preset name or YAML path")
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--seq-length", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak of the GPU")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device")
    spec = torch_llama.check_spec(torch_llama.load_spec(args.model))
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    model = GpuLlama(spec).to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if args.compile else model
    g = torch.Generator(device=dev).manual_seed(args.seed)
    data = torch.randint(0, spec["vocab_size"], (args.micro_batch_size, args.seq_length + 1), generator=g, device=dev)
    inputs, targets = data[:, :-1], data[:, 1:]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(inputs)
        loss = F.cross_entropy(logits.float().view(-1, spec["vocab_size"]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    losses = [step().item() for _ in range(args.warmup)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = [step() for _ in range(args.iters)]
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    losses += [x.item() for x in out]
    tokens = args.micro_batch_size * args.seq_length * args.iters
    tps = tokens / elapsed
    tflops = flops_per_token(spec, args.seq_length) * tps / 1e12
    print(json.dumps({
        "peer": "torch.compile" if args.compile else "torch eager",
        "tokens_per_sec": tps, "step_time_s": elapsed / args.iters, "tflops": tflops,
        "mfu": tflops / args.peak_tflops, "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
        "loss_first": losses[0], "loss_last": losses[-1], "model": args.model,
        "micro_batch_size": args.micro_batch_size, "seq_length": args.seq_length,
        "parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }))


if __name__ == "__main__":
    main()
