#!/bin/bash
# Data-parallel sharding at dp4 in one run (docs/context_parallel.md): each
# data_parallel_sharding_strategy trains the same model on 4 ranks (one thread each, mock data,
# bf16 mixed precision on the CPU) with the last steps profiled, then `analyze trace` splits the
# ranks' time. Prints one Markdown row per strategy: step time and tokens/s (mean over the logged
# steps after the first two), the rank's parameter / gradient / optimizer bytes and the rest of its
# peak, and the communication hidden behind compute, 1 - exposed / total (mean over the ranks).
# Strategies alternate within a round; ROUNDS rounds, figures from the last one printed per round.
#
#   bash benchmarks/sharding/run_dp4.sh [build/src/cli/primus-cli] [work folder] [model (tiny)] [rounds (1)]
# model: tiny (the test model, 8 layers) or any other preset (llama_100M: mbs 1, gbs 8, seq 256).
# VARIANTS (default "no_shard optim optim_grads optim_grads_params"): a strategy with options after
# '+': once (reduce_sharded_grads_once_per_step), keep (torch_fsdp2_reshard_after_forward false),
# noprogress (mpi_progress_interval_us 0); a leading 'old:' runs OLD_CLI (another build, e.g. main's,
# for old-vs-new in one run) with the strategy alone.
set -euo pipefail
CLI=$(realpath "${1:-build/src/cli/primus-cli}")
WORK=${2:-$(mktemp -d /tmp/primus_sharding.XXXXXX)}
MODEL=${3:-tiny}
ROUNDS=${4:-1}
mkdir -p "$WORK"
cd "$WORK"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$MODEL" = tiny ]; then
  SHAPE="num_layers: 8
      micro_batch_size: 2
      global_batch_size: 16
      seq_length: 32
      train_iters: 12"
  PROFILE="--profile_step_start 10 --profile_step_end 12"
else
  SHAPE="micro_batch_size: 1
      global_batch_size: 8
      seq_length: 256
      train_iters: 6"
  PROFILE="--profile_step_start 4 --profile_step_end 6"
fi
cat > exp.yaml <<YAML
work_group: b
user_name: b
exp_name: b
workspace: ws
modules:
  pre_trainer:
    framework: megatron
    model: $MODEL
    overrides:
      $SHAPE
      lr: 1.0e-3
      lr_warmup_iters: 1
      log_interval: 1
      eval_interval: 0
      mock_data: true
      bf16: true
      device: cpu
YAML
echo "| strategy | step (ms) | tokens/s | parameters MiB | gradients MiB | optimizer MiB | rest of peak MiB | comm hidden |"
echo "|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  for V in ${VARIANTS:-no_shard optim optim_grads optim_grads_params}; do
    RUN_CLI=$CLI
    SPEC=$V
    if [ "${V#old:}" != "$V" ]; then RUN_CLI=$(realpath "$OLD_CLI"); SPEC=${V#old:}; fi
    STRATEGY=${SPEC%%+*}
    OPTS=()
    case "+${SPEC#*+}+" in *+once+*) OPTS+=(--reduce_sharded_grads_once_per_step true) ;; esac
    case "+${SPEC#*+}+" in *+keep+*) OPTS+=(--torch_fsdp2_reshard_after_forward false) ;; esac
    case "+${SPEC#*+}+" in *+noprogress+*) OPTS+=(--mpi_progress_interval_us 0) ;; esac
    S=${V//[:+]/_}
    rm -rf "ws/$S"
    "$RUN_CLI" direct --nproc 4 --exp-name "$S" -- train pretrain --config exp.yaml \
      --data_parallel_sharding_strategy "$STRATEGY" "${OPTS[@]}" --profile true $PROFILE --profile_ranks '[0,1,2,3]' \
      > "$S.log" 2>&1 || { echo "$S failed: $WORK/$S.log"; exit 1; }
    "$CLI" direct -- analyze trace "ws/$S" --format json > "$S.analysis.json" 2> "$S.analysis.log"
    python3 - "$S" <<'PY'
import json, sys
s = sys.argv[1]
rows = [json.loads(l) for l in open(f"ws/{s}/metrics.jsonl") if '"lm_loss"' in l]
steady = rows[2:] or rows
ms = sum(r["step_time_ms"] for r in steady) / len(steady)
tps = sum(r["tokens_per_sec"] for r in steady) / len(steady)
last = rows[-1]
mib = lambda k: last[k] / 2**20
t = json.load(open(f"{s}.analysis.json"))["timeline"]  # the mean over the ranks
comm, exposed = t["total_comm_ms"], t["exposed_comm_ms"]
hidden = f"{100 * (1 - exposed / comm):.0f}%" if comm > 0 else "-"
rest = (last["peak_memory_bytes"] - last["memory_parameters_bytes"] - last["memory_gradients_bytes"]
        - last["memory_optimizer_bytes"]) / 2**20
print(f"| {s} | {ms:.1f} | {tps:.0f} | {mib('memory_parameters_bytes'):.2f} | {mib('memory_gradients_bytes'):.2f} "
      f"| {mib('memory_optimizer_bytes'):.2f} | {rest:.2f} | {hidden} |")
PY
  done
done
