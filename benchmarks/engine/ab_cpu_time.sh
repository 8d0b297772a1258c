#!/usr/bin/env bash
# Two builds of bench_engine, one thread each, alternating rounds: user CPU seconds of the same
# run (less sensitive than wall time to other processes on a shared machine).
#   OLD=/path/to/old/build/benchmarks/engine/bench_engine [NEW=...] [MODEL= MBS= SEQ= ITERS= ROUNDS=] \
#     benchmarks/engine/ab_cpu_time.sh
set -euo pipefail
: "${OLD:?set OLD to the bench_engine binary to compare against}"
NEW=${NEW:-build/benchmarks/engine/bench_engine}
model=${MODEL:-llama2c_15M}; mbs=${MBS:-8}; seq=${SEQ:-256}; iters=${ITERS:-3}
for r in $(seq ${ROUNDS:-3}); do
  for which in old new; do
    bin=$OLD; [ $which = new ] && bin=$NEW
    t=$( { OMP_NUM_THREADS=1 /usr/bin/time -f "%U" $bin --model $model --micro-batch-size $mbs --seq-length $seq --iters $iters --warmup 1 --no-torch >/dev/null; } 2>&1 | tail -1)
    echo "round $r $which $model user_s $t"
  done
done
