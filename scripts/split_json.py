"""The writer shared by the demo-data scripts (make_sft_demo_data.py, make_dpo_demo_data.py): a
{"train": [...], "validation": [...]} file with one record per line, so that a diff of a
regenerated file shows the records that changed."""
import json


def write_splits(path, splits):
    names = list(splits)
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for i, name in enumerate(names):
            f.write(f'"{name}": [\n')
            f.write(",\n".join(json.dumps(r) for r in splits[name]))
            f.write("\n]" + (",\n" if i + 1 < len(names) else "\n"))
        f.write("}\n")
