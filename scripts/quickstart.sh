#!/usr/bin/env bash
# The README's first command: set-up (apt, and the build of primus-cli alone), the demo corpus, a
# small Llama trained on it on the CPU, and a sample of what it learned.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --main  # primus-cli and its packages only: the tests are built by scripts/test.sh
bash scripts/prepare_demo_data.sh
cli=build/src/cli/primus-cli
"$cli" direct -- train pretrain --config examples/tiny_llama_cpu.yaml "$@"
echo
echo "A sample from the trained model:"
"$cli" direct -- generate --load output/tiny_llama_cpu/checkpoints --prompt "The secret of life is" \
  --max-new-tokens 60 --temperature 0.8 --top-p 0.9 --seed 1
