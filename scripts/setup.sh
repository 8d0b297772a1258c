#!/usr/bin/env bash
# Installs what Primus needs on a fresh Debian 12 machine and builds it into build/. Safe to run
# again: it installs only what is missing and rebuilds incrementally. Set PRIMUS_SKIP_APT=1 to skip
# the package step.
#
#   bash scripts/setup.sh          everything: primus-cli, every test, fuzz replay and benchmark,
#                                  with their packages (scripts/test.sh runs this)
#   bash scripts/setup.sh --main   primus-cli only, with only the packages it needs to build and run
#                                  (scripts/quickstart.sh runs this)
set -euo pipefail
cd "$(dirname "$0")/.."

main_only=0
case "${1:-}" in
  --main) main_only=1 ;;
  "") ;;
  *) echo "setup.sh: unknown option $1 (--main: primus-cli only)" >&2; exit 2 ;;
esac

# What primus-cli needs to build and to run the quick start (the demo corpus included).
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-openmp-dev libopenmpi-dev openmpi-bin
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libsentencepiece-dev sentencepiece libpcre2-dev
  libicu-dev  # Unicode normalization (NFC, NFKC) for tokenizer.json normalizers
  zlib1g-dev
  libisal-dev  # ISA-L: the checkpoints' CRC-32 (src/checkpoint/format.cpp)
  coinor-libcbc-dev  # CBC: zb-auto's ILP refinement (the Zero Bubble paper's solver)
  libdnnl-dev  # oneDNN: one of the CPU bf16 backend's two GEMMs, the one on AMX tiles
  libnuma-dev  # --numa: each rank bound to its GPU's NUMA node
  fortunes-min fortunes  # the quick start's demo corpus (scripts/prepare_demo_data.sh)
)
# What the tests, the fuzzers and the benchmarks need besides.
TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  slurm-wlm munge gdb  # a real local Slurm for the integration tests; gdb for the watch's hang dumps
  python3-torch  # the PyTorch peer: tests/oracles/hf_llama_peer.py (test_hf) and benchmarks/engine, cuda
  clang libclang-rt-14-dev libomp-dev  # libFuzzer for the parsers' fuzz targets
  clang-format  # .clang-format: `git clang-format` on the lines a change touches
  librsvg2-bin  # rsvg-convert: `analyze run` pictures as PNG beside the SVG
  python3-protobuf python3-crc32c  # the tests' independent reader of TensorBoard event files
  python3-jinja2  # the chat template oracle: Python's Jinja2 in Hugging Face's environment
)
# Tools that may already come from elsewhere (e.g. a Node.js install outside apt): installed from
# Debian only when the command is missing, so that the two never conflict. The tests' oracles only.
declare -A APT_IF_MISSING=([node]=nodejs [npm]=npm)
if ((main_only)); then
  APT_IF_MISSING=()
else
  APT_PACKAGES+=("${TEST_PACKAGES[@]}")
fi

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
if ((!main_only)) && [[ -f tests/oracles/package.json && ( ! -d tests/oracles/node_modules ||
      tests/oracles/package-lock.json -nt tests/oracles/node_modules/.package-lock.json ) ]]; then
  (cd tests/oracles && npm ci --silent --no-audit --no-fund 2>/dev/null || npm install --silent --no-audit --no-fund)
fi

# One build folder for both: --main configures it without the tests and benchmarks and builds
# primus-cli alone; the full set-up turns them back on and builds everything. Both compile the
# modules in unity batches (PRIMUS_UNITY_BUILD, CMakeLists.txt): a fresh build in less CPU time.
JOBS=${PRIMUS_JOBS:-$(nproc)}
if ((main_only)); then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPRIMUS_UNITY_BUILD=ON -DPRIMUS_BUILD_TESTS=OFF -DPRIMUS_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build build -j "$JOBS" --target primus-cli
else
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPRIMUS_UNITY_BUILD=ON -DPRIMUS_BUILD_TESTS=ON -DPRIMUS_BUILD_BENCHMARKS=ON >/dev/null
  cmake --build build -j "$JOBS"
fi
