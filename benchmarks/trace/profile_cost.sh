#!/bin/bash
# The cost of profiling (docs/profiling.md): the same training run with profiling off and on,
# alternated ROUNDS times in one session. A run of 16 steps with profiling on traces steps 9..16
# (profile_step_start 8), so that its steps 3..8 measure "on, outside the window" (the decorators
# are installed; each call costs a branch) and steps 11..16 "on, inside the window" (every op,
# collective and span recorded); the run with profiling off gives both baselines over the same
# steps. Prints the medians of the step times (metrics.jsonl's step_time_ms) and their ratios.
#
#   bash benchmarks/trace/profile_cost.sh [build/src/cli/primus-cli] [nproc] [rounds] [extra overrides...]
set -euo pipefail
CLI=$(realpath "${1:-build/src/cli/primus-cli}")
NP=${2:-1}
ROUNDS=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
WORK=$(mktemp -d /tmp/primus_profile_cost.XXXXXX)
cd "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
[ "$NP" -gt 1 ] && export OMP_NUM_THREADS=1
cat > cost.yaml <<'YAML'
work_group: cost
user_name: cost
exp_name: cost
workspace: ws
modules:
  pre_trainer:
    framework: megatron
    model: tiny_llama
    overrides:
      micro_batch_size: 4
      global_batch_size: 8
      seq_length: 128
      train_iters: 16
      lr: 1.0e-3
      log_interval: 1
      eval_interval: 0
      save_interval: 0
      mock_data: true
YAML
for r in $(seq "$ROUNDS"); do
  for mode in off on; do
    extra=()
    [ "$mode" = on ] && extra=(--profile true --profile_step_start 8 --profile_step_end 16 --profile_ranks "[$(seq -s, 0 $((NP - 1)))]")
    "$CLI" direct --nproc "$NP" --exp-name "$mode-$r" -- train pretrain --config cost.yaml "${extra[@]}" "$@" \
      > "$mode-$r.log" 2>&1 || { tail -5 "$mode-$r.log"; exit 1; }
  done
done
python3 - "$ROUNDS" <<'PY'
import json, statistics, sys
rounds = int(sys.argv[1])
def steps(run, first, last):
    rows = [json.loads(l) for l in open(f"ws/{run}/metrics.jsonl") if "step_time_ms" in l]
    return [r["step_time_ms"] for r in rows if first <= r["iteration"] <= last]
out = {}
for mode in ("off", "on"):
    for name, (a, b) in (("outside", (3, 8)), ("inside", (11, 16))):
        out[mode, name] = statistics.median(sum((steps(f"{mode}-{r}", a, b) for r in range(1, rounds + 1)), []))
print("| steps | profiling off (ms) | profiling on (ms) | on / off |")
print("|---|---|---|---|")
print("| 3-8 (on: outside the window) | %.2f | %.2f | %.3f |" % (out["off", "outside"], out["on", "outside"], out["on", "outside"] / out["off", "outside"]))
print("| 11-16 (on: traced) | %.2f | %.2f | %.3f |" % (out["off", "inside"], out["on", "inside"], out["on", "inside"] / out["off", "inside"]))
PY
ls -la ws/on-1/trace
rm -rf "$WORK"
