#!/bin/bash
# Projections of the seeds' recipes (benchmarks/projection/recipes/*.yaml) on 1 and 8 nodes of
# MI300X, MI325X and H100 (DeepSeek-V3 on 128) from each machine's roofline (docs/profiling.md):
# prints the Markdown table of the docs. A layout that needs more GPUs than the nodes have gets the
# planner's reason.
#
#   bash benchmarks/projection/recipes.sh [build/src/cli/primus-cli]
set -euo pipefail
CLI=$(realpath "${1:-build/src/cli/primus-cli}")
DIR=$(cd "$(dirname "$0")/recipes" && pwd)
WORK=$(mktemp -d /tmp/primus_recipes.XXXXXX)
cd "$WORK"
# recipe | extra arguments | node counts (default: 1 and 8)
RECIPES=(
  "qwen2.5_7B_ddp||"
  "llama3.1_70B_fsdp|--sharding fsdp|"
  "llama3.1_405B_tp_pp_vpp||"
  "deepseek_v3_ep64||128"
)
echo "| recipe | hardware | nodes | layout | peak memory per GPU (GiB) | fits | step (s) | tokens/s | TFLOP/s per GPU | MFU |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for row in "${RECIPES[@]}"; do
  IFS='|' read -r name extra node_counts <<< "$row"
  for hw in MI300X MI325X H100; do
    for nodes in ${node_counts:-1 8}; do
      # shellcheck disable=SC2086
      if ! "$CLI" direct -- projection both --config "$DIR/$name.yaml" --target-nodes "$nodes" --hardware-config "$hw" \
          $extra --format json > p.json 2> p.err; then
        echo "| $name | $hw | $nodes | $(grep -m1 '^error' p.err | sed 's/^error: //; s/|/\\|/g') | | | | | | |"
        continue
      fi
      python3 - "$name" "$hw" "$nodes" <<'PY'
import json, sys
name, hw, nodes = sys.argv[1:4]
p = json.load(open("p.json"))
l, perf = p["layout"], p["performance"]
layout = "tp %d pp %d%s dp %d%s, %s, recompute %s" % (l["tp"], l["pp"], (" vpp %d" % l["vpp"]) if l.get("vpp", 1) > 1 else "",
                                                     l["dp"], (" ep %d" % l["ep"]) if l.get("ep", 1) > 1 else "",
                                                     p["sharding"], p["recompute"])
peak = max(r["peak_bytes"] for r in p["per_rank"]) / 2**30
print("| %s | %s | %s | %s | %.1f | %s | %.1f | %.0f | %.0f | %.1f%% |" % (
    name, hw, nodes, layout, peak, "yes" if p["memory"]["fits"] else "**no**", perf["step_time_ms"] / 1e3,
    perf["tokens_per_s"], perf["tflops_per_gpu"], 100 * perf["mfu"]))
PY
    done
  done
done
rm -rf "$WORK"
