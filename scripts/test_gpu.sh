#!/usr/bin/env bash
# The GPU test suite (tests/gpu): every CUDA kernel against its CPU reference, the CUDA backend
# against the reference backend, NCCL, and the bf16 model and trainer on the GPU. It needs an
# NVIDIA GPU; CI has none, so `bash scripts/test.sh` builds these tests and they skip themselves.
#
#   bash scripts/test_gpu.sh                      # set up and build (scripts/setup.sh), then run
#   bash scripts/test_gpu.sh --bundle DIR[.tar.xz]  # run a build made elsewhere by scripts/gpu_bundle.sh
#   bash scripts/test_gpu.sh ... -- --gtest_filter='*Flash*'   # arguments after -- go to the tests
#
# Exits non-zero when there is no GPU, when any case fails, or when any case skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "test_gpu: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test_gpu: no NVIDIA GPU here (nvidia-smi -L fails): nothing to test" >&2
  exit 1
fi
if [[ -n "$BUNDLE" ]]; then
  if [[ "$BUNDLE" == *.tar.xz ]]; then
    tmp=$(mktemp -d)
    tar -C "$tmp" -xJf "$BUNDLE"
    BUNDLE="$tmp/$(basename "$BUNDLE" .tar.xz)"
  fi
  [[ -x "$BUNDLE/bin/test_gpu" ]] || { echo "test_gpu: $BUNDLE/bin/test_gpu is missing" >&2; exit 1; }
  # The bundle carries its non-CUDA libraries; cuBLASLt and NCCL come from this machine: the CUDA
  # toolkit, or the nvidia-* Python wheels that PyTorch installs.
  libs="$BUNDLE/lib:/usr/local/cuda/lib64"
  for py in python3 /usr/bin/python3; do
    d=$("$py" - 2>/dev/null <<'PY' || true
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "*", "lib", "lib*.so*"))})))
PY
)
    [[ -n "$d" ]] && { libs="$libs:$d"; break; }
  done
  export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
  export PRIMUS_CONFIG_DIR=${PRIMUS_CONFIG_DIR:-$PWD/configs}  # the model presets of this checkout
  TEST="$BUNDLE/bin/test_gpu"
else
  bash scripts/setup.sh
  TEST=build/tests/gpu/test_gpu
  [[ -x "$TEST" ]] || { echo "test_gpu: build/ has no GPU tests: nvcc was not found when it was configured" >&2; exit 1; }
fi
log=$(mktemp)
set +e
"$TEST" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if grep -q "^\[  SKIPPED \]" "$log"; then
  echo "test_gpu: some cases skipped (see above): the GPU was not usable" >&2
  exit 1
fi
exit "$status"
