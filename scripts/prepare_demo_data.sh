#!/usr/bin/env bash
# Builds the demo corpus offline from Debian's fortunes packages (fortunes-min, fortunes):
#
#   data/demo/fortunes.jsonl                    one fortune per line, {"text": ...}
#   data/demo/fortunes_sp.model / .vocab        SentencePiece BPE tokenizer trained on it (spm_train)
#   data/demo/fortunes_text_document.bin/.idx   the corpus tokenized with it (Llama2Tokenizer, EOD)
#
# Train on it with tokenizer_type Llama2Tokenizer, tokenizer_model data/demo/fortunes_sp.model,
# data_path data/demo/fortunes_text_document. Deterministic: same packages, same bytes.
#
#   scripts/prepare_demo_data.sh [--cli build/src/cli/primus-cli] [--out data/demo] [--vocab-size 2048] [--force]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cli="$root/build/src/cli/primus-cli"
out="$root/data/demo"
vocab=2048
force=0
while (($#)); do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --vocab-size) vocab="$2"; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
fortunes=/usr/share/games/fortunes
[[ -d "$fortunes" ]] || { echo "error: $fortunes is missing: install fortunes-min and fortunes (scripts/setup.sh)" >&2; exit 1; }
command -v spm_train >/dev/null || { echo "error: spm_train is missing: install the sentencepiece package" >&2; exit 1; }
[[ -x "$cli" ]] || { echo "error: primus-cli not found at $cli: build first (scripts/setup.sh) or pass --cli" >&2; exit 1; }

if [[ $force == 0 && -f "$out/fortunes_text_document.idx" && -f "$out/fortunes_sp.model" ]]; then
  echo "demo data already in $out (--force rebuilds it)"
  exit 0
fi
mkdir -p "$out"

# 1. Fortunes -> JSONL. Files are "%"-separated; the .dat indexes and .u8 links are skipped, and so is
#    the off/ folder (fortunes-off) should it be installed. Sorted, so the order never changes.
/usr/bin/python3 - "$fortunes" "$out/fortunes.jsonl" "$out/fortunes.txt" <<'PY'
import json, os, sys
src, jsonl, txt = sys.argv[1:4]
n = 0
with open(jsonl, "w", encoding="utf-8") as j, open(txt, "w", encoding="utf-8") as t:
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        raw = open(path, "rb").read().decode("utf-8", "replace")
        for fortune in raw.split("\n%\n"):
            fortune = fortune.strip("\n%")
            if not fortune.strip():
                continue
            j.write(json.dumps({"text": fortune, "source": name}, ensure_ascii=False) + "\n")
            t.write(fortune + "\n")
            n += 1
if n == 0:
    sys.exit(f"error: no fortunes found in {src}")
print(f"fortunes: {n} documents -> {jsonl}")
PY

# 2. Tokenizer: SentencePiece BPE with byte fallback (any text encodes) and no normalization, so
#    decode(encode(text)) == text, newlines and ASCII-art spacing included (a newline becomes the byte
#    piece <0x0A>). One thread and a fixed seed: the same model on every machine. Llama's conventions:
#    <unk>=0, <s>=1, </s>=2, no pad.
spm_train --input="$out/fortunes.txt" --model_prefix="$out/fortunes_sp" --vocab_size="$vocab" \
  --model_type=bpe --character_coverage=0.9995 --byte_fallback=true --split_digits=true \
  --normalization_rule_name=identity --remove_extra_whitespaces=false \
  --max_sentence_length=16384 --num_threads=1 --random_seed=1234 --shuffle_input_sentence=false \
  --input_sentence_size=0 --minloglevel=1 2>"$out/spm_train.log" ||
  { cat "$out/spm_train.log" >&2; echo "error: spm_train failed" >&2; exit 1; }
echo "tokenizer: $out/fortunes_sp.model (vocab $vocab)"

# 3. Megatron .bin/.idx with our preprocessor.
runs="$(mktemp -d)"  # primus-cli's run folder (snapshot, logs) is not part of the demo data
trap 'rm -rf "$runs"' EXIT
"$cli" direct --workspace "$runs" -- data preprocess --input "$out/fortunes.jsonl" --json-keys text \
  --output-prefix "$out/fortunes" --tokenizer-type Llama2Tokenizer \
  --tokenizer-model "$out/fortunes_sp.model" --append-eod --workers 2 --log-interval 0
rm -f "$out/fortunes.txt" "$out/spm_train.log"
