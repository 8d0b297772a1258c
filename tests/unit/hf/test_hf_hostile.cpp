// Issue 32, Hugging Face import and export with hostile but realistic inputs: an export over a
// folder that holds another model, absurd sizes in config.json, NaN weights, a disk that fills up,
// a tokenizer.json nested 50,000 deep. Each case failed (or silently did the wrong thing) before.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hf/hf_checkpoint.h"
#include "hf/safetensors.h"
#include "hf_peer.h"
#include "support/error_of.h"
#include "support/hostile_files.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace primus;

namespace {

using test::error_of;
using test::peer_write;

const std::string kCli = PRIMUS_CLI_PATH;

test::CommandResult cli(const test::TempDir& t, const std::string& args, const std::string& env = "") {
  return test::run_command(fmt::format("cd {} && {} {} direct -- {} 2>&1", t.path.string(), env, kCli, args));
}

// The folder's tensors as fp32, by name.
std::map<std::string, std::vector<float>> weights_of(const fs::path& dir) {
  hf::SafetensorsReader r(dir.string());
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : r.tensors()) out[name] = r.as_f32(name);
  return out;
}

// A copy of the Hugging Face folder `src` at `dst` with every weight passed through `f`.
void rewrite_weights(const fs::path& src, const fs::path& dst,
                     const std::function<void(const std::string&, std::vector<float>&)>& f) {
  fs::create_directories(dst);
  fs::copy_file(src / "config.json", dst / "config.json", fs::copy_options::overwrite_existing);
  hf::SafetensorsReader r(src.string());
  std::vector<hf::TensorOut> ts;
  for (const auto& [name, e] : r.tensors()) {
    std::vector<float> v = r.as_f32(name);
    f(name, v);
    ts.push_back({name, "F32", e.shape, hf::f32_to_bytes(v, "F32")});
  }
  hf::write_safetensors(dst.string(), ts, 5'000'000'000);
}

void edit_config(const fs::path& dir, const std::function<void(json&)>& edit) {
  json c;
  {
    std::ifstream f(dir / "config.json");
    c = json::parse(f);
  }
  edit(c);
  std::ofstream(dir / "config.json") << c.dump();
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// Export wrote over an existing folder's config.json and model.safetensors and left its stale
// index; import then preferred the index and brought back the old weights. Now a non-empty
// --output is refused (and left alone) without --overwrite; with it the previous model's files go
// and the round trip returns the new weights.
TEST(HfHostile, ExportRefusesANonEmptyFolderAndOverwriteReplacesTheModel) {
  test::TempDir t("primus_hf_hostile_");
  peer_write((t.path / "old").string(), "tiny", "F32", 5'000'000'000);
  rewrite_weights(t.path / "old", t.path / "new", [](const std::string&, std::vector<float>& v) {
    for (float& x : v) x = -0.5f * x + 0.01f;
  });
  hf::import_hf({(t.path / "old").string(), (t.path / "ck_old").string(), "", false});
  hf::import_hf({(t.path / "new").string(), (t.path / "ck_new").string(), "", false});

  auto r = cli(t, "checkpoint export --load ck_old --output out --max-shard-size 100000");
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(t.path / "out/model.safetensors.index.json"));
  std::ofstream(t.path / "out/README.md") << "my notes\n";
  const auto before = names_in(t.path / "out");

  r = cli(t, "checkpoint export --load ck_new --output out");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--output out is not empty"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("wrote"), std::string::npos) << r.out;
  EXPECT_EQ(names_in(t.path / "out"), before);  // untouched

  r = cli(t, "checkpoint export --load ck_new --output out --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(names_in(t.path / "out"), (std::vector<std::string>{"README.md", "config.json", "model.safetensors"}));
  for (const auto& name : names_in(t.path)) EXPECT_EQ(name.find(".export-"), std::string::npos) << name;

  r = cli(t, "checkpoint import --hf out --save ck_round");
  ASSERT_EQ(r.code, 0) << r.out;
  hf::ExportOptions eo;
  eo.checkpoint = (t.path / "ck_round").string();
  eo.out_dir = (t.path / "round").string();
  hf::export_hf(eo);
  const auto want = weights_of(t.path / "new"), got = weights_of(t.path / "round");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, v] : want) EXPECT_EQ(got.at(name), v) << name;
  EXPECT_NE(got.at("model.embed_tokens.weight"), weights_of(t.path / "old").at("model.embed_tokens.weight"));
}

// A config.json with absurd sizes ended in std::bad_alloc after allocating (25 s under an 8 GB cap
// for 1e6 layers). The memory an import needs is now estimated from the config first.
TEST(HfHostile, AbsurdSizesAreRefusedBeforeAllocatingInUnderASecond) {
  test::TempDir t("primus_hf_hostile_");
  peer_write((t.path / "src").string(), "tiny", "F32", 5'000'000'000);
  const std::string src = (t.path / "src").string(), save = (t.path / "save").string();
  struct Case {
    const char* key;
    json value;
  };
  for (const Case& c : {Case{"num_hidden_layers", 1e6}, Case{"hidden_size", 1e9}, Case{"vocab_size", int64_t(1) << 40}}) {
    SCOPED_TRACE(c.key);
    edit_config(src, [&](json& j) {
      j["num_hidden_layers"] = 2, j["hidden_size"] = 64, j["vocab_size"] = 256;
      j[c.key] = c.value;
    });
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { hf::import_hf({src, save, "", false}); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 1.0);
    EXPECT_NE(e.find("importing it needs about"), std::string::npos) << e;
    EXPECT_NE(e.find("free (MemAvailable)"), std::string::npos) << e;
    EXPECT_NE(e.find("Check num_hidden_layers, hidden_size"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(save));
  }
  edit_config(src, [](json& j) { j["num_hidden_layers"] = 1e6; });
  const std::string e = error_of([&] { hf::import_hf({src, save, "", false}); });
  EXPECT_NE(e.find("1000000 layers of"), std::string::npos) << e;
}

// NaN and infinite weights imported quietly; now they are refused by tensor, or imported with a
// warning when asked.
TEST(HfHostile, NonFiniteWeightsAreRefusedUnlessAllowed) {
  test::TempDir t("primus_hf_hostile_");
  peer_write((t.path / "good").string(), "tiny", "F32", 5'000'000'000);
  rewrite_weights(t.path / "good", t.path / "src", [](const std::string& name, std::vector<float>& v) {
    if (name == "model.layers.1.mlp.down_proj.weight") v[7] = std::nanf(""), v[9] = -INFINITY;
  });
  const std::string src = (t.path / "src").string();
  const std::string e = error_of([&] { hf::import_hf({src, (t.path / "a").string(), "", false}); });
  EXPECT_NE(e.find("tensor 'model.layers.1.mlp.down_proj.weight' has 1 NaN and 1 infinite values (of 6144)"),
            std::string::npos) << e;
  EXPECT_NE(e.find("--allow-nonfinite"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(t.path / "a"));
  hf::ImportOptions o{src, (t.path / "b").string(), "", false};
  o.allow_nonfinite = true;
  EXPECT_NO_THROW(hf::import_hf(o));
}

// Failed imports and exports left empty folders and printed "imported X into" before the error.
TEST(HfHostile, FailedImportsAndExportsLeaveNothingBehind) {
  test::TempDir t("primus_hf_hostile_");
  peer_write((t.path / "src").string(), "tiny", "F32", 5'000'000'000);
  const std::string full = "PRIMUS_FAULT_DISK_FREE=1000";  // the disk has 1000 bytes left
  auto r = cli(t, "checkpoint import --hf src --save new/a/b", full);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not enough disk space"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("imported"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(t.path / "new"));
  r = cli(t, "checkpoint import --hf src --save ck");
  ASSERT_EQ(r.code, 0) << r.out;
  r = cli(t, "checkpoint export --load ck --output exported/hf", full);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not enough disk space"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(t.path / "exported"));
  // A tokenizer.json nested 50,000 deep: an error (it was SIGSEGV), and no checkpoint folder.
  test::write_nested_normalizer_tokenizer(t.path / "deep", 50'000);
  r = cli(t, "checkpoint import --hf src --save ck2 --tokenizer deep");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("more than 64 levels deep"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(t.path / "ck2"));
}
