# configs/envs/MI250X.sh: AMD Instinct MI250X (sourced after base.sh; values only fill what is unset).
# Each MI250X is two GCDs, each seen as its own GPU. RCCL reads NCCL_* names.
export HSA_ENABLE_SDMA=${HSA_ENABLE_SDMA:-0}
export HSA_FORCE_FINE_GRAIN_PCIE=${HSA_FORCE_FINE_GRAIN_PCIE:-1}
export GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2}
export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-3}
export TORCH_NCCL_HIGH_PRIORITY=${TORCH_NCCL_HIGH_PRIORITY:-1}
