#!/usr/bin/env bash
# Packs this build's GPU binaries (tests/gpu's test_gpu, primus-cli) with the shared libraries
# they need from Debian (OpenBLAS, OpenMPI, yaml-cpp, fmt, spdlog, sentencepiece, ...) into one
# folder, for a GPU machine that lacks those packages but has a CUDA 13 driver and toolkit (or
# PyTorch's nvidia-* wheels for cuBLASLt and NCCL, which are left out: they are large and the
# GPU machine has its own). Run scripts/setup.sh first (it builds with CUDA when nvcc is found).
#
#   bash scripts/gpu_bundle.sh [DIR]            # default DIR: .gpu-bundle (git-ignored)
#   then, on the GPU machine:  bash scripts/test_gpu.sh --bundle DIR      (or DIR.tar.xz)
# It also writes DIR.tar.xz (about a third of the size: OpenBLAS alone is 35 MB) for a transfer
# with a size limit.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu-bundle}
bins=(build/tests/gpu/test_gpu build/src/cli/primus-cli)
for b in "${bins[@]}"; do
  [[ -x "$b" ]] || { echo "gpu_bundle: $b is missing: build with CUDA first (bash scripts/setup.sh)" >&2; exit 1; }
done
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
cp "${bins[@]}" "$DIR/bin/"
# Every library the binaries load, but the C runtime, the GPU driver and the CUDA libraries the
# GPU machine provides itself.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcublas|libcublasLt|libnccl)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" "$DIR/lib/$name"
done
strip --strip-unneeded "$DIR"/bin/* "$DIR"/lib/* 2>/dev/null || true
tar -C "$(dirname "$DIR")" -cJf "$DIR.tar.xz" "$(basename "$DIR")"
echo "gpu_bundle: $DIR ($(du -sh "$DIR" | cut -f1), $(ls "$DIR/lib" | wc -l) libraries) and $DIR.tar.xz ($(du -sh "$DIR.tar.xz" | cut -f1));"
echo "  on the GPU machine: bash scripts/test_gpu.sh --bundle $DIR.tar.xz"
