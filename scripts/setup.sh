#!/usr/bin/env bash
# Installs what Primus needs on a fresh Debian 12 machine (apt, plus npm for test oracles) and
# builds it into build/. Safe to run again: it installs only what is missing and rebuilds
# incrementally. Set PRIMUS_SKIP_APT=1 to skip the package step.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-openmp-dev libopenmpi-dev openmpi-bin
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libsentencepiece-dev sentencepiece libpcre2-dev
  libicu-dev  # Unicode normalization (NFC, NFKC) for tokenizer.json normalizers
  libgtest-dev libgmock-dev libbenchmark-dev
  slurm-wlm munge gdb
  fortunes-min fortunes
  python3-torch zlib1g-dev
  coinor-libcbc-dev  # CBC: zb-auto's ILP refinement (the Zero Bubble paper's solver)
  clang libclang-rt-14-dev libomp-dev  # libFuzzer for the parsers' fuzz targets
  clang-format  # .clang-format: `git clang-format` on the lines a change touches
  libdnnl-dev  # oneDNN: one of the CPU bf16 backend's two GEMMs, the one on AMX tiles
  librsvg2-bin  # rsvg-convert: `analyze run` pictures as PNG beside the SVG
  python3-protobuf python3-crc32c  # the tests' independent reader of TensorBoard event files
  python3-jinja2  # the chat template oracle: Python's Jinja2 in Hugging Face's environment
  libnuma-dev  # --numa: each rank bound to its GPU's NUMA node
)
# Tools that may already come from elsewhere (e.g. a Node.js install outside apt): installed from
# Debian only when the command is missing, so that the two never conflict.
declare -A APT_IF_MISSING=([node]=nodejs [npm]=npm)

if [[ "${PRIMUS_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  for cmd in "${!APT_IF_MISSING[@]}"; do
    command -v "$cmd" >/dev/null || missing+=("${APT_IF_MISSING[$cmd]}")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# Test oracles from npm (pinned in tests/oracles/package.json), installed when that file exists and
# again whenever the lock file is newer than the install (npm writes node_modules/.package-lock.json).
if [[ -f tests/oracles/package.json && ( ! -d tests/oracles/node_modules ||
      tests/oracles/package-lock.json -nt tests/oracles/node_modules/.package-lock.json ) ]]; then
  (cd tests/oracles && npm ci --silent --no-audit --no-fund 2>/dev/null || npm install --silent --no-audit --no-fund)
fi

JOBS=${PRIMUS_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
