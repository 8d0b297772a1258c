"""The mixture-of-experts families of Hugging Face, forward only, on Hugging Face's tensor names, in
float64: the peer of the C++ import and export (hf_llama_peer.py calls it). Written from the facts of
transformers' modeling_mixtral, modeling_qwen2_moe, modeling_qwen3_moe, modeling_gpt_oss (with its
YaRN and MXFP4 experts), modeling_llama4 (its text model: complex-pair rotary with Llama 3.1 scaling,
chunked attention, NoPE layers with the query temperature, the L2 qk norm, top-1 sigmoid routing on
the expert's input and a shared expert) and DeepSeek's modeling_deepseek (V2 and V3): no code of
theirs, and none of this repository's C++. DeepSeek-V3's multi-token-prediction layers (family
deepseek_v3_mtp, num_nextn_predict_layers 1) from DeepSeek's README_WEIGHTS.md (the names) and
vLLM's deepseek_mtp.py (what serves those weights: the meaning), see mtp_logits.

    random_model(family, seed) -> (config.json dict, [(name, tensor)])
    logits(config, tensors, tokens) -> [positions, vocab] float64
    mtp_logits(config, tensors, tokens) -> per depth k, [positions - k - 1, vocab] float64
"""

import torch

import math

ARCHITECTURES = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM",
                 "DeepseekV3ForCausalLM", "GptOssForCausalLM", "Llama4ForCausalLM"}
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v2_grouped", "deepseek_v3", "deepseek_v3_mtp",
            "gpt_oss", "gpt_oss_mxfp4", "llama4"]
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

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
    elif family == "llama4":
        # dense layers 0 and 2, MoE 1 and 3; NoPE layers 2 and 3; chunks of 4 and a temperature floor of 3
        # so that both act on 12 tokens; Llama 3.1 scaling whose bands cut through the 8 frequencies
        c.update(architectures=["Llama4ForCausalLM"], model_type="llama4_text", num_hidden_layers=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=32, intermediate_size_mlp=96,
                 num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, moe_layers=[1, 3],
                 no_rope_layers=[1, 1, 0, 0], use_qk_norm=True, attention_chunk_size=4,
                 attn_temperature_tuning=True, floor_scale=3, attn_scale=0.5, rms_norm_eps=1e-5,
                 router_aux_loss_coef=0.001, output_router_logits=False, router_jitter_noise=0.0,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    elif family.startswith("gpt_oss"):
        # a window of 4 keys on layer 0 and a clamp of 0.3, so that both act on 12 tokens; YaRN of 4x
        c.update(architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_hidden_layers=2,
                 num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4,
                 num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                 swiglu_limit=0.3, attention_bias=True, router_aux_loss_coef=0.9, output_router_logits=False,
                 rope_theta=150000.0, rms_norm_eps=1e-5,
                 rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                               "truncate": False, "original_max_position_embeddings": 32})
        if family == "gpt_oss_mxfp4":
            c.update(quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                                          "model.layers.*.mlp.router"]})
    else:
        v3 = family.startswith("deepseek_v3")
        c.update(architectures=["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
                 model_type="deepseek_v3" if v3 else "deepseek_v2",
                 num_hidden_layers=3, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=24,
                 n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=4 if v3 else 2,
                 first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=32, q_lora_rank=48 if v3 else None,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, routed_scaling_factor=2.5 if v3 else 1.0,
                 scoring_func="sigmoid" if v3 else "softmax", topk_method="noaux_tc" if v3 else "greedy",
                 n_group=4 if v3 else 1, topk_group=2 if v3 else 1, norm_topk_prob=v3, aux_loss_alpha=0.001,
                 seq_aux=True)
        if v3:
            c.update(num_nextn_predict_layers=1 if family == "deepseek_v3_mtp" else 0)
        if family == "deepseek_v2_grouped":
            # DeepSeek-V2's (236B) routing, smaller: group_limited_greedy over 8 groups of 4 experts, the 3 with
            # the largest top scores kept, top-6 inside them; the sum of each group's top 6 / 3 = 2 keeps other
            # groups for 2 of the 24 routed tokens of the tests (kTokens, two MoE layers)
            c.update(n_routed_experts=32, num_experts_per_tok=6, topk_method="group_limited_greedy", n_group=8,
                     topk_group=3, routed_scaling_factor=1.5)
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
    for i in range(L, L + c.get("num_nextn_predict_layers", 0)):  # DeepSeek-V3's MTP layers (README_WEIGHTS.md)
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h])]
        out += _attention_shapes(c, p + "self_attn.")
        out += _mlp_shapes(c, i, p)
        out += [(p + "enorm.weight", [h]), (p + "hnorm.weight", [h]), (p + "eh_proj.weight", [h, 2 * h]),
                (p + "embed_tokens.weight", [c["vocab_size"], h]), (p + "shared_head.norm.weight", [h]),
                (p + "shared_head.head.weight", [c["vocab_size"], h])]
    return out


def _mtp_copy_of(c, name):
    """The main model's tensor an MTP layer's embed_tokens / shared_head.head copies (README_WEIGHTS.md:
    they share the main model's parameters), or None."""
    if name.startswith("model.layers.") and name.endswith(".embed_tokens.weight"):
        return "model.embed_tokens.weight"
    if name.endswith(".shared_head.head.weight"):
        return "model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight"
    return None


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
    if c["architectures"][0] in ("Qwen2MoeForCausalLM", "GptOssForCausalLM"):
        out += [(a + "q_proj.bias", [H * d]), (a + "k_proj.bias", [kv]), (a + "v_proj.bias", [kv])]
    if c["architectures"][0] == "GptOssForCausalLM":
        out += [(a + "o_proj.bias", [h]), (a + "sinks", [H])]
    if c["architectures"][0] == "Qwen3MoeForCausalLM":
        out += [(a + "q_norm.weight", [d]), (a + "k_norm.weight", [d])]
    return out


def _glu(prefix, names, f, h):
    g, u, d = names
    return [(prefix + g + ".weight", [f, h]), (prefix + u + ".weight", [f, h]), (prefix + d + ".weight", [h, f])]


def is_sparse(c, i):
    arch = c["architectures"][0]
    if arch in ("MixtralForCausalLM", "GptOssForCausalLM"):
        return True
    if arch == "Llama4ForCausalLM":
        return i in c["moe_layers"]
    if arch.startswith("Qwen"):
        return i not in c.get("mlp_only_layers", []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0
    return c.get("n_routed_experts") and i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0


def _mlp_shapes(c, i, p):
    arch, h = c["architectures"][0], c["hidden_size"]
    qwen_names = ("gate_proj", "up_proj", "down_proj")
    if arch == "Llama4ForCausalLM":
        m = p + "feed_forward."
        if not is_sparse(c, i):
            return _glu(m, qwen_names, c["intermediate_size_mlp"], h)
        E, f = c["num_local_experts"], c["intermediate_size"]
        return [(m + "router.weight", [E, h]), (m + "experts.gate_up_proj", [E, h, 2 * f]),
                (m + "experts.down_proj", [E, f, h])] + _glu(m + "shared_expert.", qwen_names, f, h)
    if not is_sparse(c, i):
        return _glu(p + "mlp.", qwen_names, c["intermediate_size"], h)
    if arch == "GptOssForCausalLM":
        m, E, f = p + "mlp.", c["num_local_experts"], c["intermediate_size"]
        out = [(m + "router.weight", [E, h]), (m + "router.bias", [E])]
        if "quantization_config" in c:  # MXFP4: [E, out, in / 32, 16] bytes and [E, out, in / 32] exponents
            out += [(m + "experts.gate_up_proj_blocks", [E, 2 * f, h // 32, 16]),
                    (m + "experts.gate_up_proj_scales", [E, 2 * f, h // 32]),
                    (m + "experts.down_proj_blocks", [E, h, f // 32, 16]),
                    (m + "experts.down_proj_scales", [E, h, f // 32])]
        else:
            out += [(m + "experts.gate_up_proj", [E, h, 2 * f]), (m + "experts.down_proj", [E, f, h])]
        return out + [(m + "experts.gate_up_proj_bias", [E, 2 * f]), (m + "experts.down_proj_bias", [E, h])]
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
        if _mtp_copy_of(c, name):
            named.append((name, dict(named)[_mtp_copy_of(c, name)].clone()))
            continue
        if name.endswith("_blocks"):  # random E2M1 pairs
            named.append((name, torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)))
            continue
        if name.endswith("_scales"):  # exponents 2^-7 .. 2^-4
            named.append((name, torch.randint(120, 124, shape, generator=g, dtype=torch.uint8)))
            continue
        if len(shape) == 1 or name.endswith("_bias"):  # norms away from 1, biases away from 0, so that a mix-up shows
            base = 0.0 if name.endswith(".bias") else 1.0
            t = base + 0.1 * torch.randn(shape, generator=g)
        else:
            # routers wide, so that no two experts tie for a token's top-k
            std = 0.5 if name.endswith("gate.weight") and "mlp.gate" in name or "block_sparse_moe.gate" in name \
                or name.endswith("router.weight") else 0.08
            t = std * torch.randn(shape, generator=g)
        named.append((name, t.float()))
    return c, named


def _rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat([-x[..., d:], x[..., :d]], dim=-1)


def _yarn(inv, dim, theta, r):
    """HF's YaRN (rope_type yarn, default attention factor): the frequencies and the cos/sin factor."""
    factor = r["factor"]

    def correction_dim(rot):
        return dim * math.log(r["original_max_position_embeddings"] / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(r.get("beta_fast", 32.0)), correction_dim(r.get("beta_slow", 1.0))
    if r.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv = (inv / factor) * (1 - extrapolation) + inv * extrapolation
    return inv, 0.1 * math.log(factor) + 1.0


def _rope(x, pos, dim, theta, scaling=None):
    """x [..., T, dim], the rotate-half convention (pairs i, i + dim/2)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scale = 1.0
    if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
        inv, scale = _yarn(inv, dim, theta, scaling)
    f = torch.outer(pos.double(), inv)
    emb = torch.cat([f, f], dim=-1)
    return x * (emb.cos() * scale) + _rotate_half(x) * (emb.sin() * scale)


def _attend(q, k, v, scale, sinks=None, window=None):
    """q, k [H, T, d], v [H, T, dv]; causal, keys t - window + 1 .. t with a window; sinks [H]: one more
    logit per head in the softmax's denominator (gpt-oss)."""
    T = q.shape[1]
    s = (q @ k.transpose(-1, -2)) * scale
    i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    hidden = (j > i) if window is None else (j > i) | (j <= i - window)
    s = s.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(-1, 1, 1).expand(-1, T, 1)], dim=-1)
        return torch.softmax(s, dim=-1)[..., :T] @ v
    return torch.softmax(s, dim=-1) @ v


def _gqa(c, W, x, a, layer=0):
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
    rs = c.get("rope_scaling")
    q, k = _rope(q, pos, d, c["rope_theta"], rs), _rope(k, pos, d, c["rope_theta"], rs)
    k, v = k.repeat_interleave(H // G, dim=0), v.repeat_interleave(H // G, dim=0)
    window = c["sliding_window"] if c.get("layer_types", [None] * (layer + 1))[layer] == "sliding_attention" else None
    o = _attend(q, k, v, d ** -0.5, W.get(a + "sinks"), window).transpose(0, 1).reshape(T, H * d)
    return o @ W[a + "o_proj.weight"].T + W.get(a + "o_proj.bias", 0.0)


def _llama3_inv(inv, r):
    """HF's rope_type llama3: long wavelengths divided by factor, short kept, the band between smoothed."""
    factor, lo, hi, old = r["factor"], r["low_freq_factor"], r["high_freq_factor"], r["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def _rope_complex(x, pos, dim, theta, scaling=None):
    """Llama 4's rotary: x [..., T, dim] as dim/2 complex numbers (x0 + i x1, x2 + i x3, ...) times e^(i t f)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if scaling and scaling.get("rope_type") == "llama3":
        inv = _llama3_inv(inv, scaling)
    f = torch.outer(pos.double(), inv)
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], dim // 2, 2).contiguous())
    return torch.view_as_real(xc * torch.polar(torch.ones_like(f), f)).reshape(x.shape)


def _llama4_attention(c, W, x, a, layer):
    T, H, G = x.shape[0], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    q, k, v = x @ W[a + "q_proj.weight"].T, x @ W[a + "k_proj.weight"].T, x @ W[a + "v_proj.weight"].T
    q, k, v = q.view(T, H, d).transpose(0, 1), k.view(T, G, d).transpose(0, 1), v.view(T, G, d).transpose(0, 1)
    pos = torch.arange(T)
    rope = bool(c["no_rope_layers"][layer])
    if rope:
        q = _rope_complex(q, pos, d, c["rope_theta"], c.get("rope_scaling"))
        k = _rope_complex(k, pos, d, c["rope_theta"], c.get("rope_scaling"))
        if c.get("use_qk_norm"):  # L2 norm: no weights, after the rotary, RoPE layers only
            q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])
            k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])
    elif c.get("attn_temperature_tuning"):
        t = torch.log(torch.floor((pos.double() + 1.0) / c["floor_scale"]) + 1.0) * c["attn_scale"] + 1.0
        q = q * t.view(1, T, 1)
    k, v = k.repeat_interleave(H // G, dim=0), v.repeat_interleave(H // G, dim=0)
    s = (q @ k.transpose(-1, -2)) * d ** -0.5
    i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    hidden = j > i
    C = c.get("attention_chunk_size")
    if rope and C:
        hidden = hidden | (j // C != i // C)
    o = torch.softmax(s.masked_fill(hidden, float("-inf")), dim=-1) @ v
    return o.transpose(0, 1).reshape(T, H * d) @ W[a + "o_proj.weight"].T


def _llama4_moe(c, W, x, p):
    m = p + "feed_forward."
    logits = x @ W[m + "router.weight"].T
    top, e = torch.topk(logits, 1, dim=-1)
    routed_in = x * torch.sigmoid(top)  # the score scales the expert's input
    out = _swiglu(x, W, m + "shared_expert.")
    gu, dn = W[m + "experts.gate_up_proj"], W[m + "experts.down_proj"]
    for t in range(x.shape[0]):
        y = routed_in[t] @ gu[int(e[t, 0])]
        gate, up = y.chunk(2, dim=-1)
        out[t] += (torch.nn.functional.silu(gate) * up) @ dn[int(e[t, 0])]
    return out


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
        # a group's score: noaux_tc sums its top 2, group_limited_greedy (V2) takes its largest
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


def _mxfp4(blocks, scales):
    """[E, out, G, 16] bytes and [E, out, G] exponents -> [E, out, 32 G]."""
    lut = torch.tensor(FP4, dtype=torch.float64)
    b = blocks.long()
    vals = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.pow(2.0, scales.double() - 127).unsqueeze(-1)
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def _gpt_oss_moe(c, W, x, p):
    m = p + "mlp."
    k, limit = c["num_experts_per_tok"], c["swiglu_limit"]
    logits = x @ W[m + "router.weight"].T + W[m + "router.bias"]
    top, e = torch.topk(logits, k, dim=-1)
    w = torch.softmax(top, dim=-1)  # over the chosen logits
    x_ = m + "experts."
    if x_ + "gate_up_proj" in W:
        gu, dn = W[x_ + "gate_up_proj"], W[x_ + "down_proj"]
    else:  # MXFP4: [E, out, in], the transposes of the parameters
        gu = _mxfp4(W[x_ + "gate_up_proj_blocks"], W[x_ + "gate_up_proj_scales"]).transpose(1, 2)
        dn = _mxfp4(W[x_ + "down_proj_blocks"], W[x_ + "down_proj_scales"]).transpose(1, 2)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            i = int(e[t, j])
            y = x[t] @ gu[i] + W[x_ + "gate_up_proj_bias"][i]
            gate, up = y[::2].clamp(max=limit), y[1::2].clamp(-limit, limit)
            glu = gate * torch.sigmoid(gate * 1.702)
            out[t] += w[t, j] * (((up + 1) * glu) @ dn[i] + W[x_ + "down_proj_bias"][i])
    return out


def _moe(c, W, x, p):
    arch = c["architectures"][0]
    if arch == "GptOssForCausalLM":
        return _gpt_oss_moe(c, W, x, p)
    if arch == "Llama4ForCausalLM":
        return _llama4_moe(c, W, x, p)
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


def _weights(c, tensors):
    W = {n: t if t.dtype == torch.uint8 else t.double() for n, t in tensors.items()}
    expected = {n for n, _ in _shapes(c)}
    extra = sorted(set(W) - expected - {"lm_head.weight"})
    if extra:
        raise SystemExit(f"error: tensors not used: {extra}")
    return W


def _layer(c, W, x, i):
    """Decoder layer i (model.layers.i.*): pre-norm attention and feed-forward, each with its residual."""
    eps, p = c["rms_norm_eps"], f"model.layers.{i}."
    mla = c["architectures"][0].startswith("Deepseek")
    llama4 = c["architectures"][0] == "Llama4ForCausalLM"
    hn = _rmsnorm(x, W[p + "input_layernorm.weight"], eps)
    a = p + "self_attn."
    x = x + (_mla(c, W, hn, a) if mla else _llama4_attention(c, W, hn, a, i) if llama4 else _gqa(c, W, hn, a, i))
    hn = _rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
    return x + (_moe(c, W, hn, p) if is_sparse(c, i) else _swiglu(hn, W, p + ("feed_forward." if llama4 else "mlp.")))


def _hidden(c, W, tokens):
    """The main model's output after model.norm, [positions, hidden]."""
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    for i in range(c["num_hidden_layers"]):
        x = _layer(c, W, x, i)
    return _rmsnorm(x, W["model.norm.weight"], c["rms_norm_eps"])


def logits(c, tensors, tokens):
    W = _weights(c, tensors)
    head = W["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else W["lm_head.weight"]
    return _hidden(c, W, tokens) @ head.T


def mtp_logits(c, tensors, tokens):
    """DeepSeek-V3's multi-token prediction, depth k = 0 .. num_nextn_predict_layers - 1 on layer
    L + k (L = num_hidden_layers); row i predicts token i + k + 2 from token i + k + 1 and the
    previous depth's output. As vLLM's deepseek_mtp.py serves the released weights:
        u = eh_proj(cat([enorm(embed_tokens[t_{i+k+1}]), hnorm(h_i)]))   the embedding's half first
        y = decoder layer L + k (u)                                       its kind by first_k_dense_replace
        logits = shared_head.head(shared_head.norm(y))
    h for depth 0 is the main model's output after model.norm (vLLM's DeepseekV2Model returns it so).
    Depth k + 1 reads depth k's shared_head.norm(y), Megatron-LM's chaining (the release has one depth;
    vLLM runs each depth from the main model's states). Rows past the sequence's end (no token
    i + k + 1) are left out; the rows kept never attend to them (causal)."""
    W = _weights(c, tensors)
    eps, L, T = c["rms_norm_eps"], c["num_hidden_layers"], len(tokens)
    h = _hidden(c, W, tokens)
    out = []
    for k in range(c.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{L + k}."
        ahead = torch.tensor(tokens[k + 1:] + [0] * (k + 1))
        e = _rmsnorm(W[p + "embed_tokens.weight"][ahead], W[p + "enorm.weight"], eps)
        u = torch.cat([e, _rmsnorm(h, W[p + "hnorm.weight"], eps)], dim=-1) @ W[p + "eh_proj.weight"].T
        h = _rmsnorm(_layer(c, W, u, L + k), W[p + "shared_head.norm.weight"], eps)
        out.append((h @ W[p + "shared_head.head.weight"].T)[:T - k - 1])
    return out
