#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with AddressSanitizer and UBSan) and runs each one in
# turn for a bounded time, one process each (-jobs=1: the machine is shared), starting from the
# corpus in fuzz/corpus (new inputs go to a working copy in the build folder, not into the repo).
#
#   bash scripts/fuzz.sh [--build DIR] [--seconds N] [--only NAME] [--ci]
#
# Prints one line per target (runs, coverage, corpus size) and exits non-zero on the first crash,
# leak or timeout, whose input libFuzzer writes into DIR/artifacts/. --ci: exit 77 (skipped) when
# clang is not installed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
seconds=600
only=""
ci=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --ci) ci=1; shift ;;
    *) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ is not installed (Debian: clang, libclang-rt-14-dev); libFuzzer runs skipped"
  [[ $ci == 1 ]] && exit 77
  exit 1
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DPRIMUS_FUZZ=ON -DPRIMUS_UNITY_BUILD=ON -DPRIMUS_CUDA=OFF -DPRIMUS_BUILD_TESTS=OFF -DPRIMUS_BUILD_BENCHMARKS=OFF "${launcher[@]}" >"$build.cmake.log" 2>&1 \
  || { cat "$build.cmake.log"; exit 1; }
cmake --build "$build" -j "${PRIMUS_FUZZ_BUILD_JOBS:-2}" --target fuzz_targets >"$build.build.log" 2>&1 \
  || { tail -40 "$build.build.log"; exit 1; }
targets=()
for f in "$root"/fuzz/fuzz_*.cpp; do t="$(basename "$f" .cpp)"; targets+=("${t#fuzz_}"); done
mkdir -p "$build/artifacts"
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
for t in "${targets[@]}"; do
  [[ -n "$only" && "$only" != "$t" ]] && continue
  work="$build/corpus/$t"
  mkdir -p "$work"
  cp -n "$root/fuzz/corpus/$t/"* "$work/" 2>/dev/null || true
  log="$build/fuzz_$t.log"
  # -rss_limit_mb: an input may not make a parser allocate gigabytes; -timeout: nor loop.
  # -max_len 1 MiB: the corpus holds large seeds (deep nesting, long lines) that must not be cut.
  if ! (cd "$build" && "./fuzz/fuzz_$t" "$work" -jobs=1 -workers=1 -max_total_time="$seconds" -timeout=10 \
          -rss_limit_mb=2048 -max_len=1048576 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
          >"$log" 2>&1); then
    echo "fuzz_$t: FAILED (see $log and $build/artifacts/)"
    grep -m5 -E "ERROR|SUMMARY|Test unit written" "$log" || tail -20 "$log"
    exit 1
  fi
  runs=$(grep -m1 -oE "stat::number_of_executed_units: [0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
  cov=$(grep -oE "cov: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+" || echo "?")
  echo "fuzz_$t: ${seconds}s, $runs runs, coverage $cov edges, corpus $(ls "$work" | wc -l) inputs, no crash"
done
