#!/bin/bash
# Projection against measurement on this machine (docs/profiling.md): each layout of the grid is
# trained for a few steps (one thread per rank, mock data), then projected with `projection both`
# on this machine's CPU by as many ranks as the training had, measuring at the same time (each op
# timed here while the cores are shared as in training, the link between the ranks measured by
# all-reduces; MoE rows routed by the run's measured tokens per expert, --router-load); prints the
# Markdown table of the docs. The machine is shared: the grid is run
# ROUNDS times, layout after layout, and each figure is the median over the rounds (the spread of
# the step-time errors over the rounds is printed beside it).
#
#   bash benchmarks/projection/run_grid.sh [build/src/cli/primus-cli] [work folder] [rounds (3)]
# ONLY=<regex> runs the rows whose name matches (e.g. ONLY='^cp2').
set -euo pipefail
CLI=$(realpath "${1:-build/src/cli/primus-cli}")
WORK=${2:-$(mktemp -d /tmp/primus_grid.XXXXXX)}
ROUNDS=${3:-3}
mkdir -p "$WORK"
cd "$WORK"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat > grid.yaml <<'YAML'
work_group: grid
user_name: grid
exp_name: grid
workspace: ws
modules:
  pre_trainer:
    framework: megatron
    model: tiny_llama
    overrides:
      micro_batch_size: 4
      global_batch_size: 16
      seq_length: 128
      train_iters: 16
      lr: 1.0e-3
      log_interval: 1
      eval_interval: 0
      mock_data: true
YAML
sed 's/model: tiny_llama/model: tiny_mixtral/' grid.yaml > grid_moe.yaml
sed 's/model: tiny_llama/model: tiny_moe/' grid.yaml > grid_mla.yaml

# name | ranks | overrides [| config, default grid.yaml]
GRID=(
  "one process|1|"
  "one process, selective recompute|1|--recompute_granularity selective"
  "one process, full recompute|1|--recompute_granularity full"
  "dp2|2|"
  "dp2, distributed optimizer|2|--use_distributed_optimizer true"
  "dp4, FSDP|4|--data_parallel_sharding_strategy optim_grads_params"
  "tp2|2|--tensor_model_parallel_size 2"
  "tp2, sequence parallel|2|--tensor_model_parallel_size 2 --sequence_parallel true"
  "pp2 1f1b|2|--pipeline_model_parallel_size 2 --pipeline_schedule 1f1b"
  "pp2 zb-h1|2|--pipeline_model_parallel_size 2 --pipeline_schedule zb-h1"
  "pp2 1f1b, full recompute|2|--pipeline_model_parallel_size 2 --pipeline_schedule 1f1b --recompute_granularity full"
  "cp2 p2p|2|--context_parallel_size 2"
  "cp2 a2a|2|--context_parallel_size 2 --cp_comm_type a2a"
  "MoE (tiny_mixtral), one process|1||grid_moe.yaml"
  "MoE (tiny_mixtral), dp2|2||grid_moe.yaml"
  "MoE (tiny_mixtral) balanced, one process|1|--moe_router_force_load_balancing true|grid_moe.yaml"
  "MoE (tiny_mixtral) balanced, dp2|2|--moe_router_force_load_balancing true|grid_moe.yaml"
  "MoE (tiny_mixtral) balanced, ep2 alltoall|2|--moe_router_force_load_balancing true --expert_model_parallel_size 2 --moe_token_dispatcher_type alltoall|grid_moe.yaml"
  "MoE (tiny_mixtral), ep2 alltoall|2|--expert_model_parallel_size 2 --moe_token_dispatcher_type alltoall|grid_moe.yaml"
  "MoE (tiny_mixtral) balanced, tp2 etp2|2|--moe_router_force_load_balancing true --tensor_model_parallel_size 2|grid_moe.yaml"
  "MoE (tiny_mixtral) balanced, tp2 etp1|2|--moe_router_force_load_balancing true --tensor_model_parallel_size 2 --expert_tensor_parallel_size 1|grid_moe.yaml"
  "MoE (tiny_mixtral) balanced, tp2 etp2, sequence parallel|2|--moe_router_force_load_balancing true --tensor_model_parallel_size 2 --sequence_parallel true|grid_moe.yaml"
  "MoE (tiny_mixtral) balanced, tp2 etp1, sequence parallel|2|--moe_router_force_load_balancing true --tensor_model_parallel_size 2 --sequence_parallel true --expert_tensor_parallel_size 1|grid_moe.yaml"
  "MLA + MoE (tiny_moe), one process|1||grid_mla.yaml"
  "MLA + MoE (tiny_moe), tp2|2|--tensor_model_parallel_size 2|grid_mla.yaml"
)

rm -f results.jsonl
for round in $(seq "$ROUNDS"); do
for row in "${GRID[@]}"; do
  IFS='|' read -r name np ov cfg <<< "$row"
  cfg=${cfg:-grid.yaml}
  if [ -n "${ONLY:-}" ] && ! [[ "$name" =~ $ONLY ]]; then continue; fi
  rm -rf ws
  # shellcheck disable=SC2086
  "$CLI" direct --nproc "$np" -- train pretrain --config "$cfg" $ov > train.log 2>&1 || { echo "$name: training failed" >&2; tail -3 train.log >&2; continue; }
  # MoE rows route by the training run's measured tokens per expert (its metrics.jsonl).
  load=""
  if [ "$cfg" != grid.yaml ]; then load="--router-load ws/grid"; fi
  # shellcheck disable=SC2086
  "$CLI" direct --nproc "$np" -- projection both --config "$cfg" $ov $load --target-nodes 1 --gpus-per-node "$np" \
      --hardware-config CPU --format json > proj.json 2> proj.log || { echo "$name: projection failed" >&2; tail -3 proj.log >&2; continue; }
  python3 - "$name" "$np" "$round" <<'PY'
import json, sys
name, np, rnd = sys.argv[1:4]
rows = [json.loads(l) for l in open("ws/grid/metrics.jsonl") if "step_time_ms" in l]
steps = sorted(r["step_time_ms"] for r in rows[3:])  # the first steps warm up
p = json.load(open("proj.json"))
hw = p["hardware"]
out = {"name": name, "ranks": int(np), "round": int(rnd), "measured_ms": steps[len(steps) // 2],
       "projected_ms": p["performance"]["step_time_ms"],
       "measured_peak": rows[-1]["peak_memory_bytes"],  # rank 0's
       "projected_peak": p["per_rank"][0]["peak_bytes"],  # pipeline rank 0, which rank 0 is
       "link_us": hw["link_latency_us"], "link_gbs": hw["link_gbs"]}
open("results.jsonl", "a").write(json.dumps(out) + "\n")
PY
done
done
python3 - <<'PY'
import json, statistics
res = [json.loads(l) for l in open("results.jsonl")]
names = list(dict.fromkeys(r["name"] for r in res))
med = statistics.median
print("| layout | ranks | measured step (ms) | projected step (ms) | error | error per round | measured peak (MiB) | projected peak (MiB) | error | link (measured by the projection) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    rs = [r for r in res if r["name"] == n]
    m, p = med(r["measured_ms"] for r in rs), med(r["projected_ms"] for r in rs)
    per = ", ".join("%+.0f%%" % (100 * (r["projected_ms"] - r["measured_ms"]) / r["measured_ms"]) for r in rs)
    mp, pp = med(r["measured_peak"] for r in rs), med(r["projected_peak"] for r in rs)
    link = "%.1f us, %.2f GB/s" % (med(r["link_us"] for r in rs), med(r["link_gbs"] for r in rs)) if rs[0]["ranks"] > 1 else "-"
    print("| %s | %d | %.1f | %.1f | %+.1f%% | %s | %.2f | %.2f | %+.1f%% | %s |" %
          (n, rs[0]["ranks"], m, p, 100 * (p - m) / m, per, mp / 2**20, pp / 2**20, 100 * (pp - mp) / mp, link))
PY
