// `generate --load <checkpoint> --prompt "..."`: samples text from a trained checkpoint with a
// key/value cache, using the tokenizer named in the checkpoint's config.
#include <iostream>

#include <yaml-cpp/yaml.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_fit.h"
#include "cli/registry.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generation.h"

namespace primus::cli {
namespace generate_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Options {
  std::string load, prompt;
  int64_t max_new_tokens = 64;
  double temperature = 0.8, top_p = 0.95;
  uint64_t seed = 0;
};

int run(const Options& o) {
  const std::string dir = checkpoint::resolve_checkpoint(o.load);
  const ModelSpec spec = checkpoint::read_checkpoint_model(dir);
  checkpoint::check_model_fit(dir, spec, {checkpoint::LoadPurpose::Read});
  const YAML::Node ov = checkpoint::trainer_module(YAML::Load(checkpoint::read_checkpoint_config(dir)))["overrides"];
  const std::string tok_type = ov && ov["tokenizer_type"] ? ov["tokenizer_type"].as<std::string>() : "";
  if (tok_type.empty()) fail("the checkpoint's config names no tokenizer_type; cannot turn text into tokens");
  auto tok = data::build_tokenizer({tok_type, ov["tokenizer_model"] ? ov["tokenizer_model"].as<std::string>() : ""});

  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp32);
  checkpoint::LoadOptions lo;
  lo.optimizer = false;  // the weights only: damaged optimizer state does not matter here
  auto ck = checkpoint::load_checkpoint(dir, model.params(), lo);
  std::copy(ck.params.begin(), ck.params.end(), model.params().values().data<float>());

  std::vector<int32_t> prompt = tok->encode(o.prompt);
  // One BOS first: tokenizers whose encode() adds it (Llama2Tokenizer, a tokenizer.json template) already did.
  if (tok->bos() >= 0 && (prompt.empty() || prompt[0] != tok->bos())) prompt.insert(prompt.begin(), tok->bos());
  if (prompt.empty()) fail("the prompt encodes to no tokens");
  KVCacheDecoder decoder(model, spec.max_position_embeddings);
  SamplingOptions so{o.temperature, o.top_p, o.seed};
  // Print the decoded prompt, then the growing decoded text: decoding the sequence whole keeps
  // the spaces that SentencePiece attaches to the start of a token.
  std::vector<int32_t> ids(prompt.begin() + (tok->bos() >= 0 ? 1 : 0), prompt.end());
  std::string shown = tok->decode(ids);
  std::cout << shown << std::flush;
  decoder.generate(prompt, o.max_new_tokens, so, tok->eos(), [&](int32_t t) {
    if (t == tok->eos()) return;
    ids.push_back(t);
    const std::string text = tok->decode(ids);
    if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) {
      std::cout << text.substr(shown.size()) << std::flush;
      shown = text;
    }
  });
  std::cout << "\n";
  return 0;
}

TaskRegistrar reg{{"generate", "", "sample text from a checkpoint (KV cache, temperature, top-p)",
                   [](CLI::App& app) -> TaskAction {
                     auto o = std::make_shared<Options>();
                     app.add_option("--load", o->load, "checkpoint folder, or a save folder with `latest`")->required();
                     app.add_option("--prompt", o->prompt, "text to continue")->required();
                     app.add_option("--max-new-tokens", o->max_new_tokens, "tokens to sample")->check(kAtLeastOne);
                     app.add_option("--temperature", o->temperature, "0 for greedy")->check(CLI::NonNegativeNumber);
                     app.add_option("--top-p", o->top_p, "nucleus probability mass")->check(CLI::Range(0.0, 1.0));
                     app.add_option("--seed", o->seed, "sampling seed");
                     return [o]() { return run(*o); };
                   }}};

}  // namespace
}  // namespace primus::cli
