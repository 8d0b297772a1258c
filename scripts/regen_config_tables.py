#!/usr/bin/env python3
"""Rewrites the two generated tables of docs/config.md from `primus-cli ... --config-reference`.

Usage: scripts/regen_config_tables.py [path/to/primus-cli]. Each table in the reference output
starts at a `| key |` header line; the matching table in the docs (same header) is replaced whole.
"""
import subprocess, sys, pathlib

cli = sys.argv[1] if len(sys.argv) > 1 else "build/src/cli/primus-cli"
out = subprocess.run([cli, "direct", "--", "train", "pretrain", "--config-reference"], check=True,
                     capture_output=True, text=True).stdout.splitlines()

def tables(lines):
    found, cur = [], None
    for line in lines:
        if line.startswith("|"):
            if cur is None:
                cur = []
                found.append(cur)
            cur.append(line)
        else:
            cur = None
    return found

doc_path = pathlib.Path(__file__).resolve().parent.parent / "docs" / "config.md"
doc = doc_path.read_text().splitlines()
for table in tables(out):
    header = table[0]
    start = doc.index(header)
    end = start
    while end < len(doc) and doc[end].startswith("|"):
        end += 1
    doc[start:end] = table
doc_path.write_text("\n".join(doc) + "\n")
