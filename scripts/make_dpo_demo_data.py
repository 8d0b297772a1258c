#!/usr/bin/env python3
"""Writes examples/data/arith_pref.json, the small preference set of examples/dpo_tiny_cpu.yaml:
arithmetic questions, each with a chosen answer (the right result) and a rejected one (a wrong
result, off by 1 to 10), as {"train": [...], "validation": [...]}. Three record shapes, as TRL's
preference data sets have them:
  - "prompt", "chosen", "rejected" as text;
  - explicit prompt in messages: "prompt" a list of messages, "chosen"/"rejected" lists holding the
    assistant's answer;
  - implicit prompt: "chosen" and "rejected" whole conversations that share their first turns (a
    short system prompt).
96 training pairs (examples/dpo_tiny_cpu.yaml sees each several times in its 40 steps, so that a
model trained from random weights learns them within a minute) and 24 validation pairs; every
side fits the example's 128 tokens of the byte-level tokenizer.
Deterministic: the same file on every run (Python's random with a fixed seed)."""
import sys

from demo_data import ask, problem, rng, write_splits


def question():
    a, op, b, r = problem()
    wrong = r + rng.choice([-1, 1]) * rng.randint(1, 10)
    return ask(a, op, b), f"{a} {op} {b} = {r}", f"{a} {op} {b} = {wrong}"


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def pair():
    prompt, good, bad = question()
    shape = rng.random()
    if shape < 0.4:
        return {"prompt": prompt, "chosen": good, "rejected": bad}
    if shape < 0.7:
        return {"prompt": [user(prompt)], "chosen": [assistant(good)], "rejected": [assistant(bad)]}
    shared = [{"role": "system", "content": "Be exact."}, user(prompt)]
    return {"chosen": shared + [assistant(good)], "rejected": shared + [assistant(bad)]}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/data/arith_pref.json"
    data = {"train": [pair() for _ in range(96)], "validation": [pair() for _ in range(24)]}
    write_splits(out, data)

if __name__ == "__main__":
    main()
