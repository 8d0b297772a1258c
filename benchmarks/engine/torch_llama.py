#!/usr/bin/python3
"""PyTorch peer of the engine benchmark: the same Llama and the same training step, on CPU.

The architecture follows src/model and docs/model_math.md exactly: token embedding; per layer
RMSNorm, fused QKV projection (optional bias), rotary embedding (rotary_base, optional Llama 3.1
frequency scaling), causal grouped-query attention, output projection, RMSNorm, SwiGLU MLP with
fused gate+up; final RMSNorm; output layer tied to the embedding or not; cross-entropy.
The step is forward, backward, global-norm clipping and torch.optim.AdamW, as the engine's.

Debian's python3-torch is 1.13, without scaled_dot_product_attention, so attention is written out
(scores, causal mask, softmax, weighted sum). Run it with /usr/bin/python3:

    /usr/bin/python3 benchmarks/engine/torch_llama.py --model llama2c_15M \
        --micro-batch-size 8 --seq-length 256 --iters 10 --warmup 2 --threads 2 [--precision bf16]

--precision bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), the
fastest CPU training path PyTorch has (oneDNN bf16 GEMMs; AMX where the CPU has it); weights,
gradients and AdamW stay fp32, as in the engine's bf16 mixed precision.

It prints one JSON line: tokens_per_sec, step_time_s, loss_first, loss_last (and a few more).
The data is one batch of random tokens from a fixed seed, trained on every step, so the loss
falls as the model memorises it: a check that the step really trains. Denormals are flushed
to zero by default (--flush-denormal 0 turns it off): AdamW's second moment of tiny gradients
becomes denormal and would slow every elementwise op several times over. OPENBLAS_NUM_THREADS
and OMP_NUM_THREADS default to --threads.
"""

import argparse
import json
import math
import os
import re
import sys
import time


def _early_threads():
    # OpenBLAS reads its thread count when it loads, i.e. at `import torch`: match --threads.
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "2"


os.environ.setdefault("OPENBLAS_NUM_THREADS", _early_threads())
os.environ.setdefault("OMP_NUM_THREADS", _early_threads())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# ModelSpec fields (Megatron names) and their defaults, as in src/model/model_spec.h.
SPEC_DEFAULTS = {
    "num_layers": 0,
    "hidden_size": 0,
    "ffn_hidden_size": 0,
    "num_attention_heads": 0,
    "num_query_groups": 0,
    "kv_channels": 0,
    "vocab_size": 0,
    "max_position_embeddings": 0,
    "norm_epsilon": 1e-5,
    "rotary_base": 10000.0,
    "untie_embeddings_and_output_weights": True,
    "add_qkv_bias": False,
    "qk_layernorm": False,
    "init_method_std": 0.02,
    "use_rope_scaling": False,
    "rope_scaling_factor": 8.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_max_position_embeddings": 8192,
    # Mixture of experts (docs/moe.md): the peer runs Mixtral-style routing (softmax over the
    # chosen logits, aux loss, z-loss, shared experts), experts looped in PyTorch.
    "num_experts": None,
    "moe_ffn_hidden_size": None,
    "moe_router_topk": 2,
    "moe_layer_freq": 1,
    "moe_shared_expert_intermediate_size": None,
    "moe_router_score_function": "softmax",
    "moe_router_load_balancing_type": "aux_loss",
    "moe_aux_loss_coeff": 0.0,
    "moe_z_loss_coeff": None,
    "moe_token_dispatcher_type": "allgather",
}
# MoE keys the peer accepts but that only change routing details, not the work per token.
MOE_IGNORED = {"moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_router_num_groups",
               "moe_router_group_topk", "moe_router_topk_scaling_factor", "moe_router_pre_softmax"}


def moe_layers(s):
    """Which layers are MoE: moe_layer_freq as an int, a 0/1 list or "([0]*1+[1]*3)"."""
    if not s["num_experts"]:
        return [False] * s["num_layers"]
    f = s["moe_layer_freq"]
    if isinstance(f, int):
        return [l % f == 0 for l in range(s["num_layers"])]
    if isinstance(f, str):
        out = []
        for body, times in re.findall(r"\[([0-9,\s]*)\]\s*(?:\*\s*([0-9]+))?", f):
            out += [int(x) for x in body.split(",") if x.strip()] * int(times or 1)
        f = out
    if len(f) != s["num_layers"]:
        sys.exit(f"error: moe_layer_freq lists {len(f)} layers, num_layers is {s['num_layers']}")
    return [bool(x) for x in f]


def preset_dir():
    env = os.environ.get("PRIMUS_CONFIG_DIR")
    if env:
        return os.path.join(env, "models")
    return os.path.normpath(os.path.join(HERE, "..", "..", "configs", "models"))


def load_spec(name_or_path, chain=()):
    """Reads a preset (by name or path) with its `extends:` chain; child keys override."""
    import yaml  # python3-yaml; only needed when a preset is read

    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = name_or_path
    else:
        path = os.path.join(preset_dir(), name_or_path + ".yaml")
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        sys.exit(f"error: model spec '{name_or_path}' not found ({path})")
    if path in chain:
        sys.exit(f"error: 'extends' cycle: {' -> '.join(chain + (path,))}")
    with open(path) as f:
        node = yaml.safe_load(f) or {}
    if not isinstance(node, dict):
        sys.exit(f"error: {path}: a model spec must be a map")
    spec = dict(SPEC_DEFAULTS)
    parent = node.get("extends")
    if parent:
        if parent.endswith((".yaml", ".yml")) or "/" in parent:
            parent = os.path.join(os.path.dirname(path), parent)
        spec = load_spec(parent, chain + (path,))
    for k, v in node.items():
        if k in ("extends", "description"):
            continue
        if k in MOE_IGNORED:
            continue
        if k not in SPEC_DEFAULTS:
            sys.exit(f"error: {path}: unknown key '{k}'")
        spec[k] = v
    return spec


def check_spec(s):
    for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size"):
        if s[k] <= 0:
            sys.exit(f"error: {k} must be positive, got {s[k]}")
    if not s["num_query_groups"]:
        s["num_query_groups"] = s["num_attention_heads"]
    if not s["kv_channels"]:
        if s["hidden_size"] % s["num_attention_heads"]:
            sys.exit("error: hidden_size must be divisible by num_attention_heads")
        s["kv_channels"] = s["hidden_size"] // s["num_attention_heads"]
    if s["num_attention_heads"] % s["num_query_groups"]:
        sys.exit("error: num_attention_heads must be divisible by num_query_groups")
    return s


def rope_inv_freq(s):
    d = s["kv_channels"]
    inv = 1.0 / (s["rotary_base"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if s["use_rope_scaling"]:
        # Llama 3.1: keep high frequencies, divide low ones by the factor, blend in between.
        factor, lo, hi = s["rope_scaling_factor"], s["rope_low_freq_factor"], s["rope_high_freq_factor"]
        old = s["rope_original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


class Llama(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s
        h, f, v = s["hidden_size"], s["ffn_hidden_size"], s["vocab_size"]
        self.nh, self.ng, self.d = s["num_attention_heads"], s["num_query_groups"], s["kv_channels"]
        q, kv = self.nh * self.d, self.ng * self.d
        std = s["init_method_std"]
        P = torch.nn.Parameter
        self.embedding = P(torch.randn(v, h) * std)
        self.layers = torch.nn.ModuleList()
        self.moe = moe_layers(s)
        for l in range(s["num_layers"]):
            layer = torch.nn.Module()
            layer.input_norm = P(torch.ones(h))
            layer.qkv = P(torch.randn(q + 2 * kv, h) * std)
            layer.qkv_bias = P(torch.zeros(q + 2 * kv)) if s["add_qkv_bias"] else None
            # Qwen3: one head_dim RMSNorm weight for all q heads, one for all k heads.
            layer.q_norm = P(torch.ones(self.d)) if s["qk_layernorm"] else None
            layer.k_norm = P(torch.ones(self.d)) if s["qk_layernorm"] else None
            layer.proj = P(torch.randn(h, q) * std)
            layer.mlp_norm = P(torch.ones(h))
            if self.moe[l]:
                E, fe = s["num_experts"], s["moe_ffn_hidden_size"] or f
                layer.router = P(torch.randn(E, h) * std)
                layer.experts_fc1 = torch.nn.ParameterList([P(torch.randn(2 * fe, h) * std) for _ in range(E)])
                layer.experts_fc2 = torch.nn.ParameterList([P(torch.randn(h, fe) * std) for _ in range(E)])
                fs = s["moe_shared_expert_intermediate_size"]
                layer.shared_fc1 = P(torch.randn(2 * fs, h) * std) if fs else None
                layer.shared_fc2 = P(torch.randn(h, fs) * std) if fs else None
            else:
                layer.fc1 = P(torch.randn(2 * f, h) * std)  # gate rows, then up rows
                layer.fc2 = P(torch.randn(h, f) * std)
            self.layers.append(layer)
        self.aux_loss = torch.zeros(())
        self.final_norm = P(torch.ones(h))
        self.output = P(torch.randn(v, h) * std) if s["untie_embeddings_and_output_weights"] else None
        self.inv_freq = rope_inv_freq(s)

    @staticmethod
    def swiglu(x, fc1, fc2):
        gate, up = F.linear(x, fc1).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, fc2)

    def moe_block(self, L, x):
        """Top-k routing, experts looped over their tokens; returns the output and router losses."""
        s = self.s
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        N, E, k = x.shape[0], s["num_experts"], s["moe_router_topk"]
        logits = F.linear(x, L.router).float()
        if s["moe_router_score_function"] == "sigmoid":
            scores = torch.sigmoid(logits)
            top, idx = scores.topk(k, dim=-1)
            w = top / (top.sum(-1, keepdim=True) + 1e-20) if k > 1 else top
            probs = scores / (scores.sum(-1, keepdim=True) + 1e-20)
        else:
            top, idx = logits.topk(k, dim=-1)
            w = torch.softmax(top, dim=-1)
            probs = torch.softmax(logits, dim=-1)
        out = torch.zeros_like(x)
        for e in range(E):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                y = self.swiglu(x[rows], L.experts_fc1[e], L.experts_fc2[e])
                out = out.index_add(0, rows, (y * w[rows, slot].unsqueeze(-1)).to(out.dtype))
        if L.shared_fc1 is not None:
            out = out + self.swiglu(x, L.shared_fc1, L.shared_fc2).to(out.dtype)
        loss = torch.zeros((), dtype=torch.float32)
        if s["moe_aux_loss_coeff"] and s["moe_router_load_balancing_type"] != "none":
            counts = torch.bincount(idx.reshape(-1), minlength=E).float()
            loss = loss + s["moe_aux_loss_coeff"] * E / (N * N * k) * (probs.sum(0) * counts).sum()
        if s["moe_z_loss_coeff"]:
            loss = loss + s["moe_z_loss_coeff"] * torch.logsumexp(logits, dim=-1).pow(2).mean()
        return out.reshape(shape), loss

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.s["norm_epsilon"]) * w

    def rope_tables(self, T):
        t = torch.arange(T, dtype=torch.float64)
        ang = torch.outer(t, self.inv_freq)  # [T, d/2]
        return torch.cos(ang).float(), torch.sin(ang).float()

    @staticmethod
    def rope(x, cos, sin):
        # Rotate-half convention (Megatron, Hugging Face): pairs (i, i + d/2).
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self, tokens):
        B, T = tokens.shape
        nh, ng, d = self.nh, self.ng, self.d
        cos, sin = self.rope_tables(T)
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = F.embedding(tokens, self.embedding)
        self.aux_loss = torch.zeros(())
        for l, L in enumerate(self.layers):
            a = F.linear(self.rmsnorm(x, L.input_norm), L.qkv, L.qkv_bias)
            q, k, v = a.split((nh * d, ng * d, ng * d), dim=-1)
            q, k = q.view(B, T, nh, d), k.view(B, T, ng, d)
            if L.q_norm is not None:  # per head, before the rotation
                q, k = self.rmsnorm(q, L.q_norm), self.rmsnorm(k, L.k_norm)
            q = self.rope(q.transpose(1, 2), cos, sin)  # [B, nh, T, d]
            k = self.rope(k.transpose(1, 2), cos, sin)  # [B, ng, T, d]
            v = v.view(B, T, ng, d).transpose(1, 2)
            if ng != nh:  # each query group serves nh / ng heads
                k = k.repeat_interleave(nh // ng, dim=1)
                v = v.repeat_interleave(nh // ng, dim=1)
            scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d)) + mask
            o = torch.matmul(torch.softmax(scores, dim=-1), v)
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, nh * d), L.proj)
            if self.moe[l]:
                y, aux = self.moe_block(L, self.rmsnorm(x, L.mlp_norm))
                x = x + y
                self.aux_loss = self.aux_loss + aux
                continue
            x = x + self.swiglu(self.rmsnorm(x, L.mlp_norm), L.fc1, L.fc2)
        x = self.rmsnorm(x, self.final_norm)
        return F.linear(x, self.output if self.output is not None else self.embedding)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama2c_15M", help="preset name or YAML path")
    for k, v in SPEC_DEFAULTS.items():  # explicit flags override the preset
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            ap.add_argument(flag, type=lambda x: x.lower() in ("1", "true", "yes"), default=None)
        else:
            ap.add_argument(flag, type=type(v), default=None)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--seq-length", type=int, default=256)
    ap.add_argument("--iters", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16), "
                         "PyTorch's fastest CPU training path (fp32 weights, gradients and AdamW)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--adam-beta1", type=float, default=0.9)
    ap.add_argument("--adam-beta2", type=float, default=0.95)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--clip-grad", type=float, default=1.0, help="0 turns clipping off")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--flush-denormal", type=int, default=1,
                    help="1: flush denormals to zero (AdamW's second moment of tiny gradients goes "
                         "denormal and slows every elementwise op several times); 0: IEEE default")
    args = ap.parse_args()

    spec = load_spec(args.model) if args.model else dict(SPEC_DEFAULTS)
    for k in SPEC_DEFAULTS:
        if getattr(args, k) is not None:
            spec[k] = getattr(args, k)
    spec = check_spec(spec)
    if spec["max_position_embeddings"] and args.seq_length > spec["max_position_embeddings"]:
        sys.exit(f"error: --seq-length {args.seq_length} exceeds max_position_embeddings "
                 f"{spec['max_position_embeddings']}")
    if args.iters < 1 or args.warmup < 0 or args.micro_batch_size < 1 or args.threads < 1:
        sys.exit("error: --iters, --micro-batch-size and --threads must be positive, --warmup >= 0")

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(bool(args.flush_denormal))
    torch.manual_seed(args.seed)
    model = Llama(spec)
    # Megatron's grouping: no weight decay on biases and norm weights (1-D tensors).
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps)

    g = torch.Generator().manual_seed(args.seed)
    data = torch.randint(0, spec["vocab_size"], (args.micro_batch_size, args.seq_length + 1), generator=g)
    inputs, targets = data[:, :-1], data[:, 1:]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(inputs)
            loss = F.cross_entropy(logits.view(-1, spec["vocab_size"]), targets.reshape(-1))
        (loss + model.aux_loss).backward()  # the router losses of MoE layers (0 for a dense model)
        if args.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        opt.step()
        return loss.item()

    losses = [step() for _ in range(args.warmup)]
    t0 = time.perf_counter()
    for _ in range(args.iters):
        losses.append(step())
    elapsed = time.perf_counter() - t0

    tokens = args.micro_batch_size * args.seq_length * args.iters
    print(json.dumps({
        "tokens_per_sec": tokens / elapsed,
        "step_time_s": elapsed / args.iters,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "parameters": sum(p.numel() for p in model.parameters()),
        "micro_batch_size": args.micro_batch_size,
        "seq_length": args.seq_length,
        "iters": args.iters,
        "threads": args.threads,
        "precision": args.precision,
        "flush_denormal": bool(args.flush_denormal),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
