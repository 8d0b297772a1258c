#!/usr/bin/env bash
# Kill -9 inside a checkpoint save, on each of two ranks, then restart: every trial must resume
# and end with final weights bit-identical to an uninterrupted run (docs/stability.md).
#
#   bash benchmarks/safe/kill_in_save.sh [TRIALS (20)] [PRIMUS_CLI (build/src/cli/primus-cli)]
#   ASYNC=1 bash benchmarks/safe/kill_in_save.sh ...   the killed runs save with async_save true
#   FSDP=1 bash benchmarks/safe/kill_in_save.sh ...    four ranks under FSDP (optim_grads_params),
#                                                      each writing its own part of every tensor
#
# With ASYNC=1 the kill lands in the rank's background write (shard, half) or in the publication
# of the checkpoint at a later step (meta, renamed); the reference stays synchronous, so every
# trial also checks that async saves leave the state bit-identical.
# Two ranks with tensor parallelism 2 (FSDP=1: four data-parallel ranks under FSDP), so that every
# rank writes a shard of every checkpoint; a save every 2 iterations of 12. Trial i kills rank i % ranks (SIGKILL, PRIMUS_FAULT_KILL with
# during=checkpoint) at a random save, at a point inside it that cycles through: right after the
# rank's shard file, halfway through it, and on rank 0 after meta.json or after the folder's
# rename (before `latest` moves). The launcher (--max-restarts 1) restarts the job, which resumes
# from the newest checkpoint that verifies. Prints one line per trial and a summary; exits non-zero
# when any trial differs.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
trials="${1:-20}"
cli="${2:-$root/build/src/cli/primus-cli}"
work="$(mktemp -d /tmp/primus_kill_in_save.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
nproc=2
layout="tensor_model_parallel_size: 2"
if [[ "${FSDP:-0}" == 1 ]]; then
  nproc=4
  layout="data_parallel_sharding_strategy: optim_grads_params"
fi
cat > "$work/exp.yaml" <<YAML
exp_name: reference
workspace: $work/ws
modules:
  pre_trainer:
    model: tiny
    overrides:
      num_layers: 2
      micro_batch_size: 2
      global_batch_size: $((2 * nproc))
      seq_length: 32
      train_iters: 12
      lr: 3.0e-3
      lr_warmup_iters: 2
      log_interval: 1
      eval_interval: 0
      save_interval: 2
      keep_last_checkpoints: 2
      $layout
      mock_data: true
YAML
async_flag=()
[[ "${ASYNC:-0}" == 1 ]] && async_flag=(--async_save true)
train() {  # exp_name, extra env...
  local exp="$1"; shift
  local extra=()
  [[ "$exp" != reference ]] && extra=("${async_flag[@]}")
  (cd "$work" && env "$@" "$cli" direct --nproc "$nproc" --max-restarts 1 -- train pretrain --config exp.yaml --exp_name "$exp" \
    "${extra[@]}") >"$work/$exp.log" 2>&1
}
# The final weights (and moments) of each shard: the file past its header, which names the run.
weights() {
  python3 - "$1" <<'PY'
import hashlib, struct, sys
with open(sys.argv[1], "rb") as f:
    b = f.read()
n = struct.unpack_from("<Q", b, 8)[0]
start = (24 + n + 63) // 64 * 64
print(hashlib.sha256(b[start:]).hexdigest())
PY
}
train reference || { echo "the reference run failed:"; tail -20 "$work/reference.log"; exit 1; }
# Every rank's final shard, as one line per rank.
final() {
  local r
  for ((r = 0; r < nproc; r++)); do
    weights "$work/ws/$1/checkpoints/iter_0000012/rank_0000$r.bin" 2>/dev/null || echo missing
  done
}
ref=$(final reference)
points0=(shard half meta renamed)
points1=(shard half)
ok=0
t0=$(date +%s)
for ((i = 0; i < trials; i++)); do
  rank=$((i % nproc))
  if [[ $rank == 0 ]]; then at=${points0[$(((i / nproc) % 4))]}; else at=${points1[$(((i / nproc) % 2))]}; fi
  it=$((2 * (1 + RANDOM % 6)))  # a save: 2, 4, ..., 12 (12 is the final one)
  exp="trial$i"
  status=ok
  resumed=""
  if ! train "$exp" PRIMUS_FAULT_KILL="rank=$rank,iteration=$it,during=checkpoint,at=$at"; then
    status="FAILED (exit code; see below)"
  else
    restarts=$(grep -c '"kind":"restart"' "$work/ws/$exp/events.jsonl" || true)
    got=$(final "$exp")
    resumed=$( (grep -ho "resumed from [^ ]*" "$work/ws/$exp/logs/rank-0.log" || true) | tail -1 | sed 's|.*/||')
    if [[ $restarts != 1 ]]; then status="FAILED ($restarts restarts)";
    elif [[ $got != "$ref" ]]; then status="FAILED (final weights differ)"; fi
  fi
  echo "trial $((i + 1))/$trials: SIGKILL rank $rank at the save of iteration $it (after $at): resumed from ${resumed:-nothing (started over)}; $status"
  if [[ $status == ok ]]; then ok=$((ok + 1)); else tail -15 "$work/$exp.log"; fi
  rm -rf "$work/ws/$exp"
done
echo "kill_in_save${ASYNC:+ (ASYNC=$ASYNC)}${FSDP:+ (FSDP=$FSDP)}: $ok of $trials trials resumed and ended bit-identical to the uninterrupted run ($(($(date +%s) - t0)) s)"
[[ $ok == "$trials" ]]
