#!/usr/bin/env bash
# A real Slurm for primus-cli: starts munged + slurmctld + slurmd in a private folder, runs
#   primus-cli slurm srun -N 1 -n 2 -- info ranks     (ranks 0 and 1 must report)
#   primus-cli slurm sbatch -N 1 -n 2 --wait -- info ranks   (the job must complete)
# and always stops the daemons it started. Exit 77 (skipped) when not root or Slurm is absent.
set -euo pipefail
cli=${1:?usage: test_slurm.sh PRIMUS_CLI}
here=$(cd "$(dirname "$0")" && pwd)
[[ $(id -u) == 0 ]] || { echo "skip: Slurm test needs root"; exit 77; }
for p in munged slurmctld slurmd srun sbatch; do command -v $p >/dev/null || { echo "skip: no $p"; exit 77; }; done

work=$(mktemp -d /tmp/primus-slurm-test.XXXXXX)
chmod 755 "$work"  # munged (user munge) lives below it
cleanup() { "$here/stop_slurm.sh" "$work/slurm"; rm -rf "$work"; }
trap cleanup EXIT
export SLURM_CONF
SLURM_CONF=$("$here/start_slurm.sh" "$work/slurm")
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== srun"
out=$(timeout 60 "$cli" slurm srun -N 1 -n 2 --workspace "$work/ws" --exp-name srun1 -- info ranks 2>&1) || fail "srun exited $?: $out"
echo "$out"
grep -q "^rank=0 local_rank=0 world_size=2 .*launcher=slurm" <<<"$out" || fail "rank 0 did not report"
grep -q "^rank=1 local_rank=1 world_size=2 .*launcher=slurm" <<<"$out" || fail "rank 1 did not report"
[[ -f $work/ws/srun1/logs/rank-0.log && -f $work/ws/srun1/logs/rank-1.log ]] || fail "per-rank logs missing"
grep -q "r1/2\] \[info\] rank=1" "$work/ws/srun1/logs/rank-1.log" || fail "rank-1.log lacks rank 1's line"
[[ -f $work/ws/srun1/snapshot/metadata.json ]] || fail "no snapshot"
# Rank 0 rewrote system.json on its node: it names the Slurm job.
grep -q '"job_id"' "$work/ws/srun1/snapshot/system.json" || fail "system.json not updated by rank 0"

echo "== srun, failing task"
if timeout 60 "$cli" slurm srun -N 1 -n 2 --workspace "$work/ws" --exp-name srun2 -- info config --config /nonexistent.yaml >/dev/null 2>&1; then
  fail "a failing task must make srun fail"
fi

echo "== sbatch"
out=$(timeout 90 "$cli" slurm sbatch -N 1 -n 2 --wait --workspace "$work/ws" --exp-name batch1 -- info ranks 2>&1) || fail "sbatch exited $?: $out"
echo "$out"
job=$(sed -n 's/^submitted batch job \([0-9]*\).*/\1/p' <<<"$out")
[[ -n $job ]] || fail "no job id in: $out"
log="$work/ws/batch1/logs/slurm-$job.out"
[[ -f $log ]] || fail "no job output $log"
cat "$log"
grep -q "^rank=0 .*world_size=2" "$log" || fail "job output lacks rank 0"
grep -q "^rank=1 .*world_size=2" "$log" || fail "job output lacks rank 1"
[[ -x $work/ws/batch1/sbatch.sh ]] || fail "batch script not kept in the run folder"
# The job left the queue and finished cleanly (jobcomp/filetxt records it).
for _ in $(seq 20); do grep -q "JobId=$job " "$work/slurm/log/jobcomp.txt" 2>/dev/null && break; sleep 0.5; done
grep "JobId=$job " "$work/slurm/log/jobcomp.txt" | grep -q "JobState=COMPLETED" || fail "job $job not COMPLETED: $(cat "$work/slurm/log/jobcomp.txt" 2>/dev/null)"
[[ -z $(squeue -h -j "$job" 2>/dev/null) ]] || fail "job $job still queued"
echo "PASS"
