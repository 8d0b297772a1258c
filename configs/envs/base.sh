# configs/envs/base.sh: environment for every launch, sourced by primus-cli before the device
# preset (configs/envs/<MODEL>.sh). Values only fill what is unset, so a variable exported in your
# shell, a --patch file or --env wins. primus-cli provides PRIMUS_DEVICE (H100, MI300X, CPU...),
# PRIMUS_DEVICE_COUNT and PRIMUS_LOCAL_WORLD_SIZE (ranks on this node) while this runs.
# `primus-cli direct --print-env -- <task>` shows the result and where each value came from.

# CPU threads: share the cores between the ranks of this node; OpenBLAS (OpenMP build) follows.
__primus_cores=$(nproc 2>/dev/null || echo 1)
__primus_threads=$(( __primus_cores / ${PRIMUS_LOCAL_WORLD_SIZE:-1} ))
(( __primus_threads < 1 )) && __primus_threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$__primus_threads}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}
# No OMP_PROC_BIND/OMP_PLACES here: with binding on, libgomp pins the main thread to the first
# core at start-up, every std::thread it creates inherits that one core (data preprocess workers
# ran serially), and ranks sharing a node all pile onto the same cores.
unset __primus_cores __primus_threads

# Collectives: warnings only by default; set NCCL_DEBUG=INFO when chasing a hang.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Megatron's communication/computation overlap needs kernels issued in order on one queue.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
# Report collective errors instead of hanging until the watchdog.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
