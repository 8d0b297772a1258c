#!/usr/bin/env python3
"""Writes examples/data/arith_chat.json, the small chat data set of examples/sft_tiny_cpu.yaml:
arithmetic questions and answers in the messages shape ({"role", "content"}), some with a system
prompt and a follow-up turn, as {"train": [...], "validation": [...]}. Deterministic: the same file
on every run (Python's random with a fixed seed)."""
import random
import sys

from split_json import write_splits

rng = random.Random(20261128)
OPS = [("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b)]
ASK = ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?"]


def conversation():
    op, f = rng.choice(OPS)
    a, b = rng.randint(0, 99), rng.randint(0, 99 if op != "*" else 12)
    msgs = []
    if rng.random() < 0.25:
        msgs.append({"role": "system", "content": "You are a calculator."})
    msgs.append({"role": "user", "content": rng.choice(ASK).format(a=a, op=op, b=b)})
    r = f(a, b)
    msgs.append({"role": "assistant", "content": f"{a} {op} {b} = {r}"})
    if rng.random() < 0.2:  # a follow-up turn on the result
        c = rng.randint(2, 9)
        msgs.append({"role": "user", "content": f"And plus {c}?"})
        msgs.append({"role": "assistant", "content": f"{r} + {c} = {r + c}"})
    return {"messages": msgs}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/data/arith_chat.json"
    data = {"train": [conversation() for _ in range(400)], "validation": [conversation() for _ in range(40)]}
    write_splits(out, data)

if __name__ == "__main__":
    main()
