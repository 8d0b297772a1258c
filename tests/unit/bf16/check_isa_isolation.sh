#!/usr/bin/env bash
# The CPU bf16 backend's AVX-512 code must stay where the backend calls it only after checking the
# CPU (kernels/cpu/bf16/*_avx512.cpp, in functions of their own): no other object of the kernels
# library may contain AVX-512 instructions, and no shared (weak) function of an AVX-512 object
# may either, or the linker could pick an AVX-512 copy of an inline function for the whole
# program and a CPU without AVX-512 would fault. Arguments: the library's object files.
set -euo pipefail
avx512='%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[1-7]\b|\{1to[0-9]+\}'
bad=0
for obj in "$@"; do
  dis=$(objdump -d --no-show-raw-insn "$obj")
  if [[ "$obj" != *_avx512.cpp.o ]]; then
    if grep -Eq "$avx512" <<<"$dis"; then
      echo "AVX-512 instructions in $obj, which is built for the baseline:"
      grep -E "$avx512" <<<"$dis" | head -5
      bad=1
    fi
    continue
  fi
  # Weak (shared) symbols of an AVX-512 object: their bodies must be baseline code.
  while read -r sym; do
    body=$(awk -v s="<$sym>:" '$2 == s {p = 1; next} /^[0-9a-f]+ </ {p = 0} p' <<<"$dis")
    if grep -Eq "$avx512" <<<"$body"; then
      echo "the shared function $sym of $obj contains AVX-512 instructions"
      bad=1
    fi
  done < <(nm --defined-only "$obj" | awk '$2 == "W" || $2 == "V" {print $3}')
done
if ((bad)); then exit 1; fi
echo "checked $# objects: AVX-512 code only in the bf16 backend's own functions"
