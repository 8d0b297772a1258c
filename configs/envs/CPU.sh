# configs/envs/CPU.sh: no GPU found. Ranks share the cores (base.sh); OpenMPI's shared-memory
# transport carries the collectives, so nothing network-related is set.
# Skip OpenMPI's InfiniBand probing (warnings and slow start-up on machines without it).
export OMPI_MCA_btl=${OMPI_MCA_btl:-^openib}
