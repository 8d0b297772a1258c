"""The mixture-of-experts families of Hugging Face, forward only, on Hugging Face's tensor names, in
float64: the peer of the C++ import and export (hf_llama_peer.py calls it). Written from the facts of
transformers' modeling_mixtral, modeling_qwen2_moe, modeling_qwen3_moe and DeepSeek's
modeling_deepseek (V2 and V3): no code of theirs, and none of this repository's C++.

    random_model(family, seed) -> (config.json dict, [(name, tensor)])
    logits(config, tensors, tokens) -> [positions, vocab] float64
"""

import torch

ARCHITECTURES = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM",
                 "DeepseekV3ForCausalLM"}
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"]

_BASE = {"vocab_size": 256, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
         "rope_scaling": None, "attention_bias": False, "initializer_range": 0.02}


def tiny_config(family):
    c = dict(_BASE)
    if family == "mixtral":
        c.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_hidden_layers=2,
                 num_key_value_heads=2, head_dim=16, intermediate_size=48, num_local_experts=4,
                 num_experts_per_tok=2, router_aux_loss_coef=0.02, output_router_logits=False,
                 router_jitter_noise=0.0, sliding_window=None, rope_theta=1e6)
    elif family in ("qwen2_moe", "qwen3_moe"):
        c.update(architectures=["Qwen2MoeForCausalLM" if family == "qwen2_moe" else "Qwen3MoeForCausalLM"],
                 model_type=family, num_hidden_layers=3, num_key_value_heads=2, intermediate_size=96,
                 num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                 mlp_only_layers=[1], norm_topk_prob=family == "qwen3_moe", use_sliding_window=False,
                 router_aux_loss_coef=0.001, output_router_logits=False, tie_word_embeddings=True)
        if family == "qwen3_moe":
            c.update(head_dim=32)  # not hidden / heads, as in Qwen3-30B-A3B
        else:
            c.update(shared_expert_intermediate_size=48)
    else:
        v3 = family == "deepseek_v3"
        c.update(architectures=["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"], model_type=family,
                 num_hidden_layers=3, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=24,
                 n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=4 if v3 else 2,
                 first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=32, q_lora_rank=48 if v3 else None,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, routed_scaling_factor=2.5 if v3 else 1.0,
                 scoring_func="sigmoid" if v3 else "softmax", topk_method="noaux_tc" if v3 else "greedy",
                 n_group=4 if v3 else 1, topk_group=2 if v3 else 1, norm_topk_prob=v3, aux_loss_alpha=0.001,
                 seq_aux=True)
        if v3:
            c.update(num_nextn_predict_layers=0)
    return c


def _shapes(c):
    """Every tensor's HF name and shape for config c (what the families hold)."""
    arch, h, L = c["architectures"][0], c["hidden_size"], c["num_hidden_layers"]
    out = [("model.embed_tokens.weight", [c["vocab_size"], h])]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h])]
        out += _attention_shapes(c, p + "self_attn.")
        out += _mlp_shapes(c, i, p)
    out.append(("model.norm.weight", [h]))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [c["vocab_size"], h]))
    return out


def _attention_shapes(c, a):
    h, H = c["hidden_size"], c["num_attention_heads"]
    if c["architectures"][0].startswith("Deepseek"):
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        out = []
        if c["q_lora_rank"]:
            out += [(a + "q_a_proj.weight", [c["q_lora_rank"], h]), (a + "q_a_layernorm.weight", [c["q_lora_rank"]]),
                    (a + "q_b_proj.weight", [H * qk, c["q_lora_rank"]])]
        else:
            out.append((a + "q_proj.weight", [H * qk, h]))
        return out + [(a + "kv_a_proj_with_mqa.weight", [c["kv_lora_rank"] + c["qk_rope_head_dim"], h]),
                      (a + "kv_a_layernorm.weight", [c["kv_lora_rank"]]),
                      (a + "kv_b_proj.weight", [H * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]]),
                      (a + "o_proj.weight", [h, H * c["v_head_dim"]])]
    d = c.get("head_dim") or h // H
    kv = c["num_key_value_heads"] * d
    out = [(a + "q_proj.weight", [H * d, h]), (a + "k_proj.weight", [kv, h]), (a + "v_proj.weight", [kv, h]),
           (a + "o_proj.weight", [h, H * d])]
    if c["architectures"][0] == "Qwen2MoeForCausalLM":
        out += [(a + "q_proj.bias", [H * d]), (a + "k_proj.bias", [kv]), (a + "v_proj.bias", [kv])]
    if c["architectures"][0] == "Qwen3MoeForCausalLM":
        out += [(a + "q_norm.weight", [d]), (a + "k_norm.weight", [d])]
    return out


def _glu(prefix, names, f, h):
    g, u, d = names
    return [(prefix + g + ".weight", [f, h]), (prefix + u + ".weight", [f, h]), (prefix + d + ".weight", [h, f])]


def is_sparse(c, i):
    arch = c["architectures"][0]
    if arch == "MixtralForCausalLM":
        return True
    if arch.startswith("Qwen"):
        return i not in c.get("mlp_only_layers", []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0
    return c.get("n_routed_experts") and i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0


def _mlp_shapes(c, i, p):
    arch, h = c["architectures"][0], c["hidden_size"]
    qwen_names = ("gate_proj", "up_proj", "down_proj")
    if not is_sparse(c, i):
        return _glu(p + "mlp.", qwen_names, c["intermediate_size"], h)
    if arch == "MixtralForCausalLM":
        m = p + "block_sparse_moe."
        out = [(m + "gate.weight", [c["num_local_experts"], h])]
        for e in range(c["num_local_experts"]):
            out += _glu(m + f"experts.{e}.", ("w1", "w3", "w2"), c["intermediate_size"], h)
        return out
    m = p + "mlp."
    E = c["num_experts"] if arch.startswith("Qwen") else c["n_routed_experts"]
    out = [(m + "gate.weight", [E, h])]
    if c.get("topk_method") == "noaux_tc":
        out.append((m + "gate.e_score_correction_bias", [E]))
    for e in range(E):
        out += _glu(m + f"experts.{e}.", qwen_names, c["moe_intermediate_size"], h)
    if arch == "Qwen2MoeForCausalLM":
        out += _glu(m + "shared_expert.", qwen_names, c["shared_expert_intermediate_size"], h)
        out.append((m + "shared_expert_gate.weight", [1, h]))
    if arch.startswith("Deepseek") and c.get("n_shared_experts"):
        out += _glu(m + "shared_experts.", qwen_names, c["n_shared_experts"] * c["moe_intermediate_size"], h)
    return out


def random_model(family, seed):
    c = tiny_config(family)
    g = torch.Generator().manual_seed(seed)
    named = []
    for name, shape in _shapes(c):
        if len(shape) == 1:  # norms away from 1, biases away from 0, so that a mix-up shows
            base = 0.0 if name.endswith(".bias") else 1.0
            t = base + 0.1 * torch.randn(shape, generator=g)
        else:
            # routers wide, so that no two experts tie for a token's top-k
            std = 0.5 if name.endswith("gate.weight") and "mlp.gate" in name or "block_sparse_moe.gate" in name \
                else 0.08
            t = std * torch.randn(shape, generator=g)
        named.append((name, t.float()))
    return c, named


def _rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat([-x[..., d:], x[..., :d]], dim=-1)


def _rope(x, pos, dim, theta):
    """x [..., T, dim], the rotate-half convention (pairs i, i + dim/2)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    f = torch.outer(pos.double(), inv)
    emb = torch.cat([f, f], dim=-1)
    return x * emb.cos() + _rotate_half(x) * emb.sin()


def _attend(q, k, v, scale):
    """q, k [H, T, d], v [H, T, dv]; causal."""
    T = q.shape[1]
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _gqa(c, W, x, a):
    T, H = x.shape[0], c["num_attention_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    G = c["num_key_value_heads"]
    q, k, v = x @ W[a + "q_proj.weight"].T, x @ W[a + "k_proj.weight"].T, x @ W[a + "v_proj.weight"].T
    if a + "q_proj.bias" in W:
        q, k, v = q + W[a + "q_proj.bias"], k + W[a + "k_proj.bias"], v + W[a + "v_proj.bias"]
    q, k, v = q.view(T, H, d).transpose(0, 1), k.view(T, G, d).transpose(0, 1), v.view(T, G, d).transpose(0, 1)
    if a + "q_norm.weight" in W:  # Qwen3: per head, before rotary
        q, k = _rmsnorm(q, W[a + "q_norm.weight"], c["rms_norm_eps"]), _rmsnorm(k, W[a + "k_norm.weight"], c["rms_norm_eps"])
    pos = torch.arange(T)
    q, k = _rope(q, pos, d, c["rope_theta"]), _rope(k, pos, d, c["rope_theta"])
    k, v = k.repeat_interleave(H // G, dim=0), v.repeat_interleave(H // G, dim=0)
    o = _attend(q, k, v, d ** -0.5).transpose(0, 1).reshape(T, H * d)
    return o @ W[a + "o_proj.weight"].T


def _deinterleave(x):
    """DeepSeek's rotary on interleaved pairs: (x0, x1), (x2, x3), ... regrouped as halves first."""
    d = x.shape[-1]
    return x.view(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(*x.shape[:-1], d)


def _mla(c, W, x, a):
    T, H, eps = x.shape[0], c["num_attention_heads"], c["rms_norm_eps"]
    dn, dr, dv, R = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    if c["q_lora_rank"]:
        q = _rmsnorm(x @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"], eps) @ W[a + "q_b_proj.weight"].T
    else:
        q = x @ W[a + "q_proj.weight"].T
    q = q.view(T, H, dn + dr).transpose(0, 1)
    q_nope, q_pe = q[..., :dn], q[..., dn:]
    ckv = x @ W[a + "kv_a_proj_with_mqa.weight"].T
    latent, k_pe = ckv[:, :R], ckv[:, R:].view(1, T, dr)
    kv = (_rmsnorm(latent, W[a + "kv_a_layernorm.weight"], eps) @ W[a + "kv_b_proj.weight"].T).view(T, H, dn + dv)
    kv = kv.transpose(0, 1)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    pos = torch.arange(T)
    q_pe, k_pe = _rope(_deinterleave(q_pe), pos, dr, c["rope_theta"]), _rope(_deinterleave(k_pe), pos, dr, c["rope_theta"])
    qq = torch.cat([q_nope, q_pe], dim=-1)
    kk = torch.cat([k_nope, k_pe.expand(H, T, dr)], dim=-1)
    o = _attend(qq, kk, v, (dn + dr) ** -0.5).transpose(0, 1).reshape(T, H * dv)
    return o @ W[a + "o_proj.weight"].T


def _swiglu(x, W, p, names=("gate_proj", "up_proj", "down_proj")):
    g, u, d = names
    return (torch.nn.functional.silu(x @ W[p + g + ".weight"].T) * (x @ W[p + u + ".weight"].T)) @ W[p + d + ".weight"].T


def _route(c, logits, W, m):
    """(experts [T, k], weights [T, k]) of the family's gate."""
    arch, k = c["architectures"][0], c["num_experts_per_tok"]
    if not arch.startswith("Deepseek"):  # Mixtral, Qwen-MoE: softmax over all, top-k, renormalised (Mixtral always)
        p = torch.softmax(logits, dim=-1)
        w, e = torch.topk(p, k, dim=-1)
        if arch == "MixtralForCausalLM" or c.get("norm_topk_prob"):
            w = w / w.sum(-1, keepdim=True)
        return e, w
    T, E = logits.shape
    scores = torch.softmax(logits, dim=-1) if c["scoring_func"] == "softmax" else torch.sigmoid(logits)
    choice = scores.clone()
    if c["topk_method"] == "noaux_tc":
        choice = scores + W[m + "gate.e_score_correction_bias"]
    if c["topk_method"] != "greedy":
        G = c["n_group"]
        grouped = choice.view(T, G, E // G)
        gs = grouped.topk(2, dim=-1)[0].sum(-1) if c["topk_method"] == "noaux_tc" else grouped.max(-1)[0]
        keep = torch.zeros(T, G, dtype=torch.bool)
        keep.scatter_(1, torch.topk(gs, c["topk_group"], dim=-1)[1], True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    e = torch.topk(choice, k, dim=-1)[1]
    w = scores.gather(1, e)
    if k > 1 and c["norm_topk_prob"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
        if arch == "DeepseekV3ForCausalLM":
            w = w * c["routed_scaling_factor"]
    else:
        w = w * c["routed_scaling_factor"]
    return e, w


def _moe(c, W, x, p):
    arch = c["architectures"][0]
    m = p + ("block_sparse_moe." if arch == "MixtralForCausalLM" else "mlp.")
    names = ("w1", "w3", "w2") if arch == "MixtralForCausalLM" else ("gate_proj", "up_proj", "down_proj")
    e, w = _route(c, x @ W[m + "gate.weight"].T, W, m)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(e.shape[1]):
            out[t] += w[t, j] * _swiglu(x[t:t + 1], W, m + f"experts.{int(e[t, j])}.", names)[0]
    if arch == "Qwen2MoeForCausalLM":
        out += torch.sigmoid(x @ W[m + "shared_expert_gate.weight"].T) * _swiglu(x, W, m + "shared_expert.")
    if m + "shared_experts.gate_proj.weight" in W:
        out += _swiglu(x, W, m + "shared_experts.")
    return out


def logits(c, tensors, tokens):
    W = {n: t.double() for n, t in tensors.items()}
    expected = {n for n, _ in _shapes(c)}
    extra = sorted(set(W) - expected - {"lm_head.weight"})
    if extra:
        raise SystemExit(f"error: tensors not used: {extra}")
    eps = c["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    mla = c["architectures"][0].startswith("Deepseek")
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        hn = _rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        x = x + (_mla if mla else _gqa)(c, W, hn, p + "self_attn.")
        hn = _rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + (_moe(c, W, hn, p) if is_sparse(c, i) else _swiglu(hn, W, p + "mlp."))
    x = _rmsnorm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else W["lm_head.weight"]
    return x @ head.T
