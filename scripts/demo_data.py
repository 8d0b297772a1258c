"""What the demo-data scripts (make_sft_demo_data.py, make_dpo_demo_data.py) share: the seeded
random stream, the arithmetic problems and the writer of a {"train": [...], "validation": [...]}
file with one record per line (a diff of a regenerated file shows the records that changed)."""
import json
import random

rng = random.Random(20261128)
OPS = [("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b)]
ASK = ["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?"]


def problem():
    """An operation and its operands: (a, op, b, the result)."""
    op, f = rng.choice(OPS)
    a, b = rng.randint(0, 99), rng.randint(0, 99 if op != "*" else 12)
    return a, op, b, f(a, b)


def ask(a, op, b):
    return rng.choice(ASK).format(a=a, op=op, b=b)


def write_splits(path, splits):
    names = list(splits)
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for i, name in enumerate(names):
            f.write(f'"{name}": [\n')
            f.write(",\n".join(json.dumps(r) for r in splits[name]))
            f.write("\n]" + (",\n" if i + 1 < len(names) else "\n"))
        f.write("}\n")
