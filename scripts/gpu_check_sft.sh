#!/usr/bin/env bash
# SFT on the CUDA backend, on a GPU machine, from a bundle of scripts/gpu_bundle.sh (docs/posttraining.md):
#
#   bash scripts/gpu_bundle.sh                     # here: .gpu-bundle.tar.xz with primus-cli
#   bash scripts/gpu_check_sft.sh .gpu-bundle.tar.xz   # there, in the repository root
#
# Trains examples/sft_tiny_cpu.yaml in bf16 on the GPU (its loss curve and time), then the masked-
# token check of tests/integration/cli/test_posttrain.cpp: a chat set, the same with an untrained
# user turn appended to every conversation (the same losses expected), and with an assistant turn
# appended (other losses).
set -uo pipefail
BUNDLE=${1:-.gpu-bundle.tar.xz}
tmp=$(mktemp -d); tar -C "$tmp" -xJf "$BUNDLE"; B="$tmp/$(basename "$BUNDLE" .tar.xz)"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
d=$(python3 - 2>/dev/null <<'PY' || true
import glob, os
try:
    import nvidia; roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots for p in glob.glob(os.path.join(r, "*", "lib", "lib*.so*"))})))
PY
)
[[ -n "$d" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
export PRIMUS_CONFIG_DIR=$PWD/configs
CLI="$B/bin/primus-cli"
nvidia-smi -L
ws=$(mktemp -d)
T="--device cuda --bf16 true"
echo "== example on cuda"; /usr/bin/time -f "wall %e s" "$CLI" direct --workspace $ws --exp-name ex -- train posttrain --config examples/sft_tiny_cpu.yaml $T 2>&1 | grep -E "compute:|iteration +[0-9]+/|validation|error|wall" | sed -E 's/ \| (TFLOP|MFU|peak|grad).*//' | cut -c1-220
mk() { for i in $(seq 0 15); do echo "{\"messages\": [{\"role\": \"user\", \"content\": \"$i + $((2*i))?\"}, {\"role\": \"assistant\", \"content\": \"$((3*i))\"}$2]}"; done > $ws/$1.jsonl; }
mk plain ""; mk user ', {"role": "user", "content": "thanks, and 7 * 7?"}'; mk asst ', {"role": "assistant", "content": "You are welcome"}'
S="--num_layers 2 --hidden_size 64 --ffn_hidden_size 128 --num_attention_heads 4 --num_query_groups 2 --seq_length 128 --micro_batch_size 4 --global_batch_size 8 --train_iters 6 --lr_warmup_iters 0 --log_interval 1 --eval_interval 0 --save_interval 0"
for n in plain user asst; do "$CLI" direct --workspace $ws --exp-name $n -- train posttrain --config examples/sft_tiny_cpu.yaml $T $S --sft_dataset_name $ws/$n.jsonl > $ws/$n.log 2>&1; echo "== $n rc=$?"; grep -o '"lm_loss":[^,]*' $ws/$n/metrics.jsonl | tr '\n' ' '; echo; grep -E "error" $ws/$n.log | head -3; done
rm -rf "$ws" "$tmp"
