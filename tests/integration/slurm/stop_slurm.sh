#!/usr/bin/env bash
# Stops the Slurm started by start_slurm.sh in folder $1, by the pids in its pid files only.
dir=${1:?usage: stop_slurm.sh DIR}
stop() {  # pid file, name
  [[ -f $1 ]] || return 0
  local pid; pid=$(cat "$1")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
  echo "stop_slurm: $2 ($pid) needed SIGKILL" >&2
}
stop "$dir/slurmd.pid" slurmd
stop "$dir/slurmctld.pid" slurmctld
stop "$dir/munge/munged.pid" munged
exit 0
