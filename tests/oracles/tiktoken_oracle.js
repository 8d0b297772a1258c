#!/usr/bin/env node
// Reference tokenizer for the Primus tests and benchmarks: the npm `tiktoken` package (WASM build of
// OpenAI's tiktoken), pinned in package.json.
//
//   node tiktoken_oracle.js dump ENCODING OUT.tiktoken     write the package's ranks as a .tiktoken file
//   node tiktoken_oracle.js encode ENCODING < LINES.jsonl  one JSON string per line in, ids per line out
//   node tiktoken_oracle.js bench ENCODING FILE.jsonl KEY  time encode_ordinary over FILE's KEY texts
"use strict";
const fs = require("fs");
const readline = require("readline");
const { get_encoding } = require("tiktoken");

const [cmd, name, a, b] = process.argv.slice(2);
if (!cmd || !name) {
  console.error("usage: tiktoken_oracle.js dump|encode|bench ENCODING ...");
  process.exit(2);
}

if (cmd === "dump") {
  // The package stores ranks as "! <first rank> <base64> <base64> ..." in encoders/NAME.json.
  const data = JSON.parse(fs.readFileSync(require.resolve(`tiktoken/encoders/${name}.json`), "utf8"));
  const parts = data.bpe_ranks.split(" ");
  let rank = parseInt(parts[1], 10);
  const lines = [];
  for (const tok of parts.slice(2)) lines.push(`${tok} ${rank++}`);
  fs.writeFileSync(a, lines.join("\n") + "\n");
} else if (cmd === "encode") {
  const enc = get_encoding(name);
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  const out = [];
  rl.on("line", (line) => {
    out.push(Array.from(enc.encode_ordinary(JSON.parse(line))).join(" "));
  });
  rl.on("close", () => {
    process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
    enc.free();
  });
} else if (cmd === "bench") {
  const enc = get_encoding(name);
  const texts = fs.readFileSync(a, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l)[b]);
  let bytes = 0;
  for (const t of texts) bytes += Buffer.byteLength(t, "utf8");
  const t0 = process.hrtime.bigint();
  let tokens = 0;
  for (const t of texts) tokens += enc.encode_ordinary(t).length;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ bytes, tokens, seconds }));
  enc.free();
} else {
  console.error(`unknown command ${cmd}`);
  process.exit(2);
}
