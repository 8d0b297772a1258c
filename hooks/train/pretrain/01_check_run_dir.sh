#!/usr/bin/env bash
# Before pretraining: the run folder must be writable and have room for logs and checkpoints,
# or the run would fail at its first checkpoint, hours in.
set -euo pipefail
dir=${PRIMUS_RUN_DIR:?PRIMUS_RUN_DIR is not set (run through primus-cli)}
mkdir -p "$dir"
probe="$dir/.write_test.$$"
: > "$probe" || { echo "run folder $dir is not writable"; exit 1; }
rm -f "$probe"
free_kb=$(df -Pk "$dir" | awk 'NR==2 {print $4}')
min_kb=${PRIMUS_MIN_FREE_KB:-1048576}
if (( free_kb < min_kb )); then
  echo "only $((free_kb / 1024)) MiB free under $dir (need $((min_kb / 1024)) MiB; set PRIMUS_MIN_FREE_KB to change)"
  exit 1
fi
echo "run folder $dir: writable, $((free_kb / 1024)) MiB free"
