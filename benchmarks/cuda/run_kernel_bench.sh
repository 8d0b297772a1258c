#!/usr/bin/env bash
# Our GPU kernels against PyTorch's at the Llama-3.1-8B training shapes, one after the other:
#   GEMMs      primus-cli benchmark gemm (cuBLASLt, tuned)   vs  gemm_peer.py (torch.mm)
#   attention  primus-cli benchmark attention (flash)        vs  attention_peer.py (SDPA)
# then a side-by-side table of TFLOP/s with the ratio ours / torch.
#
#   benchmarks/cuda/run_kernel_bench.sh [--quick]
#
# Shapes: hidden 4096, ffn 14336, 32 heads, 8 kv groups, head dim 128 (qkv width 6144), vocab
# 128256, seq 8192 x micro batch 1 = 8192 rows. Every GEMM is bf16 in and out on both sides (the
# model's fp32-output weight-gradient and logits GEMMs are timed by `benchmark gemm --tune`);
# ours reports the GEMM with its tuned algorithm, plus the heuristic's first choice.
# Environment: PRIMUS_CLI (default build/src/cli/primus-cli), PYTHON (python3), WARMUP (5),
# ITERS (20), OUT (output/kernel_bench: the JSON lines and the logs go there).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLI=${PRIMUS_CLI:-$ROOT/build/src/cli/primus-cli}
PYTHON=${PYTHON:-python3}
WARMUP=${WARMUP:-5}
ITERS=${ITERS:-20}
OUT=${OUT:-$ROOT/output/kernel_bench}
QUICK=0
[[ ${1:-} == --quick ]] && QUICK=1

[[ -x $CLI ]] || { echo "error: no primus-cli at $CLI (build it, or set PRIMUS_CLI)" >&2; exit 1; }
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
LOG=$OUT/bench.log
: >"$RESULTS"
: >"$LOG"
cd "$OUT"  # primus-cli writes its run folders here

# name op M N K
GEMMS=(
  "qkv_fwd NT 8192 6144 4096"
  "proj_fwd NT 8192 4096 4096"
  "fc1_fwd NT 8192 28672 4096"
  "fc2_fwd NT 8192 4096 14336"
  "fc2_dgrad NN 8192 14336 4096"
  "fc1_dgrad NN 8192 4096 28672"
  "proj_dgrad NN 8192 4096 4096"
  "qkv_dgrad NN 8192 4096 6144"
  "fc2_wgrad TN 4096 14336 8192"
  "fc1_wgrad TN 28672 4096 8192"
  "proj_wgrad TN 4096 4096 8192"
  "qkv_wgrad TN 6144 4096 8192"
  "logits_chunk NT 8192 16384 4096"
  "logits_full NT 8192 128256 4096"
  "square_8192 NN 8192 8192 8192"
)
# name batch seq heads kv head_dim
ATTENTION=(
  "attn_s8192 1 8192 32 8 128"
  "attn_s4096 2 4096 32 8 128"
)
if ((QUICK)); then
  GEMMS=("${GEMMS[0]}" "${GEMMS[4]}" "${GEMMS[8]}")
  ATTENTION=("${ATTENTION[0]}")
fi

# The last JSON line of a command's stdout, or {"error": ...} when it failed.
json_of() {
  local out rc
  out=$("$@" 2>>"$LOG")
  rc=$?
  local line
  line=$(grep '^{' <<<"$out" | tail -1)
  if ((rc != 0)) || [[ -z $line ]]; then
    echo "{\"error\": \"exit $rc, see $LOG\"}"
  else
    echo "$line"
  fi
}

record() {  # kind name ours peer
  echo "{\"kind\": \"$1\", \"name\": \"$2\", \"ours\": $3, \"peer\": $4}" >>"$RESULTS"
}

for g in "${GEMMS[@]}"; do
  read -r name op M N K <<<"$g"
  flags=()
  [[ ${op:0:1} == T ]] && flags+=(--trans-a)
  [[ ${op:1:1} == T ]] && flags+=(--trans-b)
  echo "gemm $name ($op $M x $N x $K)" | tee -a "$LOG" >&2
  ours=$(json_of "$CLI" direct --no-watch -- benchmark gemm -M "$M" -N "$N" -K "$K" "${flags[@]}" --dtype bf16 \
    --device cuda --warmup "$WARMUP" --iters "$ITERS" --json)
  peer=$(json_of "$PYTHON" "$ROOT/benchmarks/cuda/gemm_peer.py" -M "$M" -N "$N" -K "$K" "${flags[@]}" --dtype bf16 \
    --warmup "$WARMUP" --iters "$ITERS" --json)
  record gemm "$name" "$ours" "$peer"
done

for t in "${ATTENTION[@]}"; do
  read -r name B S H G D <<<"$t"
  echo "attention $name (batch $B seq $S heads $H kv $G dim $D, causal)" | tee -a "$LOG" >&2
  ours=$(json_of "$CLI" direct --no-watch -- benchmark attention --batch "$B" --seq "$S" --heads "$H" --kv-heads "$G" \
    --head-dim "$D" --device cuda --warmup "$WARMUP" --iters "$ITERS" --json)
  peer=$(json_of "$PYTHON" "$ROOT/benchmarks/cuda/attention_peer.py" --batch "$B" --seq "$S" --heads "$H" \
    --kv-heads "$G" --head-dim "$D" --warmup "$WARMUP" --iters "$ITERS" --json)
  record attention "$name" "$ours" "$peer"
done

"$PYTHON" - "$RESULTS" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def f(x, key):
    return x.get(key) if isinstance(x, dict) and "error" not in x else None
def num(v, fmt="{:8.1f}"):
    return fmt.format(v) if v is not None else "  failed"
def ratio(a, b):
    return f"{a / b:7.3f}x" if a and b else "       -"

dev = next((r[s]["device_name"] for r in rows for s in ("ours", "peer") if f(r[s], "device_name")), "?")
print(f"\nours vs PyTorch on {dev} (TFLOP/s; bf16)")
print(f"\n{'GEMM':<14}{'op':>3}{'m':>7}{'n':>8}{'k':>7} {'ours':>8} {'torch':>8} {'ratio':>8}   {'heuristic':>9} {'tuned':>8}")
for r in rows:
    if r["kind"] != "gemm":
        continue
    o, p = r["ours"], r["peer"]
    shape = o if "m" in o else p if "m" in p else {}
    op = ("T" if shape.get("trans_a") else "N") + ("T" if shape.get("trans_b") else "N") if shape else "?"
    print(f"{r['name']:<14}{op:>3}{shape.get('m', 0):>7}{shape.get('n', 0):>8}{shape.get('k', 0):>7} "
          f"{num(f(o, 'tflops'))} {num(f(p, 'tflops'))} {ratio(f(o, 'tflops'), f(p, 'tflops'))}   "
          f"{num(f(o, 'heuristic_tflops'), '{:9.1f}')} {num(f(o, 'best_tflops'))}")
att = [r for r in rows if r["kind"] == "attention"]
if att:
    print(f"\n{'attention':<12}{'b':>3}{'seq':>6}{'h':>4}{'kv':>4}{'d':>5}  "
          f"{'fwd ours':>8} {'torch':>8} {'ratio':>8}  {'bwd ours':>8} {'torch':>8} {'ratio':>8}  "
          f"{'f+b ours':>8} {'torch':>8} {'ratio':>8}")
    for r in att:
        o, p = r["ours"], r["peer"]
        s = o if "seq" in o else p if "seq" in p else {}
        cells = []
        for k in ("fwd_tflops", "bwd_tflops", "fwdbwd_tflops"):
            cells.append(f"{num(f(o, k))} {num(f(p, k))} {ratio(f(o, k), f(p, k))}")
        print(f"{r['name']:<12}{s.get('batch', 0):>3}{s.get('seq', 0):>6}{s.get('heads', 0):>4}{s.get('kv_heads', 0):>4}"
              f"{s.get('head_dim', 0):>5}  " + "  ".join(cells))
peer_impl = next((r["peer"]["impl"] for r in rows if f(r["peer"], "impl")), None)
if peer_impl:
    print(f"\npeers: {', '.join(sorted({r['peer']['impl'] for r in rows if f(r['peer'], 'impl')}))}")
print(f"raw results: {sys.argv[1]}")
EOF
