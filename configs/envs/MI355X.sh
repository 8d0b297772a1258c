# configs/envs/MI355X.sh: AMD Instinct MI355X (sourced after base.sh; values only fill what is unset).
# RCCL reads NCCL_* names. Settings from AMD's MI300-series training guides:
# keep scratch memory between kernels (reclaiming it stalls long runs),
export HSA_NO_SCRATCH_RECLAIM=${HSA_NO_SCRATCH_RECLAIM:-1}
# use the SDMA engines for copies so compute units stay on kernels,
export HSA_ENABLE_SDMA=${HSA_ENABLE_SDMA:-1}
# kernel arguments in device memory (lower launch latency),
export HIP_FORCE_DEV_KERNARG=${HIP_FORCE_DEV_KERNARG:-1}
# two hardware queues per process: enough for compute + communication overlap,
export GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2}
# RCCL collectives at high stream priority, without per-call checks.
export TORCH_NCCL_HIGH_PRIORITY=${TORCH_NCCL_HIGH_PRIORITY:-1}
export NCCL_CHECKS_DISABLE=${NCCL_CHECKS_DISABLE:-1}
export NCCL_IB_GID_INDEX=${NCCL_IB_GID_INDEX:-3}
export NCCL_CROSS_NIC=${NCCL_CROSS_NIC:-0}
export RCCL_MSCCL_ENABLE=${RCCL_MSCCL_ENABLE:-0}
