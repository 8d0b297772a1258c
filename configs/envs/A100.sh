# configs/envs/A100.sh: NVIDIA A100 (sourced after base.sh; values only fill what is unset).
# No NVLink SHARP (NVLS) on Ampere; InfiniBand with GPUDirect RDMA across nodes.
export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-22}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-LAZY}
# Transformer Engine's fused attention is for Hopper; flash attention serves Ampere.
export NVTE_FUSED_ATTN=${NVTE_FUSED_ATTN:-0}
export NVTE_FLASH_ATTN=${NVTE_FLASH_ATTN:-1}
