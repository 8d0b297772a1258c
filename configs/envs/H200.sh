# configs/envs/H200.sh: NVIDIA H200 (sourced after base.sh; values only fill what is unset).
# NVLink/NVSwitch inside the node; InfiniBand with GPUDirect RDMA across nodes.
export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-22}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-1}
export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-LAZY}
# Transformer Engine: fused attention on Hopper and later.
export NVTE_FUSED_ATTN=${NVTE_FUSED_ATTN:-1}
