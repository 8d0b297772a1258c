// `checkpoint import` / `checkpoint export`: Hugging Face Llama, Mistral and Qwen2 checkpoints
// (config.json + safetensors) to and from this project's checkpoints (src/hf/hf_checkpoint.h).
#include <iostream>

#include <fmt/format.h>

#include "cli/registry.h"
#include "hf/hf_checkpoint.h"

namespace primus::cli {
namespace checkpoint_convert_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

TaskRegistrar import_reg{
    {"checkpoint", "import",
     "turn a Hugging Face folder (config.json + safetensors) into a checkpoint (--hf DIR --save DIR)",
     [](CLI::App& app) -> TaskAction {
       auto o = std::make_shared<hf::ImportOptions>();
       app.add_option("--hf", o->hf_dir, "Hugging Face model folder: config.json, model.safetensors or the index")
           ->required();
       app.add_option("--save", o->save_dir, "save folder; the checkpoint is <save>/iter_0000000")->required();
       app.add_option("--tokenizer", o->tokenizer,
                      "tokenizer.json (or its folder) to record for `generate` and training (default: the --hf "
                      "folder's, when it has one)");
       app.add_flag("--overwrite", o->overwrite, "replace a checkpoint of another run at <save>/iter_0000000");
       app.add_flag("--allow-nonfinite", o->allow_nonfinite,
                    "import weights with NaN or infinite values (a warning names each tensor); refused without it");
       return [o]() {
         const std::string written = hf::import_hf(*o);  // nothing is printed before it succeeds
         std::cout << "imported " << o->hf_dir << " into " << written << "\n";
         return 0;
       };
     }}};

TaskRegistrar export_reg{
    {"checkpoint", "export", "write a checkpoint as a Hugging Face folder (--load CKPT --output DIR)",
     [](CLI::App& app) -> TaskAction {
       auto o = std::make_shared<hf::ExportOptions>();
       app.add_option("--load", o->checkpoint, "checkpoint folder, or a save folder with `latest`")->required();
       app.add_option("--output", o->out_dir, "folder to write config.json and the safetensors file(s) into")
           ->required();
       app.add_option("--dtype", o->dtype, "weight type of the files")
           ->check(CLI::IsMember({"F32", "BF16"}))
           ->capture_default_str();
       app.add_option(
           "--architecture", o->architecture,
           "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
           "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
           "GptOssForCausalLM or Llama4ForCausalLM (default: the family the model's parts say; docs/checkpoints.md)");
       app.add_option("--max-shard-size", o->max_shard_bytes,
                      "largest safetensors file in bytes; more weights go into shards with an index")
           ->check(kAtLeastOne)
           ->capture_default_str();
       app.add_flag("--overwrite", o->overwrite,
                    "write into a folder that is not empty: its Hugging Face model files (config, weights, index, "
                    "tokenizer files) are deleted and replaced, other files stay");
       app.add_flag("--adapters", o->adapters,
                    "a LoRA checkpoint's adapters alone, as a PEFT folder (adapter_config.json, "
                    "adapter_model.safetensors); without it a LoRA checkpoint exports merged weights");
       return [o]() {
         for (const auto& f : hf::export_hf(*o)) std::cout << "wrote " << f << "\n";
         return 0;
       };
     }}};

}  // namespace
}  // namespace primus::cli
