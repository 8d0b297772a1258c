#!/usr/bin/env bash
# Preprocessing throughput: `primus-cli data preprocess` with 1 and 2 workers beside the npm `tiktoken`
# package (WASM build of OpenAI's tiktoken) on the same JSONL file, cl100k_base ranks for both.
#
#   benchmarks/data/run_preprocess_bench.sh [--cli build/src/cli/primus-cli] [--input F.jsonl] [--mb 16]
#
# Without --input it writes a corpus of about --mb MB from Debian's fortunes (the demo corpus's text).
# Our numbers cover the whole job (read, JSON parse, tokenize, write .bin/.idx); tiktoken's cover
# encode_ordinary alone on texts already in memory, so the comparison leans in tiktoken's favour.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cli="$root/build/src/cli/primus-cli"
input=""
mb=16
while (($#)); do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --input) input="$2"; shift 2 ;;
    --mb) mb="$2"; shift 2 ;;
    *) echo "usage: $0 [--cli PATH] [--input F.jsonl] [--mb N]" >&2; exit 2 ;;
  esac
done
oracle="$root/tests/oracles/tiktoken_oracle.js"
[[ -x "$cli" ]] || { echo "error: primus-cli not found at $cli (build first, or pass --cli)" >&2; exit 1; }
[[ -d "$root/tests/oracles/node_modules/tiktoken" ]] || { echo "error: run scripts/setup.sh (npm tiktoken missing)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -z "$input" ]]; then
  input="$work/corpus.jsonl"
  /usr/bin/python3 - "$input" "$mb" <<'PY'
import glob, json, os, sys
out, mb = sys.argv[1], float(sys.argv[2])
texts = []
for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if f.endswith((".dat", ".u8")) or os.path.isdir(f) or os.path.islink(f):
        continue
    raw = open(f, "rb").read().decode("utf-8", "replace")
    texts += [t.strip("\n") for t in raw.split("\n%\n") if t.strip()]
if not texts:
    sys.exit("no fortunes found: install the fortunes package (scripts/setup.sh)")
size, i = 0, 0
with open(out, "w", encoding="utf-8") as f:
    while size < mb * 1e6:
        line = json.dumps({"text": texts[i % len(texts)] + ("" if i < len(texts) else f" ({i // len(texts)})")},
                          ensure_ascii=False) + "\n"
        f.write(line); size += len(line.encode()); i += 1
PY
fi
node "$oracle" dump cl100k_base "$work/cl100k_base.tiktoken"
echo "input: $input ($(du -h "$input" | cut -f1)), tokenizer: cl100k_base, cores: $(nproc)"

declare -A mbs tps toks
for w in 1 2; do
  out="$("$cli" direct --workspace "$work/runs" -- data preprocess --input "$input" --output-prefix "$work/out$w" \
         --tokenizer-type TikTokenizer --tokenizer-model "$work/cl100k_base.tiktoken" \
         --workers "$w" --log-interval 0)"
  line="$(grep ' documents, ' <<<"$out")"
  mbs[$w]="$(sed -E 's/.*\(([0-9.]+) MB\/s.*/\1/' <<<"$line")"
  tps[$w]="$(sed -E 's/.*MB\/s, ([0-9]+) tokens\/s.*/\1/' <<<"$line")"
  toks[$w]="$(sed -E 's/^[0-9]+ documents, ([0-9]+) tokens.*/\1/' <<<"$line")"
done
ref="$(node "$oracle" bench cl100k_base "$input" text)"
read -r rbytes rtokens rsec < <(/usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["bytes"], d["tokens"], d["seconds"])' "$ref")
/usr/bin/python3 - "${mbs[1]}" "${tps[1]}" "${mbs[2]}" "${tps[2]}" "$rbytes" "$rtokens" "$rsec" "${toks[1]}" <<'PY'
import sys
m1, t1, m2, t2 = map(float, sys.argv[1:5])
rb, rt, rs, ours_tokens = float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])
rm, rtps = rb / 1e6 / rs, rt / rs
# MB/s counts the JSONL file for us and the bare text for tiktoken; tokens are the same, so the
# ratio is taken in tokens/s.
print(f"{'':34}{'MB/s':>10}{'tokens/s':>14}{'tokens/s vs tiktoken':>22}")
print(f"{'primus preprocess, 1 worker':34}{m1:10.2f}{t1:14.0f}{t1 / rtps:21.2f}x")
print(f"{'primus preprocess, 2 workers':34}{m2:10.2f}{t2:14.0f}{t2 / rtps:21.2f}x")
print(f"{'tiktoken npm (1 thread, encode)':34}{rm:10.2f}{rtps:14.0f}{1:21.2f}x")
same = "yes" if ours_tokens == int(rt) else f"NO ({ours_tokens} vs {int(rt)})"
print(f"same token count as tiktoken: {same}")
PY
