#!/usr/bin/env python3
"""Writes the structure-aware seeds of fuzz/corpus: inputs a hostile or damaged file could be
(nesting far deeper than any real file, long lines, alias bombs, counts past the readers' limits)
next to the small valid seeds. Run from anywhere; the files are committed, so this only documents
and regenerates them:  python3 fuzz/make_large_seeds.py"""
import json
import os
import struct

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def nested(kind, depth, inner):  # `depth` Sequences of `kind` around `inner`, as text (no recursion)
    key = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "decoder": "decoders",
           "post_processor": "processors"}[kind]
    return '{"type":"Sequence","%s":[' % key * depth + inner + "]}" * depth


def tokenizer_seeds():
    with open(os.path.join(CORPUS, "tokenizer_json", "tiny_bpe.json")) as f:
        base = json.load(f)
    inner = {"normalizer": '{"type":"NFC"}', "pre_tokenizer": '{"type":"ByteLevel"}',
             "decoder": '{"type":"ByteLevel"}', "post_processor": '{"type":"ByteLevel"}'}
    for kind, step in inner.items():
        b = dict(base)
        b[kind] = "@@"
        put("tokenizer_json", f"deep_{kind}.json", json.dumps(b).replace('"@@"', nested(kind, 200, step)))
    b = dict(base)
    b["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}] * 2000}
    put("tokenizer_json", "many_normalizer_steps.json", json.dumps(b))
    b = dict(base)
    b["model"] = dict(base["model"], vocab=dict(base["model"]["vocab"], **{"x" * 100000: 9999}))
    put("tokenizer_json", "long_token.json", json.dumps(b))
    b = dict(base)
    b["added_tokens"] = "@@"
    put("tokenizer_json", "deep_added_tokens.json", json.dumps(b).replace('"@@"', "[" * 5000 + "]" * 5000))


def yaml_seeds():
    head = "exp_name: seed\nmodules:\n  pre_trainer:\n    model: tiny\n    overrides:\n      mock_data: true\n"
    laughs = head + "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 10):
        laughs += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n"
    put("yaml_config", "alias_bomb.yaml", laughs)
    put("yaml_config", "deep_flow.yaml", head + "      data_path: " + "[" * 3000 + "]" * 3000 + "\n")
    block = head + "".join("  " * (3 + i) + f"k{i}:\n" for i in range(200)) + "  " * 203 + "v: 1\n"
    put("yaml_config", "deep_block.yaml", block)
    put("yaml_config", "long_line.yaml", head + "      lr: " + "9" * 100000 + "\n")


def safetensors(header, data=b""):
    h = header.encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    ok = '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    put("safetensors_header", "one_tensor.safetensors", safetensors(ok, struct.pack("<2f", 1.5, -2)))
    put("safetensors_header", "bf16.safetensors",
        safetensors('{"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}}', b"\x80\x3f\x40\xc0"))
    dup = '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    put("safetensors_header", "duplicate_name.safetensors", safetensors(dup, b"\0" * 8))
    big = '{"a":{"dtype":"F32","shape":[1099511627776,1099511627776,16],"data_offsets":[0,0]}}'
    put("safetensors_header", "shape_overflow.safetensors", safetensors(big))
    deep = '{"__metadata__":' + "[" * 20000 + "]" * 20000 + "}"
    put("safetensors_header", "deep_header.safetensors", safetensors(deep))
    put("safetensors_header", "long_name.safetensors",
        safetensors('{"' + "n" * 100000 + '":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
    put("safetensors_header", "length_past_end.safetensors", struct.pack("<Q", 1 << 40) + b"{}")


def trace_seeds():
    other = {"producer": "primus-cpp", "rank": 0, "host": "h", "sync_us": 0, "device": "cpu", "peak_tflops": 1.0,
             "memory_bandwidth_gbs": 10.0}
    ev = lambda name, cat, ts, dur, args: {"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": 0, "ts": ts,
                                          "dur": dur, "args": args}
    events = [ev("gemm", "compute", 0, 10, {"M": 64, "N": 64, "K": 64, "flops": 524288, "step": 1, "pass": "F"}),
              ev("all_reduce", "communication", 5, 10, {"group": "dp", "group_size": 2, "bytes": 4096, "step": 1}),
              ev("step", "host", 0, 20, {"step": 1})]
    put("trace_json", "small_trace.json", json.dumps({"traceEvents": events, "otherData": other}))
    deep = json.dumps({"traceEvents": [ev("gemm", "compute", 0, 1, "@@")], "otherData": other})
    put("trace_json", "deep_args.json", deep.replace('"@@"', '{"x":' * 10000 + "1" + "}" * 10000))
    bad = [ev("gemm", "compute", "soon", 10, {"M": "big"})]
    put("trace_json", "wrong_types.json", json.dumps({"traceEvents": bad, "otherData": other}))
    put("trace_json", "long_name.json",
        json.dumps({"traceEvents": [ev("g" * 100000, "compute", 0, 1, {})], "otherData": other}))


def jsonl_seeds():
    put("jsonl_line", "deep_line.json", '{"text": ' + "[" * 20000 + '"a"' + "]" * 20000 + "}")
    put("jsonl_line", "long_line.json", json.dumps({"text": "word " * 20000}))


if __name__ == "__main__":
    tokenizer_seeds()
    yaml_seeds()
    safetensors_seeds()
    trace_seeds()
    jsonl_seeds()
