#!/usr/bin/env bash
# The whole test suite: set-up and build (scripts/setup.sh), then every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j "${PRIMUS_TEST_JOBS:-2}" "$@"
