// `train posttrain` (SFT) and `data sft-preview` through primus-cli: the tiny example trains and
// its loss falls; the tokens the loss mask leaves out contribute nothing (a conversation with an
// untrained tail trains to the same losses as without it, one with another assistant turn does
// not); dp2, cp2 and pp2 (and LoRA under ZeRO-2 / FSDP) give the one-process losses; a resumed run
// goes on exactly; a fine-tune starts from our
// checkpoint or a Hugging Face folder (hf_path); what is not built is refused by name; Primus's native SFT configs
// (tests/integration/primus_configs/sft/, unchanged) load under tiny overrides.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace fs = std::filesystem;
using namespace primus;

namespace {

const std::string kCli = PRIMUS_CLI_PATH;
const std::string kRoot = PRIMUS_SOURCE_DIR;
const std::string kExample = kRoot + "/examples/sft_tiny_cpu.yaml";

test::CommandResult run(const std::string& args) {
  return test::run_command("cd '" + kRoot +
                           "' && env -u PRIMUS_WORKSPACE -u PRIMUS_EXP_NAME OMPI_ALLOW_RUN_AS_ROOT=1 "
                           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '" +
                           kCli + "' " + args + " 2>&1");
}

fs::path workspace(const std::string& name) {
  const fs::path ws = fs::temp_directory_path() / ("primus-sft-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(ws);
  return ws;
}

// A smaller run of the example: 2 layers of 64, 128 tokens, fp32, 6 steps without warmup.
const std::string kTiny =
    " --num_layers 2 --hidden_size 64 --ffn_hidden_size 128 --num_attention_heads 4 --num_query_groups 2"
    " --seq_length 128 --micro_batch_size 4 --global_batch_size 8 --train_iters 6 --lr_warmup_iters 0"
    " --log_interval 1 --eval_interval 0 --bf16 false";

// The lm losses of a run's metrics.jsonl, in order.
std::vector<double> losses(const fs::path& run_dir) {
  std::vector<double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("lm_loss") && j.contains("iteration")) out.push_back(j["lm_loss"].get<double>());
  }
  return out;
}

// Trains `args` (after the example config and kTiny) in a fresh workspace; returns the losses.
std::vector<double> train(const std::string& name, const std::string& args, const std::string& launcher = "direct") {
  const fs::path ws = workspace(name);
  const auto r = run(launcher + " --workspace " + ws.string() + " --exp-name run -- train posttrain --config " +
                     kExample + kTiny + args);
  EXPECT_EQ(r.code, 0) << r.out;
  const std::vector<double> l = losses(ws / "run");
  fs::remove_all(ws);
  return l;
}

void expect_same(const std::vector<double>& a, const std::vector<double>& b, double rel, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], rel * std::abs(a[i])) << what << " iteration " << i + 1;
}

// The one-process losses of the tiny run, shared by the tests that compare against them.
const std::vector<double>& one_process() {
  static const std::vector<double> l = train("one", "");
  return l;
}

TEST(SftPreview, PrintsTextIdsAndMask) {
  const auto r = run("direct --workspace " + workspace("preview").string() +
                     " -- data sft-preview --input examples/data/arith_chat.json --format messages"
                     " --tokenizer-type ByteLevelTokenizer --limit 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[0] examples/data/arith_chat.json[train][0]: 90 tokens, 23 trained\ntext:\n<|im_start|>user\n"
                       "What is 14 - 93?<|im_end|>\n<|im_start|>assistant\n14 - 93 = -79<|im_end|>\n"),
            std::string::npos)
      << r.out;
  // 66 prompt bytes, then "14 - 93 = -79<|im_end|>" (23), then the untrained newline.
  std::string mask = "loss_mask:";
  for (int i = 0; i < 90; ++i) mask += i >= 66 && i < 89 ? " 1" : " 0";
  EXPECT_NE(r.out.find(mask + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("input_ids: 60 124 105 109 95 115"), std::string::npos) << r.out;  // "<|im_s"
  EXPECT_NE(r.out.find("2 of 400 records of examples/data/arith_chat.json shown (openai format)"), std::string::npos)
      << r.out;
  const auto bad = run("direct --workspace " + workspace("preview").string() +
                       " -- data sft-preview --input examples/data/arith_chat.json --format sharegpt"
                       " --tokenizer-type ByteLevelTokenizer");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("format 'sharegpt' is not one of: alpaca, chatml, openai, messages, squad"), std::string::npos)
      << bad.out;
}

TEST(Posttrain, TinyExampleLossFalls) {
  const std::vector<double>& l = one_process();
  ASSERT_EQ(l.size(), 6u);
  for (double x : l) EXPECT_TRUE(std::isfinite(x));
  EXPECT_GT(l.front(), 4.0);  // about ln 320 = 5.8 at the start
  EXPECT_LT(l.back(), l.front() - 1.0) << "the loss falls";
}

// Packed (enable_packed_sequences): conversations share sequences, attending across each other.
TEST(Posttrain, PackedLossFalls) {
  const fs::path ws = workspace("packed");
  const auto r = run("direct --workspace " + ws.string() + " --exp-name run -- train posttrain --config " + kExample +
                     kTiny + " --enable_packed_sequences true --seq_length 256");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sft: 400 conversations packed into"), std::string::npos) << r.out;
  const std::vector<double> l = losses(ws / "run");
  ASSERT_EQ(l.size(), 6u);
  for (double x : l) EXPECT_TRUE(std::isfinite(x));
  EXPECT_LT(l.back(), l.front() - 1.0) << "the loss falls";
  fs::remove_all(ws);
}

// use_packed_attention: each packed conversation attends to itself alone, positions restarting.
// The first conversation of every sequence sees nothing else either way, the others do only
// without it: the runs start from the same weights on the same tokens and differ.
TEST(Posttrain, PackedAttentionKeepsEachConversationAlone) {
  const fs::path ws = workspace("packed_attention");
  const std::string args = "direct --workspace " + ws.string() + " --exp-name {} -- train posttrain --config " +
                           kExample + kTiny + " --enable_packed_sequences true --seq_length 256";
  auto with = [&](const std::string& name, const std::string& more) {
    std::string a = args;
    a.replace(a.find("{}"), 2, name);
    const auto r = run(a + more);
    EXPECT_EQ(r.code, 0) << r.out;
    return losses(ws / name);
  };
  const std::vector<double> alone = with("alone", " --use_packed_attention true"), across = with("across", "");
  ASSERT_EQ(alone.size(), 6u);
  ASSERT_EQ(across.size(), 6u);
  for (double x : alone) EXPECT_TRUE(std::isfinite(x));
  EXPECT_LT(alone.back(), alone.front() - 1.0) << "the loss falls";
  EXPECT_NE(alone.front(), across.front()) << "the conversations after the first saw the others";
  fs::remove_all(ws);
}

// A chat set of 16 conversations, each with `tail` appended after its assistant turn.
std::string chat_set(const std::string& name, const std::string& tail) {
  const fs::path p = fs::temp_directory_path() / ("primus-sft-" + name + "-" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream out(p);
  for (int i = 0; i < 16; ++i)
    out << "{\"messages\": [{\"role\": \"user\", \"content\": \"" << i << " + " << 2 * i
        << "?\"}, {\"role\": \"assistant\", \"content\": \"" << 3 * i << "\"}" << tail << "]}\n";
  return p.string();
}

// Tokens the mask leaves out contribute nothing: a user turn after the last assistant turn comes
// after every trained token (causal attention), so with its targets masked the run is the same.
// An assistant turn there is trained on and changes the losses (the check can fail).
TEST(Posttrain, MaskedTokensContributeNothing) {
  const std::string plain = chat_set("plain", "");
  const std::string user_tail = chat_set("user", ", {\"role\": \"user\", \"content\": \"thanks, and 7 * 7?\"}");
  const std::string assistant_tail = chat_set("assistant",
                                              ", {\"role\": \"assistant\", \"content\": \"You are welcome\"}");
  const std::vector<double> a = train("plain", " --sft_dataset_name " + plain);
  const std::vector<double> b = train("user", " --sft_dataset_name " + user_tail);
  const std::vector<double> c = train("assistant", " --sft_dataset_name " + assistant_tail);
  expect_same(a, b, 1e-6, "an untrained user turn at the end");
  ASSERT_EQ(a.size(), c.size());
  EXPECT_GT(std::abs(a[0] - c[0]), 1e-3) << "a trained assistant turn changes the loss";
  for (const auto& f : {plain, user_tail, assistant_tail}) fs::remove(f);
}

TEST(Posttrain, Dp2Cp2AndPp2GiveTheOneProcessLosses) {
  expect_same(one_process(), train("dp2", "", "direct --nproc 2"), 2e-5, "dp2");
  expect_same(one_process(), train("cp2", " --context_parallel_size 2", "direct --nproc 2"), 2e-5, "cp2");
  expect_same(one_process(), train("pp2", " --pipeline_model_parallel_size 2", "direct --nproc 2"), 2e-5, "pp2");
}

// LoRA through the whole trainer: tp2 (B or A sharded with the base, the whole factor's gradient
// summed over tp), dp2 (the adapters' gradients reduced, AdamW on their range) and pp2 (each
// stage's adapters after its own tensors) give the one-process LoRA losses; the loss falls.
const std::string kLora = " --lora.enabled true --lora.dim 8 --lora.alpha 16 --lr 3e-3";

// A run's losses and its first metrics row's memory_optimizer_bytes (rank 0's AdamW state).
struct Recorded {
  std::vector<double> losses;
  double optimizer_bytes = -1;
};
Recorded run_recorded(const std::string& name, const std::string& args, const std::string& launcher) {
  Recorded out;
  const fs::path ws = workspace(name);
  const auto r = run(launcher + " --workspace " + ws.string() + " --exp-name run -- train posttrain --config " +
                     kExample + kTiny + args);
  EXPECT_EQ(r.code, 0) << r.out;
  out.losses = losses(ws / "run");
  std::ifstream in(ws / "run" / "metrics.jsonl");
  std::string line;
  while (out.optimizer_bytes < 0 && std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("memory_optimizer_bytes")) out.optimizer_bytes = j["memory_optimizer_bytes"].get<double>();
  }
  fs::remove_all(ws);
  return out;
}

// The one-process LoRA run, shared by the tests that compare against it.
const Recorded& lora_one() {
  static const Recorded r = run_recorded("lora_one", kLora, "direct");
  return r;
}
const std::vector<double>& lora_one_process() { return lora_one().losses; }

TEST(Posttrain, LoraUnderTp2Dp2AndPp2GivesTheOneProcessLosses) {
  const std::string& lora = kLora;
  const std::vector<double>& one = lora_one_process();
  ASSERT_EQ(one.size(), 6u);
  EXPECT_LT(one.back(), one.front() - 0.3) << "the adapters learn";
  expect_same(one, train("lora_tp2", lora + " --tensor_model_parallel_size 2", "direct --nproc 2"), 2e-5, "tp2");
  expect_same(one, train("lora_dp2", lora, "direct --nproc 2"), 2e-5, "dp2");
  expect_same(one, train("lora_pp2", lora + " --pipeline_model_parallel_size 2", "direct --nproc 2"), 2e-5, "pp2");
  // With dropout the masks follow each microbatch's first sample, whichever rank runs it: dp2 and
  // pp2 draw one process's masks (tp2 draws the row-parallel inputs' masks over its shards).
  const std::string drop = lora + " --lora.dropout 0.1";
  const std::vector<double> dropped = train("lora_drop_one", drop);
  ASSERT_EQ(dropped.size(), 6u);
  EXPECT_NE(dropped[3], one[3]) << "dropout changes the losses once B has left zero";
  EXPECT_LT(dropped.back(), dropped.front() - 0.3) << "the adapters learn under dropout";
  expect_same(dropped, train("lora_drop_dp2", drop, "direct --nproc 2"), 2e-5, "dp2 with dropout");
  expect_same(dropped, train("lora_drop_pp2", drop + " --pipeline_model_parallel_size 2", "direct --nproc 2"), 2e-5,
              "pp2 with dropout");
}

// Packed SFT trains as unpacked SFT (use_packed_attention): eight conversations of the same length
// (system prompt, two turns), one per sequence of 224 tokens or two per sequence of 448, every step
// one microbatch of the whole set, give the same losses and gradient norms for three steps (each
// step's weights come from the previous step's gradients): in fp32 on one process and under cp2 on
// two ranks, and in bf16 to bf16 resolution. (tests/unit/engine/test_sft_packing.cpp compares the
// gradients themselves.)
std::vector<std::pair<double, double>> losses_and_grad_norms(const fs::path& run_dir) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("lm_loss") && j.contains("grad_norm")) out.emplace_back(j["lm_loss"], j["grad_norm"]);
  }
  return out;
}

TEST(Posttrain, PackedTrainsAsOneConversationPerSequence) {
  const fs::path set = fs::temp_directory_path() / ("primus-sft-same-length-" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(set);
    for (int i = 0; i < 8; ++i) {
      const int a = 10 + 3 * i, b = 12 + 4 * i;
      const std::string twice = std::to_string(1000 + 2 * (a + b)).substr(1);  // three digits
      out << R"({"messages": [{"role": "system", "content": "Answer with the sum only."}, {"role": "user", "content": )"
          << "\"What is " << a << " + " << b << "?\"}, {\"role\": \"assistant\", \"content\": \"" << a + b
          << R"("}, {"role": "user", "content": "And times two?"}, {"role": "assistant", "content": ")" << twice
          << "\"}]}\n";
    }
  }
  const fs::path ws = workspace("packed_equal");
  const std::string common =
      " --sft_dataset_name " + set.string() + " --train_iters 3 --max_position_embeddings 448";
  auto run_named = [&](const std::string& name, const std::string& launcher, const std::string& more) {
    const auto r = run(launcher + " --workspace " + ws.string() + " --exp-name " + name +
                       " -- train posttrain --config " + kExample + kTiny + common + more);
    EXPECT_EQ(r.code, 0) << r.out;
    return std::make_pair(r.out, losses_and_grad_norms(ws / name));
  };
  const std::string alone = " --seq_length 224 --micro_batch_size 8 --global_batch_size 8";
  const std::string packed = " --seq_length 448 --micro_batch_size 4 --global_batch_size 4"
                             " --enable_packed_sequences true --use_packed_attention true";
  const auto [alone_log, a] = run_named("alone", "direct", alone);
  const auto [packed_log, p] = run_named("packed", "direct", packed);
  EXPECT_NE(packed_log.find("sft: 8 conversations packed into 4 sequences of 449 tokens"), std::string::npos)
      << packed_log;
  // FLOPs per token as the log counts them (TFLOP/s over tokens/s): the packed run's attention is
  // its documents', within 0.1% of one conversation per sequence (the documents split 448 positions
  // as 225 + 223 or so, where each unpacked sequence has 224), and less than the whole 448-token
  // sequences' that the start-up line counts (model_stats at seq_length 448).
  auto flops_per_token = [&](const std::string& name) {
    std::ifstream in(ws / name / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("tflops")) return j["tflops"].get<double>() * 1e12 / j["tokens_per_sec"].get<double>();
    }
    return 0.0;
  };
  const double fpt_alone = flops_per_token("alone"), fpt_packed = flops_per_token("packed");
  EXPECT_NEAR(fpt_packed, fpt_alone, 1e-3 * fpt_alone);
  const size_t at = packed_log.find(" MFLOP per token");
  ASSERT_NE(at, std::string::npos) << packed_log;
  const double whole = std::stod(packed_log.substr(packed_log.rfind(", ", at) + 2)) * 1e6;
  EXPECT_LT(fpt_packed, whole - 1e3) << "per-document attention counts less than whole sequences";
  const auto cp2 = run_named("packed_cp2", "direct --nproc 2", packed + " --context_parallel_size 2").second;
  const auto a16 = run_named("alone_bf16", "direct", alone + " --bf16 true").second;
  const auto p16 = run_named("packed_bf16", "direct", packed + " --bf16 true").second;
  ASSERT_EQ(a.size(), 3u);
  for (const auto& [run, rel] : {std::make_pair(&p, 2e-5), std::make_pair(&cp2, 2e-5), std::make_pair(&p16, 2e-2)}) {
    ASSERT_EQ(run->size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const auto& ref = run == &p16 ? a16[i] : a[i];
      EXPECT_NEAR((*run)[i].first, ref.first, rel * ref.first) << "loss, iteration " << i + 1;
      EXPECT_NEAR((*run)[i].second, ref.second, rel * ref.second) << "grad norm, iteration " << i + 1;
    }
  }
  fs::remove_all(ws);
  fs::remove(set);
}

// sft_conversation_format chat_template through the trainer and sft-preview: a tokenizer folder
// whose tokenizer_config.json holds ChatML as a Jinja template renders the example's conversations
// as the openai format does and trains the same tokens (each assistant content and <|im_end|>), so
// the run gives the openai run's losses exactly.
TEST(Posttrain, ChatTemplateFormatTrainsAsTheSameFixedFormat) {
  const fs::path ws = workspace("chat_template");
  fs::create_directories(ws / "tokenizer");
  std::ofstream(ws / "tokenizer" / "tokenizer_config.json")
      << R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",)"
      << R"( "eos_token": "<|im_end|>"})";
  const std::string folder = (ws / "tokenizer").string();
  expect_same(one_process(),
              train("chat_template_run", " --sft_conversation_format chat_template --tokenizer_model " + folder), 0,
              "chat_template against openai");
  const auto preview = [&](const std::string& format) {
    return run("direct --workspace " + ws.string() + " -- data sft-preview --input examples/data/arith_chat.json" +
               " --format " + format + " --tokenizer-type ByteLevelTokenizer --tokenizer-model " + folder + " --limit 2");
  };
  const auto a = preview("chat_template"), b = preview("openai");
  ASSERT_EQ(a.code, 0) << a.out;
  const auto body = [](const std::string& out) { return out.substr(out.find("[0]"), out.rfind("2 of 400") - out.find("[0]")); };
  EXPECT_EQ(body(a.out), body(b.out));
  EXPECT_NE(a.out.find("(chat_template format)"), std::string::npos) << a.out;
  const auto missing = run("direct --workspace " + ws.string() +
                           " -- data sft-preview --input examples/data/arith_chat.json --format chat_template"
                           " --tokenizer-type ByteLevelTokenizer");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("set tokenizer_model to the Hugging Face model's folder"), std::string::npos) << missing.out;
  fs::remove_all(ws);
}

// An SFT run stopped after 3 steps and resumed goes on with the samples and losses of the run done
// in one go (the sample order is a function of the seed; the data position is in the checkpoint).
// The lm losses of a run's metrics.jsonl, by iteration.
std::map<int, double> losses_by_iteration(const fs::path& run_dir) {
  std::map<int, double> by_iteration;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("lm_loss") && j.contains("iteration")) by_iteration[j["iteration"].get<int>()] = j["lm_loss"];
  }
  return by_iteration;
}

// Three iterations, a save, and a resume for three more: the losses of `whole` (6 iterations), bit for bit.
void expect_resumes_exactly(const std::string& name, const std::string& extra, const std::vector<double>& whole,
                            const std::string& launcher = "direct") {
  const fs::path ws = workspace(name);
  for (const char* part : {" --train_iters 3 --lr_decay_iters 6", ""}) {
    const auto r = run(launcher + " --workspace " + ws.string() + " --exp-name run -- train posttrain --config " +
                       kExample + kTiny + extra + part);
    ASSERT_EQ(r.code, 0) << r.out;
  }
  std::map<int, double> by_iteration = losses_by_iteration(ws / "run");
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(by_iteration.size(), 6u);
  for (int i = 1; i <= 6; ++i) EXPECT_EQ(by_iteration[i], whole[size_t(i - 1)]) << "iteration " << i;
  fs::remove_all(ws);
}

TEST(Posttrain, ResumesExactly) { expect_resumes_exactly("resume", "", one_process()); }

// LoRA under ZeRO-2 (optim_grads) and FSDP (use_torch_fsdp2) at dp2: the frozen base sharded like
// any weight, only the adapters reduce-scattered and stepped. They give the one-process LoRA
// losses; each rank's AdamW state is its half of the adapters' (about half of one process's, where
// sharding the frozen tensors' state too would be many times that); a run stopped after 3 steps
// resumes bit for bit, and its checkpoint resumes on one process (no_shard) to the one-process losses.
TEST(Posttrain, LoraUnderZero2AndFsdpGivesTheOneProcessLossesAndResumes) {
  const std::vector<double>& one = lora_one_process();
  const std::string zero2 = kLora + " --data_parallel_sharding_strategy optim_grads",
                    fsdp = kLora + " --use_torch_fsdp2 true";
  const Recorded z = run_recorded("lora_zero2", zero2, "direct --nproc 2");
  const Recorded f = run_recorded("lora_fsdp", fsdp, "direct --nproc 2");
  expect_same(one, z.losses, 2e-5, "ZeRO-2 dp2");
  expect_same(one, f.losses, 2e-5, "FSDP dp2");
  EXPECT_GT(lora_one().optimizer_bytes, 0);
  for (double b : {z.optimizer_bytes, f.optimizer_bytes}) {
    EXPECT_GT(b, 0.4 * lora_one().optimizer_bytes);
    EXPECT_LT(b, 0.6 * lora_one().optimizer_bytes);
  }
  expect_resumes_exactly("lora_zero2_resume", zero2, z.losses, "direct --nproc 2");
  // Stopped after 3 steps under FSDP at dp2; resumed there (bit for bit) and, from a copy of the
  // run, on one process (the one-process losses).
  const fs::path ws = workspace("lora_fsdp_resume"), copy = workspace("lora_fsdp_to_one");
  const auto args = [&](const fs::path& w) {
    return " --workspace " + w.string() + " --exp-name run -- train posttrain --config " + kExample + kTiny + kLora;
  };
  const auto first = run("direct --nproc 2" + args(ws) + " --use_torch_fsdp2 true --train_iters 3 --lr_decay_iters 6");
  ASSERT_EQ(first.code, 0) << first.out;
  fs::create_directories(copy);
  fs::copy(ws / "run", copy / "run", fs::copy_options::recursive);
  const auto again = run("direct --nproc 2" + args(ws) + " --use_torch_fsdp2 true");
  ASSERT_EQ(again.code, 0) << again.out;
  const auto on_one = run("direct" + args(copy));
  ASSERT_EQ(on_one.code, 0) << on_one.out;
  std::map<int, double> fsdp_resumed = losses_by_iteration(ws / "run"), one_resumed = losses_by_iteration(copy / "run");
  ASSERT_EQ(fsdp_resumed.size(), 6u);
  ASSERT_EQ(one_resumed.size(), 6u);
  for (int i = 1; i <= 6; ++i) EXPECT_EQ(fsdp_resumed[i], f.losses[size_t(i - 1)]) << "FSDP resumed, iteration " << i;
  for (int i = 4; i <= 6; ++i)
    EXPECT_NEAR(one_resumed[i], one[size_t(i - 1)], 2e-5 * std::abs(one[size_t(i - 1)]))
        << "one process, iteration " << i;
  fs::remove_all(ws);
  fs::remove_all(copy);
}

// LoRA beside FP8 base linears (delayed scaling, whose amax histories are in the checkpoint).
TEST(Posttrain, LoraWithFp8ResumesExactly) {
  const std::string lora_fp8 = " --lora.enabled true --lora.dim 4 --fp8 hybrid --fp8_recipe delayed";
  const fs::path ws = workspace("lora_fp8_whole");
  const auto r = run("direct --workspace " + ws.string() + " --exp-name run -- train posttrain --config " + kExample +
                     kTiny + lora_fp8);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::map<int, double> by_iteration = losses_by_iteration(ws / "run");
  fs::remove_all(ws);
  std::vector<double> whole;
  for (const auto& [i, loss] : by_iteration) whole.push_back(loss);
  expect_resumes_exactly("lora_fp8_resume", lora_fp8, whole);
}

// A fine-tune starts from a checkpoint of ours (pretrained_checkpoint) or from a Hugging Face
// folder (hf_path, imported once): the same weights, so the same losses, below the first run's.
TEST(Posttrain, StartsFromACheckpointOrAHuggingFaceFolder) {
  const fs::path ws = workspace("start");
  auto posttrain = [&](const std::string& exp, const std::string& args) {
    const auto r = run("direct --workspace " + ws.string() + " --exp-name " + exp + " -- train posttrain --config " +
                       kExample + kTiny + args);
    EXPECT_EQ(r.code, 0) << r.out;
    return r.out;
  };
  posttrain("base", "");
  const auto exported = run("direct --workspace " + ws.string() + " -- checkpoint export --load " +
                            (ws / "base/checkpoints").string() + " --output " + (ws / "hf").string());
  ASSERT_EQ(exported.code, 0) << exported.out;
  const std::string from_hf = posttrain("from_hf", " --hf_path " + (ws / "hf").string() + " --finetune true");
  EXPECT_NE(from_hf.find("hf_path: imported " + (ws / "hf").string()), std::string::npos) << from_hf;
  EXPECT_TRUE(fs::exists(ws / "from_hf/hf_import/iter_0000000"));
  posttrain("from_ckpt", " --pretrained_checkpoint " + (ws / "base/checkpoints").string());
  const std::vector<double> base = losses(ws / "base"), a = losses(ws / "from_hf"), b = losses(ws / "from_ckpt");
  expect_same(a, b, 1e-6, "hf_path and pretrained_checkpoint of the same weights");
  ASSERT_FALSE(a.empty());
  EXPECT_LT(a.front(), base.front() - 1.0) << "the fine-tune starts from the trained weights";
  fs::remove_all(ws);
}

TEST(Posttrain, RefusesWhatIsNotBuiltByName) {
  const std::string ws = " --workspace " + workspace("refuse").string();
  auto out = [&](const std::string& task, const std::string& args) {
    const auto r = run("direct" + ws + " -- train " + task + " --config " + args);
    EXPECT_NE(r.code, 0) << r.out;
    return r.out;
  };
  EXPECT_NE(out("posttrain", kRoot + "/examples/dpo_tiny_cpu.yaml --dpo_beta 0").find("dpo_beta must be positive, got 0"),
            std::string::npos);
  EXPECT_NE(out("posttrain", kExample + " --lora.enabled true --lora.dropout 1")
                .find("lora.dropout must be in [0, 1) (the probability of dropping an element), got 1"),
            std::string::npos);
  EXPECT_NE(out("posttrain", kExample + " --lora.enabled true --lora.target_modules [linear_qkv,linear_q_proj]")
                .find("lora.target_modules 'linear_q_proj' is not one of: linear_qkv, linear_proj, linear_fc1, "
                      "linear_fc2"),
            std::string::npos);
  EXPECT_NE(out("posttrain", kExample + " --lora.enabled true --lora.exclude_modules [linear_qkv]")
                .find("lora.exclude_modules is not supported: matching the linears by exclusion is not built"),
            std::string::npos);
  EXPECT_NE(out("posttrain", kExample + " --lora.enabled true --use_torch_fsdp2 true --peft_adapter_path /no/such")
                .find("starting LoRA adapters from a PEFT folder under ZeRO-2 / FSDP (optim_grads, "
                      "optim_grads_params, use_torch_fsdp2) is not built"),
            std::string::npos);
  EXPECT_NE(
      out("pretrain", kExample).find("is a post-training config (modules.post_trainer): run it with train posttrain"),
      std::string::npos);
  EXPECT_NE(out("posttrain", kRoot + "/examples/tiny_llama_cpu.yaml").find("is a pretraining config"),
            std::string::npos);
  EXPECT_NE(out("posttrain", kExample + " --sft_dataset_name tatsu-lab/alpaca")
                .find("sft_dataset_name 'tatsu-lab/alpaca' is not a local file"),
            std::string::npos);
  EXPECT_NE(out("posttrain", kExample + " --hf_path NousResearch/Meta-Llama-3-8B")
                .find("hf_path 'NousResearch/Meta-Llama-3-8B' is not a local Hugging Face model folder"),
            std::string::npos);
}

// Primus's native SFT configs, unchanged: qwen3_30B_A3B's (its precision-aware optimizer keys, and
// mtp_num_layers 0: no multi-token prediction; shrunk to 16 experts on one rank, its profiling
// off as it starts at step 10), llama3_8B's SFT (LoRA on), its LoRA SFT (which extends it and
// writes its own lora block at the top level, where Primus reads no trainer key) and its packed SFT
// with LoRA switched off, and DeepSeek-V2-Lite's (MoE and MLA, shrunk; LoRA on the routed and
// shared experts too, under expert_model_parallel_size 2 on two ranks) train three iterations on
// the shipped chat set.
const std::string kPrimusTiny =
    " --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --num-query-groups 2"
    " --vocab-size 320 --seq-length 256 --max-position-embeddings 256 --micro-batch-size 2 --global-batch-size 4"
    " --train-iters 3 --lr 1e-3 --tokenizer-type ByteLevelTokenizer --sft-dataset-name examples/data/arith_chat.json";
const std::string kNoLora = " --modules.post_trainer.overrides.lora.enabled false";
// hf_path names a Hub model and finetune asks for its weights: the tiny runs start from random ones.
const std::string kFromScratch = " --hf_path null --finetune false";

TEST(PrimusSftConfigs, LoadRefuseAndTrain) {
  const fs::path ws = workspace("primus");
  auto posttrain = [&](const std::string& config, const std::string& args, const std::string& launcher = "direct") {
    return run(launcher + " --workspace " + ws.string() + " -- train posttrain --config " + kRoot +
               "/tests/integration/primus_configs/sft/" + config + ".yaml" + kPrimusTiny + args);
  };
  const auto qwen = posttrain("qwen3_30B_A3B-BF16-sft-packed", kFromScratch +
                                                                  " --profile false --expert-model-parallel-size 1"
                                                                  " --num-experts 16 --moe-ffn-hidden-size 32");
  ASSERT_EQ(qwen.code, 0) << qwen.out;
  EXPECT_NE(qwen.out.find("precision-aware optimizer: main_grads_dtype bf16"), std::string::npos) << qwen.out;
  EXPECT_NE(qwen.out.find("iteration      3/     3"), std::string::npos) << qwen.out;
  const auto llama = posttrain("llama3_8B-BF16-sft", kFromScratch);
  ASSERT_EQ(llama.code, 0) << llama.out;
  EXPECT_NE(llama.out.find("LoRA: dim 32, alpha 32 (scale 1): this rank trains"), std::string::npos) << llama.out;
  // The LoRA config, unchanged: the `lora:` of its base's overrides applies; its top-level keys
  // (lora with dropout 0.05, lr, batch sizes, train_iters) have no effect, as in Primus. Its
  // dropout 0.05 given where Primus reads it, the overrides, trains.
  const auto lora = run("direct --workspace " + ws.string() + " -- train posttrain --config " + kRoot +
                        "/tests/integration/primus_configs/sft/llama3_8B-BF16-lora-sft.yaml" + kPrimusTiny +
                        kFromScratch + " --exp_name llama3_8B-lora-sft --modules.post_trainer.overrides.lora.dropout 0.05");
  ASSERT_EQ(lora.code, 0) << lora.out;
  EXPECT_NE(lora.out.find("lora, lr, min_lr, micro_batch_size, global_batch_size, train_iters, lr_warmup_iters (a "
                          "top-level key: Primus reads trainer keys only under modules.<trainer>.overrides)"),
            std::string::npos)
      << lora.out;
  EXPECT_NE(lora.out.find("LoRA: dim 32, alpha 32 (scale 1), dropout 0.05 pre"), std::string::npos) << lora.out;
  const auto packed = posttrain("llama3_8B-BF16-sft-packed", kNoLora + kFromScratch);
  ASSERT_EQ(packed.code, 0) << packed.out;
  EXPECT_NE(packed.out.find("conversations packed into"), std::string::npos) << packed.out;
  // The packed SQuAD config (LoRA on, its format squad, packed without per-document attention), its
  // data set a local file of SQuAD's record shape; profiling off as it starts at step 10.
  const fs::path squad = ws / "squad.jsonl";
  fs::create_directories(ws);
  {
    std::ofstream out(squad);
    for (int i = 0; i < 24; ++i)
      out << R"({"id": ")" << i << R"(", "title": "Sums", "context": "Adding )" << i << " and " << i + 3
          << R"( gives )" << 2 * i + 3 << R"(.", "question": "What is )" << i << " + " << i + 3
          << R"(?", "answers": {"text": [")" << 2 * i + 3 << R"("], "answer_start": [0]}})" << "\n";
  }
  const auto squad_run = posttrain("llama3_8B-BF16-sft-packed-squad",
                                   kFromScratch + " --profile false --sft_dataset_name " + squad.string());
  ASSERT_EQ(squad_run.code, 0) << squad_run.out;
  EXPECT_NE(squad_run.out.find("conversations packed into"), std::string::npos) << squad_run.out;
  EXPECT_NE(squad_run.out.find("LoRA: dim"), std::string::npos) << squad_run.out;
  const auto deepseek = posttrain("deepseek_v2_lite-BF16-sft",
                                  kFromScratch +
                                      " --moe-layer-freq 1 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64"
                                      " --kv-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 16 --v-head-dim 16"
                                      " --expert-model-parallel-size 2",
                                  "direct --nproc 2");
  ASSERT_EQ(deepseek.code, 0) << deepseek.out;
  EXPECT_NE(deepseek.out.find("LoRA: dim"), std::string::npos) << deepseek.out;
  EXPECT_NE(deepseek.out.find(" (ep 2)"), std::string::npos) << deepseek.out;
  for (const char* run : {"llama3_8B-sft", "llama3_8B-lora-sft", "llama3_8B-sft-packed", "llama3_8B-sft-packed-squad",
                          "deepseek_v2_lite-sft"}) {
    const std::vector<double> l = losses(ws / run);
    ASSERT_EQ(l.size(), 3u) << run;
    for (double x : l) EXPECT_TRUE(std::isfinite(x) && x > 0) << run;
  }
  fs::remove_all(ws);
}

// DPO (stage: dpo) on the example's preference pairs, shrunk to fp32 and three steps: the first
// step's loss is ln 2 with every reward 0 (the policy is the reference), and two data-parallel
// ranks give the one-process losses, rewards and gradient norms; a pair without `rejected` is an
// error naming its record.
TEST(Dpo, FirstStepIsLn2AndDp2Tp2Cp2GiveTheOneProcessRun) {
  const std::string tiny =
      " --num_layers 2 --hidden_size 64 --ffn_hidden_size 128 --num_attention_heads 4 --num_query_groups 2"
      " --seq_length 128 --micro_batch_size 1 --global_batch_size 4 --train_iters 3 --lr_warmup_iters 0"
      " --log_interval 1 --eval_interval 0 --bf16 false";
  std::vector<std::vector<nlohmann::json>> runs;
  const std::vector<std::pair<int, std::string>> layouts = {
      {1, ""}, {2, ""}, {2, " --tensor_model_parallel_size 2"}, {2, " --context_parallel_size 2"}};
  for (const auto& [n, layout] : layouts) {
    const fs::path ws = workspace("dpo" + std::to_string(runs.size()));
    const auto r = run("direct --nproc " + std::to_string(n) + " --workspace " + ws.string() +
                       " --exp-name run -- train posttrain --config " + kRoot + "/examples/dpo_tiny_cpu.yaml" + tiny +
                       layout);
    ASSERT_EQ(r.code, 0) << r.out;
    const char* ran = layout.find("tensor") != std::string::npos    ? "world 2 = tp 2 x pp 1 x dp 1"
                      : layout.find("context") != std::string::npos ? "world 2 = tp 1 x cp 2 x pp 1 x dp 1"
                      : n == 2                                      ? "world 2 = tp 1 x pp 1 x dp 2"
                                                                    : "world 1";
    EXPECT_NE(r.out.find(ran), std::string::npos) << r.out;
    std::vector<nlohmann::json> rows;
    std::ifstream in(ws / "run" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("lm_loss") && j.contains("iteration")) rows.push_back(j);
    }
    ASSERT_EQ(rows.size(), 3u) << r.out;
    runs.push_back(rows);
    fs::remove_all(ws);
  }
  const auto& first = runs[0][0];
  EXPECT_NEAR(first["lm_loss"].get<double>(), std::log(2.0), 1e-12);
  for (const char* k : {"rewards_chosen", "rewards_rejected", "rewards_margins"})
    EXPECT_EQ(first[k].get<double>(), 0.0) << k;
  EXPECT_NE(runs[0][2]["lm_loss"].get<double>(), runs[0][0]["lm_loss"].get<double>());  // it trained
  for (size_t l = 1; l < layouts.size(); ++l)
    for (size_t i = 0; i < 3; ++i)
      for (const char* k : {"lm_loss", "grad_norm", "rewards_margins", "rewards_accuracies"}) {
        const double a = runs[0][i][k].get<double>(), b = runs[l][i][k].get<double>();
        EXPECT_NEAR(b, a, 1e-5 * std::max(1.0, std::abs(a))) << k << " iteration " << i + 1 << layouts[l].second;
      }

  const fs::path dir = workspace("dpo-bad");
  fs::create_directories(dir);
  std::ofstream(dir / "pairs.jsonl") << "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}\n"
                                        "{\"prompt\": \"2+2=\", \"chosen\": \"4\"}\n";
  const auto bad = run("direct --workspace " + (dir / "ws").string() + " -- train posttrain --config " + kRoot +
                       "/examples/dpo_tiny_cpu.yaml" + tiny + " --sft_dataset_name " + (dir / "pairs.jsonl").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("pairs.jsonl"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("rejected"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}

}  // namespace
