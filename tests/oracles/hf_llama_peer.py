#!/usr/bin/python3
"""Hugging Face side of the checkpoint tests: reads and writes Hugging Face Llama / Mistral / Qwen2 / Qwen3
folders (config.json + safetensors, single or sharded) with its own small safetensors code (json and
struct only, independent of the C++ reader and writer) and runs them in the repository's PyTorch
peer model (benchmarks/engine/torch_llama.py).

    hf_llama_peer.py write OUT --model tiny [--dtype F32|BF16] [--max-shard-bytes N] [--seed S]
        random weights for the preset, written as a Hugging Face folder (LlamaForCausalLM, or
        Qwen2ForCausalLM when the preset has QKV biases, Qwen3ForCausalLM with qk_layernorm)
    hf_llama_peer.py write OUT --family mixtral|qwen2_moe|qwen3_moe|deepseek_v2|deepseek_v2_grouped|deepseek_v3|deepseek_v3_mtp|gpt_oss|llama4 [...]
        a tiny random model of that mixture-of-experts family in its Hugging Face layout
    hf_llama_peer.py logits DIR --tokens "1 2 3"
        one JSON line: the fp32 logits at every position ([positions][vocab]); of a Llama 4 folder in
        Meta's multimodal layout (Llama4ForConditionalGeneration), its text model's
    hf_llama_peer.py mtp-logits DIR --tokens "1 2 3"
        one JSON line: DeepSeek-V3's multi-token-prediction logits, per depth k the positions that have
        a token k + 1 ahead ([depths][positions][vocab]; hf_moe_peer.mtp_logits)

The MoE families run in hf_moe_peer.py, a forward written from the Hugging Face modeling code's
facts (modeling_mixtral, modeling_qwen2_moe, modeling_qwen3_moe, modeling_gpt_oss, modeling_llama4,
DeepSeek's modeling_deepseek), in
float64, on Hugging Face's tensor names.

Run it with /usr/bin/python3 (Debian's python3-torch).
"""

import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks", "engine"))

import torch  # noqa: E402
import torch_llama  # noqa: E402
import hf_moe_peer  # noqa: E402

DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "U8": (torch.uint8, 1)}


def hf_tensors(spec):
    """(our peer's attribute path, [HF names], [rows of each part]) for every tensor."""
    q, kv, f = spec["num_attention_heads"] * spec["kv_channels"], spec["num_query_groups"] * spec["kv_channels"], \
        spec["ffn_hidden_size"]
    out = [("embedding", ["model.embed_tokens.weight"], None)]
    for i in range(spec["num_layers"]):
        h = f"model.layers.{i}."
        out += [
            (f"layers.{i}.input_norm", [h + "input_layernorm.weight"], None),
            (f"layers.{i}.qkv", [h + f"self_attn.{p}_proj.weight" for p in "qkv"], [q, kv, kv]),
        ]
        if spec["add_qkv_bias"]:
            out.append((f"layers.{i}.qkv_bias", [h + f"self_attn.{p}_proj.bias" for p in "qkv"], [q, kv, kv]))
        if spec["qk_layernorm"]:
            out += [(f"layers.{i}.q_norm", [h + "self_attn.q_norm.weight"], None),
                    (f"layers.{i}.k_norm", [h + "self_attn.k_norm.weight"], None)]
        out += [
            (f"layers.{i}.proj", [h + "self_attn.o_proj.weight"], None),
            (f"layers.{i}.mlp_norm", [h + "post_attention_layernorm.weight"], None),
            (f"layers.{i}.fc1", [h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"], [f, f]),
            (f"layers.{i}.fc2", [h + "mlp.down_proj.weight"], None),
        ]
    out.append(("final_norm", ["model.norm.weight"], None))
    if spec["untie_embeddings_and_output_weights"]:
        out.append(("output", ["lm_head.weight"], None))
    return out


def get_param(model, path):
    obj = model
    for p in path.split("."):
        obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
    return obj


def read_safetensors(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    tensors = {}
    for fn in files:
        data = open(os.path.join(folder, fn), "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            dtype, _ = DTYPES[e["dtype"]]
            raw = bytearray(data[8 + n + b:8 + n + end])
            t = torch.frombuffer(raw, dtype=dtype).reshape(e["shape"])
            tensors[name] = t if dtype == torch.uint8 else t.float()  # MXFP4 blocks and scales stay bytes
    return tensors


def write_safetensors(folder, named, dtype, max_shard):
    torch_dtype, _ = DTYPES[dtype]

    def raw(t):
        if t.dtype == torch.uint8:  # MXFP4 blocks and scales
            return "U8", t.contiguous().numpy().tobytes()
        return dtype, t.to(torch_dtype).contiguous().view(torch.int16 if dtype == "BF16"
                                                          else torch.float32).numpy().tobytes()
    blobs = [(name, list(t.shape)) + raw(t) for name, t in named]
    shards, cur, size = [], [], 0
    for b in blobs:
        if cur and size + len(b[3]) > max_shard:
            shards.append(cur)
            cur, size = [], 0
        cur.append(b)
        size += len(b[3])
    shards.append(cur)
    names = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for fn, shard in zip(names, shards):
        header, off = {}, 0
        for name, shape, dt, data in shard:
            header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
            off += len(data)
            weight_map[name] = fn
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(folder, fn), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(data for _, _, _, data in shard))
    if len(shards) > 1:
        total = sum(len(b[3]) for b in blobs)
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
                  open(os.path.join(folder, "model.safetensors.index.json"), "w"), indent=2)


def spec_from_config(c):
    arch = c["architectures"][0]
    if arch not in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        sys.exit(f"error: architecture {arch} is not supported here")
    s = dict(torch_llama.SPEC_DEFAULTS)
    s.update(num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"], ffn_hidden_size=c["intermediate_size"],
             num_attention_heads=c["num_attention_heads"],
             num_query_groups=c.get("num_key_value_heads") or c["num_attention_heads"],
             kv_channels=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
             vocab_size=c["vocab_size"], max_position_embeddings=c["max_position_embeddings"],
             norm_epsilon=c["rms_norm_eps"], rotary_base=c.get("rope_theta", 10000.0),
             untie_embeddings_and_output_weights=not c.get("tie_word_embeddings", False),
             add_qkv_bias=arch == "Qwen2ForCausalLM", qk_layernorm=arch == "Qwen3ForCausalLM")
    rs = c.get("rope_scaling")
    if rs:
        s.update(use_rope_scaling=True, rope_scaling_factor=rs["factor"], rope_low_freq_factor=rs["low_freq_factor"],
                 rope_high_freq_factor=rs["high_freq_factor"],
                 rope_original_max_position_embeddings=rs["original_max_position_embeddings"])
    return torch_llama.check_spec(s)


def cmd_write(a):
    if a.family:
        config, named = hf_moe_peer.random_model(a.family, a.seed)
        config["torch_dtype"] = "bfloat16" if a.dtype == "BF16" else "float32"
        os.makedirs(a.out, exist_ok=True)
        write_safetensors(a.out, named, a.dtype, a.max_shard_bytes)
        json.dump(config, open(os.path.join(a.out, "config.json"), "w"), indent=2)
        return
    spec = torch_llama.check_spec(torch_llama.load_spec(a.model))
    torch.manual_seed(a.seed)
    model = torch_llama.Llama(spec)
    with torch.no_grad():  # norms and biases away from their 1 / 0 init, so that a mix-up shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    named = []
    for path, names, rows in hf_tensors(spec):
        t = get_param(model, path).detach()
        parts = [t] if rows is None else list(torch.split(t, rows, dim=0))
        named += list(zip(names, parts))
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(a.out, named, a.dtype, a.max_shard_bytes)
    arch = "Qwen3ForCausalLM" if spec["qk_layernorm"] else "Qwen2ForCausalLM" if spec["add_qkv_bias"] \
        else "LlamaForCausalLM"
    config = {"architectures": [arch], "model_type": {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2"}.get(
                  arch, "llama"),
              "head_dim": spec["kv_channels"],
              "hidden_size": spec["hidden_size"], "intermediate_size": spec["ffn_hidden_size"],
              "num_hidden_layers": spec["num_layers"], "num_attention_heads": spec["num_attention_heads"],
              "num_key_value_heads": spec["num_query_groups"], "vocab_size": spec["vocab_size"],
              "max_position_embeddings": spec["max_position_embeddings"], "rms_norm_eps": spec["norm_epsilon"],
              "rope_theta": spec["rotary_base"], "hidden_act": "silu",
              "tie_word_embeddings": not spec["untie_embeddings_and_output_weights"],
              "torch_dtype": "bfloat16" if a.dtype == "BF16" else "float32", "rope_scaling": None}
    json.dump(config, open(os.path.join(a.out, "config.json"), "w"), indent=2)


def text_model(config, tensors):
    """A Llama4ForConditionalGeneration folder (Meta's Llama 4 layout) as transformers builds its
    language model: the text_config as a Llama4ForCausalLM config, the language_model.* tensors
    without that prefix. The vision encoder's and projector's tensors (vision_model.*,
    multi_modal_projector.*) do not enter the text's logits; any other tensor is an error."""
    text = dict(config["text_config"], architectures=["Llama4ForCausalLM"])
    prefix, others = "language_model.", ("vision_model.", "multi_modal_projector.")
    stray = [n for n in tensors if not n.startswith(prefix) and not n.startswith(others)]
    if stray:
        sys.exit(f"error: tensors of no tower: {stray}")
    return text, {n[len(prefix):]: t for n, t in tensors.items() if n.startswith(prefix)}


def cmd_logits(a):
    config = json.load(open(os.path.join(a.dir, "config.json")))
    if config["architectures"][0] == "Llama4ForConditionalGeneration":
        config, tensors = text_model(config, read_safetensors(a.dir))
        tokens = [int(t) for t in a.tokens.split()]
        print(json.dumps(hf_moe_peer.logits(config, tensors, tokens).tolist()))
        return
    if config["architectures"][0] in hf_moe_peer.ARCHITECTURES:
        tensors = read_safetensors(a.dir)
        tokens = [int(t) for t in a.tokens.split()]
        print(json.dumps(hf_moe_peer.logits(config, tensors, tokens).tolist()))
        return
    spec = spec_from_config(config)
    tensors = read_safetensors(a.dir)
    model = torch_llama.Llama(spec)
    with torch.no_grad():
        for path, names, _ in hf_tensors(spec):
            get_param(model, path).copy_(torch.cat([tensors.pop(n) for n in names], dim=0))
    extra = [n for n in tensors if n != "lm_head.weight"]
    if extra:
        sys.exit(f"error: tensors not used: {extra}")
    tokens = torch.tensor([[int(t) for t in a.tokens.split()]])
    with torch.no_grad():
        logits = model(tokens)[0]
    print(json.dumps(logits.tolist()))


def cmd_mtp_logits(a):
    config = json.load(open(os.path.join(a.dir, "config.json")))
    tokens = [int(t) for t in a.tokens.split()]
    print(json.dumps([d.tolist() for d in hf_moe_peer.mtp_logits(config, read_safetensors(a.dir), tokens)]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out")
    w.add_argument("--model", default="tiny")
    w.add_argument("--family", choices=hf_moe_peer.FAMILIES, default=None)
    w.add_argument("--dtype", choices=DTYPES, default="F32")
    w.add_argument("--max-shard-bytes", type=int, default=5_000_000_000)
    w.add_argument("--seed", type=int, default=7)
    for cmd in ("logits", "mtp-logits"):
        lg = sub.add_parser(cmd)
        lg.add_argument("dir")
        lg.add_argument("--tokens", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    {"write": cmd_write, "logits": cmd_logits, "mtp-logits": cmd_mtp_logits}[a.cmd](a)


if __name__ == "__main__":
    main()
