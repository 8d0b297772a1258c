#!/usr/bin/env bash
# GPU training throughput, ours beside PyTorch in one run: Llama 3.2 1B, seq 4096, bf16 mixed
# precision, one micro-batch size for all three (ours through the trainer on mock data; PyTorch
# eager; torch.compile). Prints each one's tokens/s and MFU and the ratios. Run on the GPU machine
# from the repository root:
#
#   bash benchmarks/cuda/run_train_bench.sh [--cli build/src/cli/primus-cli] [--mbs 2] [--seq 4096] [--iters 30]
set -euo pipefail
CLI=build/src/cli/primus-cli MBS=2 SEQ=4096 MODEL=llama3.2_1B ITERS=30  # MODEL: the example config's
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cli) CLI=$2; shift 2 ;;
    --mbs) MBS=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
out=$(mktemp -d)
# Ours: the last log interval's tokens/s and MFU (the first interval includes warm-up).
"$CLI" direct -- train pretrain --config examples/llama3.2_1B_gpu.yaml \
  --micro_batch_size "$MBS" --global_batch_size $((MBS * 4)) --seq_length "$SEQ" --train_iters "$ITERS" \
  --log_interval 10 --workspace "$out" 2>&1 | tee "$out/ours.log" | grep -E "iteration|error" || true
ours=$(grep -E "iteration +$ITERS/" "$out/ours.log" | sed -E 's/.*tokens\/s: ([0-9.]+) .*MFU: ([0-9.]+)%.*/\1 \2/')
[[ -n "$ours" ]] || { echo "our run failed: see $out/ours.log" >&2; exit 1; }
eager=$("$PY" benchmarks/cuda/torch_llama_train.py --model "$MODEL" --micro-batch-size "$MBS" --seq-length "$SEQ")
compiled=$("$PY" benchmarks/cuda/torch_llama_train.py --model "$MODEL" --micro-batch-size "$MBS" --seq-length "$SEQ" --compile)
"$PY" - "$ours" "$eager" "$compiled" <<'PYEOF'
import json, sys
tps, mfu = map(float, sys.argv[1].split())
rows = [("primus (bf16, trainer)", tps, mfu / 100)]
for s in sys.argv[2:]:
    j = json.loads(s)
    rows.append((j["peer"], j["tokens_per_sec"], j["mfu"]))
print(f"{'run':28s} {'tokens/s':>10s} {'MFU':>7s} {'primus / run':>12s}")
for name, t, m in rows:
    print(f"{name:28s} {t:10.0f} {100 * m:6.1f}% {tps / t:12.2f}")
PYEOF
