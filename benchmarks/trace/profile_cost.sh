#!/bin/bash
# The cost of profiling (docs/profiling.md): the same 16-step training run with profiling off,
# on with the window outside the measured steps (the decorators installed; each call costs a
# branch), and on with every step traced, alternated ROUNDS times in one session. Prints, per
# mode, the median step time of steps 3-14 (metrics.jsonl's step_time_ms) and the median CPU
# time (user + system, all ranks) of the whole run, and their ratios to profiling off. The CPU
# time is the steadier figure on a shared machine: other users' work lengthens the wall time of a
# step but not the CPU time the run itself spends.
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
RANKS="[$(seq -s, 0 $((NP - 1)))]"
TIMEFORMAT='%U %S'
for r in $(seq "$ROUNDS"); do
  for mode in off outside traced; do
    extra=()
    [ "$mode" = outside ] && extra=(--profile true --profile_step_start 15 --profile_step_end 16 --profile_ranks "$RANKS")
    [ "$mode" = traced ] && extra=(--profile true --profile_step_start 0 --profile_step_end 16 --profile_ranks "$RANKS")
    { time "$CLI" direct --nproc "$NP" --exp-name "$mode-$r" -- train pretrain --config cost.yaml "${extra[@]}" "$@" \
        > "$mode-$r.log" 2>&1 || { tail -5 "$mode-$r.log"; exit 1; }; } 2> "$mode-$r.cpu"
  done
done
python3 - "$ROUNDS" <<'PY'
import json, statistics, sys
rounds = int(sys.argv[1])
med = statistics.median
def steps(run):
    rows = [json.loads(l) for l in open(f"ws/{run}/metrics.jsonl") if "step_time_ms" in l]
    return [r["step_time_ms"] for r in rows if 3 <= r["iteration"] <= 14]
def cpu(run):
    u, s = open(f"{run}.cpu").read().split()[:2]
    return float(u) + float(s)
step = {m: med(sum((steps(f"{m}-{r}") for r in range(1, rounds + 1)), [])) for m in ("off", "outside", "traced")}
cpus = {m: med(cpu(f"{m}-{r}") for r in range(1, rounds + 1)) for m in ("off", "outside", "traced")}
print("| profiling | step time, steps 3-14 (ms) | / off | CPU time of the run (s) | / off |")
print("|---|---|---|---|---|")
for m, name in (("off", "off"), ("outside", "on, outside the window"), ("traced", "on, every step traced")):
    print("| %s | %.2f | %.3f | %.2f | %.3f |" % (name, step[m], step[m] / step["off"], cpus[m], cpus[m] / cpus["off"]))
PY
echo "trace of one rank, 16 steps: $(du -h ws/traced-1/trace/rank-0.json | cut -f1)"
rm -rf "$WORK"
