#!/usr/bin/env node
// Reference for Hugging Face tokenizer.json files in the Primus tests: @lenml/tokenizers (a
// tokenizers-only fork of Hugging Face's transformers.js, JavaScript throughout, independent of our
// C++), pinned in package.json with the @lenml/tokenizer-* packages whose tokenizer.json files the
// tests read.
//
//   node hf_tokenizer_oracle.js encode DIR < LINES.jsonl   DIR/tokenizer.json (+ tokenizer_config.json):
//                                                         one JSON string per line in, ids per line out
//                                                         (special tokens of the post-processor included)
//   node hf_tokenizer_oracle.js encode-bare DIR < LINES.jsonl   the same with add_special_tokens: false
//                                                         (what apply_chat_template encodes a chat with)
//   node hf_tokenizer_oracle.js decode DIR < IDS.txt       ids per line in, one JSON string per line out
//                                                         (special tokens kept, no space clean-up)
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");
const { TokenizerLoader } = require("@lenml/tokenizers");

const [cmd, dir] = process.argv.slice(2);
if ((cmd !== "encode" && cmd !== "encode-bare" && cmd !== "decode") || !dir) {
  console.error("usage: hf_tokenizer_oracle.js encode|encode-bare|decode DIR < LINES");
  process.exit(2);
}
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const configPath = path.join(dir, "tokenizer_config.json");
const tokenizerConfig = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
const out = [];
rl.on("line", (line) => {
  if (cmd === "encode") out.push(tok.encode(JSON.parse(line)).join(" "));
  else if (cmd === "encode-bare") out.push(tok.encode(JSON.parse(line), { add_special_tokens: false }).join(" "));
  else {
    const ids = line.trim() ? line.trim().split(/\s+/).map(Number) : [];
    // decode() refuses an empty list; no ids are no text.
    const text = ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
    out.push(JSON.stringify(text));
  }
});
rl.on("close", () => process.stdout.write(out.join("\n") + (out.length ? "\n" : "")));
