# configs/envs/CPU.sh: no GPU found. Ranks share the cores (base.sh) and talk through OpenMPI's
# shared-memory transport, so OpenMPI's network components are left out: they only slow each
# launch (the InfiniBand BTL probes; the libfabric BTL sleeps a second in MPI_Finalize; the
# PSM/PSM2 MTLs pause looking for Omni-Path hardware; docs/cli.md has the figures). On a CPU
# cluster whose ranks do use libfabric or Omni-Path, export your own values: a value set is kept.
export OMPI_MCA_btl=${OMPI_MCA_btl:-^openib,ofi}
export OMPI_MCA_mtl=${OMPI_MCA_mtl:-^ofi,psm,psm2}
