#!/usr/bin/env python3
"""Writes examples/data/arith_chat.json, the small chat data set of examples/sft_tiny_cpu.yaml:
arithmetic questions and answers in the messages shape ({"role", "content"}), some with a system
prompt and a follow-up turn, as {"train": [...], "validation": [...]}. Deterministic: the same file
on every run (Python's random with a fixed seed)."""
import sys

from demo_data import ask, problem, rng, write_splits


def conversation():
    a, op, b, r = problem()
    msgs = []
    if rng.random() < 0.25:
        msgs.append({"role": "system", "content": "You are a calculator."})
    msgs.append({"role": "user", "content": ask(a, op, b)})
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
