#!/usr/bin/env bash
# Counts how many of Primus's Megatron example configs load and train on this engine: each config
# under PRIMUS/examples/megatron/configs (diffusion aside) is loaded (--print-config), and each one
# that loads trains two iterations on one process with a tiny model forced on the command line
# (for MoE configs 16 experts of 32, top-4; for MLA configs latent ranks of 32; one rank per
# parallel dimension, so no virtual pipeline, stage layout or uneven stages: Megatron's num_virtual_stages_per_pipeline_rank
# and pipeline_model_parallel_layout unset, as they need more than one pipeline rank; profiling off,
# as some examples profile steps past the second). Prints the counts and, for the rest, the first
# error of each, grouped.
#
#   scripts/count_primus_examples.sh PRIMUS_CHECKOUT [PRIMUS_CLI]
#
# docs/config.md quotes its counts.
set -u
primus=${1:?usage: count_primus_examples.sh PRIMUS_CHECKOUT [PRIMUS_CLI]}
root=$(cd "$(dirname "$0")/.." && pwd)
cli=${2:-$root/build/src/cli/primus-cli}
export PRIMUS_CONFIG_DIR=$root/configs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tiny="--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --num-query-groups 2
      --vocab-size 512 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4
      --train-iters 2 --log-interval 1 --lr-warmup-iters 0 --lr-decay-iters 100 --tensor-model-parallel-size 1
      --pipeline-model-parallel-size 1 --context-parallel-size 1 --expert-model-parallel-size 1
      --virtual-pipeline-model-parallel-size null --pipeline-model-parallel-layout null
      --num-virtual-stages-per-pipeline-rank null --decoder-first-pipeline-num-layers null
      --decoder-last-pipeline-num-layers null --profile false"
total=0 loaded=0 trained=0
: > "$work/errors"
while IFS= read -r config; do
  total=$((total + 1))
  if ! printed=$("$cli" direct -- train pretrain --config "$config" --print-config 2>&1); then
    echo "$printed" | grep -m1 'error' | sed 's/.*yaml:[0-9]*: //; s/^error: //' | cut -c1-90 >> "$work/errors"
    continue
  fi
  loaded=$((loaded + 1))
  extra=""
  if echo "$printed" | grep -q '^      num_experts: [1-9]'; then
    extra="--num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 32 --moe-layer-freq 1"
    echo "$printed" | grep -q 'moe_shared_expert_intermediate_size: [1-9]' &&
      extra="$extra --moe-shared-expert-intermediate-size 64"
  fi
  if echo "$printed" | grep -q 'multi_latent_attention: true'; then
    extra="$extra --kv-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16"
    echo "$printed" | grep -q 'q_lora_rank: [1-9]' && extra="$extra --q-lora-rank 32"
  fi
  # shellcheck disable=SC2086
  if out=$("$cli" direct --workspace "$work/ws" -- train pretrain --config "$config" $tiny $extra 2>&1); then
    trained=$((trained + 1))
  else
    echo "training $(basename "$config"): $(echo "$out" | grep -m1 'error' | cut -c1-90)" >> "$work/errors"
  fi
  rm -rf "$work/ws"
done < <(find "$primus/examples/megatron/configs" -name '*.yaml' -not -path '*diffusion*' | sort)
echo "$total configs: $loaded load, $trained train two iterations"
sort "$work/errors" | uniq -c | sort -rn
