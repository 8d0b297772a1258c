#!/usr/bin/env bash
# The in-flight watch and restarts under a real local Slurm (issue 37), and clean exits before a
# job's end:
#   1. slurm srun -n 2 --max-restarts 1, rank 1 killed at iteration 7: the watch names it from srun's
#      report alone (the ranks treated as on other nodes), restarts from checkpoint 4, and the run
#      ends with the loss of an uninterrupted one;
#   2. slurm srun, rank 0 stalled: the hang is detected, rank 0's stack dumped, exit code 124 (and
#      again as if the ranks were on other nodes: the stack comes through scancel --signal=USR1);
#   3. slurm srun -t 1 with exit_duration_in_mins 0.05: a checkpoint before the limit, exit 0;
#   4. exit_signal_handler: scancel --signal=TERM (what Slurm sends at the time limit): a
#      checkpoint of the iteration reached, exit 0;
#   5. slurm sbatch --wait --max-restarts 1, rank 1 killed: the job's watched srun restarts it,
#      the job COMPLETES.
# Exit 77 (skipped) when not root or Slurm is absent.
set -euo pipefail
cli=${1:?usage: test_slurm_watch.sh PRIMUS_CLI}
here=$(cd "$(dirname "$0")" && pwd)
[[ $(id -u) == 0 ]] || { echo "skip: Slurm test needs root"; exit 77; }
for p in munged slurmctld slurmd srun sbatch scancel; do command -v $p >/dev/null || { echo "skip: no $p"; exit 77; }; done

work=$(mktemp -d /tmp/primus-slurm-watch.XXXXXX)
chmod 755 "$work"
cleanup() { "$here/stop_slurm.sh" "$work/slurm"; rm -rf "$work"; }
trap cleanup EXIT
export SLURM_CONF
SLURM_CONF=$("$here/start_slurm.sh" "$work/slurm")
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

cat > exp.yaml <<YAML
exp_name: base
workspace: $work/ws
modules:
  pre_trainer:
    model: tiny
    overrides:
      num_layers: 1
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 32
      train_iters: 12
      lr: 3.0e-3
      lr_warmup_iters: 2
      log_interval: 1
      eval_interval: 0
      save_interval: 4
      mock_data: true
YAML
srun_train() {  # name, extra srun/primus-cli flags..., then -- and task overrides
  local name=$1; shift
  timeout 150 "$cli" slurm srun -N 1 -n 2 --workspace "$work/ws" --exp-name "$name" "$@"
}
# The last lm_loss of iteration $2 in run $1's metrics.jsonl.
loss_at() { $py -c "import json,sys
rows=[json.loads(l) for l in open('$work/ws/$1/metrics.jsonl') if '\"lm_loss\"' in l]
print(repr([r['lm_loss'] for r in rows if r['iteration']==$2][-1]))"; }
events_of() { grep "\"kind\":\"$2\"" "$work/ws/$1/events.jsonl" || true; }

echo "== 1. uninterrupted, then rank 1 killed at iteration 7 with --max-restarts 1"
srun_train ref -- train pretrain --config exp.yaml > ref.out 2>&1 || { cat ref.out; fail "reference run exited $?"; }
# As if the ranks were on other nodes: the launcher knows rank 1 died from srun's report alone.
out=$(PRIMUS_FAULT_REMOTE_RANKS=1 PRIMUS_FAULT_KILL="rank=1,iteration=7" srun_train killed --max-restarts 1 -- \
      train pretrain --config exp.yaml 2>&1) ||
  { echo "$out"; fail "the killed run did not recover"; }
restart=$(events_of killed restart)
[[ -n $restart ]] || { echo "$out"; fail "no restart event"; }
grep -q '"reason":"rank_died"' <<<"$restart" || fail "restart not for a dead rank: $restart"
grep -q '"ranks":\[1\]' <<<"$restart" || fail "restart does not name rank 1: $restart"
grep -q '"nodes":\["'"$(hostname -s)"'"\]' <<<"$restart" || fail "restart does not name rank 1's node: $restart"
grep -q "resumed from .*iter_0000004" "$work/ws/killed/logs/rank-0.log" || fail "no resume from checkpoint 4"
[[ $(loss_at ref 12) == "$(loss_at killed 12)" ]] || fail "loss at 12: $(loss_at killed 12) vs uninterrupted $(loss_at ref 12)"
echo "loss at iteration 12: $(loss_at killed 12), as uninterrupted"

echo "== 2. rank 0 stalled at iteration 5: a hang, its stack, exit code 124"
set +e
out=$(PRIMUS_FAULT_STALL="rank=0,iteration=5" srun_train stalled --hang-timeout 3 -- train pretrain --config exp.yaml 2>&1)
rc=$?
set -e
[[ $rc == 124 ]] || { echo "$out"; fail "a hang must exit 124, got $rc"; }
hang=$(events_of stalled hang)
# Rank 1 waits for rank 0 in a collective: both may be named, rank 0 first.
grep -q '"ranks":\[0[],]' <<<"$hang" || fail "hang event does not name rank 0: $hang"
stack="$work/ws/stalled/watch/stacks_attempt1_rank0.txt"
[[ -s $stack ]] || fail "no stack dump"
grep -q "begin_step" "$stack" || { head -40 "$stack"; fail "the stack does not show where rank 0 stalled"; }
# The job was cancelled; slurmd may still show it completing (CG) for a moment: give it 30 s.
for _ in $(seq 60); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.5; done
[[ -z $(squeue -h 2>/dev/null) ]] || fail "a job is still queued 30 s after the hang: $(squeue)"

echo "== 2b. the same, as if the ranks were on other nodes: the stack is asked for through scancel"
set +e
out=$(PRIMUS_FAULT_REMOTE_RANKS=1 PRIMUS_FAULT_STALL="rank=0,iteration=5" srun_train remote --hang-timeout 3 -- \
      train pretrain --config exp.yaml 2>&1)
rc=$?
set -e
[[ $rc == 124 ]] || { echo "$out"; fail "a hang must exit 124, got $rc"; }
dump=$(events_of remote stack_dump | head -1)
grep -q 'scancel --signal=USR1' <<<"$dump" || fail "the stack was not asked for through Slurm: $dump"
# The rank's own handler (no gdb on another node): its main thread's frames, without symbol names.
grep -q "stack of the main thread" "$work/ws/remote/watch/stacks_attempt1_rank0.txt" || fail "no stack from rank 0's handler"
grep -q "nanosleep" "$work/ws/remote/watch/stacks_attempt1_rank0.txt" || fail "the remote stack does not show rank 0 stalled in its sleep"

echo "== 3. a 1-minute job with exit_duration_in_mins 0.05: saves and exits 0 long before"
t0=$(date +%s)
out=$(srun_train timed -t 1 -- train pretrain --config exp.yaml --train_iters 100000 --save_interval 0 \
      --exit_duration_in_mins 0.05 2>&1) || { echo "$out"; fail "exit_duration_in_mins run exited $?"; }
elapsed=$(( $(date +%s) - t0 ))
(( elapsed < 50 )) || fail "took ${elapsed}s: not before the 1-minute limit"
grep -q "exiting after iteration [0-9]*: .*minutes passed" "$work/ws/timed/logs/rank-0.log" || fail "no exit line"
ls -d "$work/ws/timed/checkpoints/iter_"* >/dev/null || fail "no checkpoint saved before exiting"
echo "exited after ${elapsed}s with $(ls -d "$work"/ws/timed/checkpoints/iter_*)"

echo "== 4. exit_signal_handler: SIGTERM from Slurm saves and exits 0"
srun_train signalled -- train pretrain --config exp.yaml --train_iters 100000 --save_interval 0 \
  --exit_signal_handler true > signalled.out 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -q '"iteration": *[3-9]\|"iteration":[3-9]\|"iteration":[1-9][0-9]' "$work/ws/signalled/metrics.jsonl" 2>/dev/null && break
  sleep 0.1
done
job=$(squeue -h -o %i | head -1)
[[ -n $job ]] || { cat signalled.out; fail "no job to signal"; }
scancel --signal=TERM "$job"
set +e
wait $pid
rc=$?
set -e
[[ $rc == 0 ]] || { cat signalled.out; fail "a SIGTERM'd job with exit_signal_handler must exit 0, got $rc"; }
grep -q "exiting after iteration [0-9]*: received SIGTERM" "$work/ws/signalled/logs/rank-0.log" || fail "no exit line"
it=$(sed -n 's/.*exiting after iteration \([0-9]*\):.*/\1/p' "$work/ws/signalled/logs/rank-0.log" | head -1)
[[ -d $work/ws/signalled/checkpoints/iter_$(printf %07d "$it") ]] || fail "no checkpoint of iteration $it"
echo "saved iteration $it after SIGTERM"

echo "== 5. slurm sbatch --wait --max-restarts 1: rank 1 killed, the job's watched srun restarts it"
out=$(PRIMUS_FAULT_KILL="rank=1,iteration=7" timeout 180 "$cli" slurm sbatch -N 1 -n 2 --wait --max-restarts 1 \
      --workspace "$work/ws" --exp-name batch -- train pretrain --config exp.yaml 2>&1) || { echo "$out"; cat "$work"/ws/batch/logs/slurm-*.out; fail "sbatch exited $?"; }
job=$(sed -n 's/^submitted batch job \([0-9]*\).*/\1/p' <<<"$out")
[[ -n $(events_of batch restart) ]] || { cat "$work/ws/batch/logs/slurm-$job.out"; fail "no restart in the batch job"; }
[[ $(loss_at ref 12) == "$(loss_at batch 12)" ]] || fail "batch loss at 12 differs from the uninterrupted run"
for _ in $(seq 20); do grep -q "JobId=$job " "$work/slurm/log/jobcomp.txt" 2>/dev/null && break; sleep 0.5; done
grep "JobId=$job " "$work/slurm/log/jobcomp.txt" | grep -q "JobState=COMPLETED" || fail "job $job not COMPLETED"
echo "PASS"
