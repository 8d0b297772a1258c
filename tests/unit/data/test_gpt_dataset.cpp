#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "test_util.h"

namespace primus::data {
namespace {

namespace fs = std::filesystem;
using testing::temp_dir;

// n documents; document d has 5 + (7d mod 13) tokens valued base + 100 d + k, so any token names
// its document and position.
std::string make_dataset(const fs::path& dir, const std::string& name, int n, int32_t base = 0) {
  std::string prefix = (dir / name).string();
  IndexedDatasetBuilder b(prefix, TokenDType::i32);
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> t;
    for (int k = 0; k < 5 + (7 * d) % 13; ++k) t.push_back(base + 100 * d + k);
    b.add_item(t);
    b.end_document();
  }
  b.finalize();
  return prefix;
}

// The token stream the document index describes (epochs concatenated).
std::vector<int32_t> stream(const IndexedDataset& data, const GPTDataset& ds) {
  std::vector<int32_t> s;
  for (int32_t d : ds.document_index()) data.append(d, 0, -1, s);
  return s;
}

TEST(GPTDataset, SamplesAreConsecutiveWindowsOfTheDocumentStream) {
  auto dir = temp_dir();
  auto data = std::make_shared<IndexedDataset>(make_dataset(dir, "a", 50));
  const int64_t seq = 16;
  for (int64_t want : {int64_t{0}, int64_t{100}}) {  // one epoch; several epochs
    GPTDataset ds(data, 0, 50, want, seq, 7, "train", "", false);
    auto s = stream(*data, ds);
    int64_t expected = (static_cast<int64_t>(s.size()) - 1) / seq;
    EXPECT_EQ(ds.size(), expected);
    if (want > 0) {
      EXPECT_GE(ds.size(), want);
    }
    std::set<int64_t> seen;
    for (int64_t i = 0; i < ds.size(); ++i) {
      auto got = ds.get(i);
      ASSERT_EQ(got.size(), static_cast<size_t>(seq + 1));
      int64_t start = ds.shuffle_index()[i] * seq;  // sample k covers stream [k*seq, k*seq + seq]
      ASSERT_TRUE(std::equal(got.begin(), got.end(), s.begin() + start)) << "sample " << i;
      seen.insert(ds.shuffle_index()[i]);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), ds.size()) << "shuffle index is a permutation";
  }
  GPTDataset multi(data, 0, 50, 100, seq, 7, "train", "", false);
  EXPECT_GT(multi.num_epochs(), 1);
}

TEST(GPTDataset, DeterministicForASeedAndCached) {
  auto dir = temp_dir();
  auto data = std::make_shared<IndexedDataset>(make_dataset(dir, "a", 40));
  GPTDataset a(data, 0, 40, 0, 8, 1234, "train", "", false);
  GPTDataset b(data, 0, 40, 0, 8, 1234, "train", "", false);
  GPTDataset c(data, 0, 40, 0, 8, 4321, "train", "", false);
  EXPECT_EQ(a.shuffle_index(), b.shuffle_index());
  EXPECT_EQ(a.document_index(), b.document_index());
  EXPECT_NE(a.shuffle_index(), c.shuffle_index());
  EXPECT_NE(a.document_index(), c.document_index());
  std::vector<int32_t> sorted = a.document_index();
  std::sort(sorted.begin(), sorted.end());
  for (int d = 0; d < 40; ++d) EXPECT_EQ(sorted[d], d);

  // Built once, then loaded: beside the data by default, named by a hash of the parameters.
  GPTDataset first(data, 0, 40, 0, 8, 1234, "train", "", true);
  EXPECT_FALSE(first.loaded_from_cache());
  EXPECT_EQ(fs::path(first.cache_prefix()).parent_path(), fs::path(data->prefix()) / "cache/GPTDataset_indices");
  EXPECT_TRUE(fs::exists(first.cache_prefix() + "-shuffle_index.bin"));
  GPTDataset again(data, 0, 40, 0, 8, 1234, "train", "", true);
  EXPECT_TRUE(again.loaded_from_cache());
  for (int64_t i = 0; i < again.size(); ++i) ASSERT_EQ(again.get(i), a.get(i));
  GPTDataset other(data, 0, 40, 0, 9, 1234, "train", "", true);
  EXPECT_FALSE(other.loaded_from_cache());
  EXPECT_NE(other.cache_prefix(), first.cache_prefix());

  // A damaged cache file is rebuilt, not trusted.
  testing::spit(first.cache_prefix() + "-shuffle_index.bin", "garbage");
  GPTDataset rebuilt(data, 0, 40, 0, 8, 1234, "train", "", true);
  EXPECT_FALSE(rebuilt.loaded_from_cache());
  EXPECT_EQ(rebuilt.shuffle_index(), a.shuffle_index());
}

TEST(GPTDataset, SplitsFollowMegatron) {
  auto r = split_ranges(parse_split("969,30,1"), 1000);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{0, 969}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{969, 999}));
  EXPECT_EQ(r[2], (std::pair<int64_t, int64_t>{999, 1000}));
  auto q = split_ranges(parse_split("1,1,1"), 10);
  EXPECT_EQ(q[2].second, 10);
  EXPECT_EQ(q[0].second - q[0].first + q[1].second - q[1].first + q[2].second - q[2].first, 10);
  EXPECT_THROW(parse_split("a,b"), Error);
  EXPECT_THROW(parse_split("0,0,0"), Error);
  EXPECT_THROW(parse_split("1,2,3,4"), Error);

  auto dir = temp_dir();
  GPTDatasetConfig c;
  c.data_path = {make_dataset(dir, "a", 300)};
  c.split = "90,8,2";
  c.seq_length = 8;
  c.build_cache = false;
  auto ds = build_gpt_datasets(c);
  ASSERT_TRUE(ds.train && ds.valid && ds.test);
  // Documents of the splits are disjoint: tokens name their document (token / 100).
  auto docs_of = [](const SampleDataset& s) {
    std::set<int32_t> d;
    for (int64_t i = 0; i < s.size(); ++i)
      for (int32_t t : s.get(i)) d.insert(t / 100);
    return d;
  };
  auto tr = docs_of(*ds.train), va = docs_of(*ds.valid), te = docs_of(*ds.test);
  EXPECT_LT(*tr.rbegin(), *va.begin());
  EXPECT_LT(*va.rbegin(), *te.begin());
  EXPECT_GE(*te.begin(), 270);
}

TEST(GPTDataset, BlendingProportionsWithinOnePercent) {
  auto dir = temp_dir();
  GPTDatasetConfig c;
  c.data_path = {"0.3", make_dataset(dir, "a", 200, 0), "0.7", make_dataset(dir, "b", 100, 1000000)};
  c.split = "1,0,0";
  c.seq_length = 8;
  c.num_samples = {5000, 0, 0};
  c.build_cache = false;
  auto ds = build_gpt_datasets(c);
  ASSERT_TRUE(ds.train);
  EXPECT_FALSE(ds.valid);
  ASSERT_EQ(ds.train->size(), 5000);
  for (int64_t n : {int64_t{500}, int64_t{5000}}) {
    int64_t from_b = 0;
    for (int64_t i = 0; i < n; ++i) from_b += ds.train->get(i)[0] >= 1000000;
    EXPECT_NEAR(static_cast<double>(from_b) / n, 0.7, 0.01) << "first " << n << " samples";
  }
  // Same seed, same blend.
  auto again = build_gpt_datasets(c);
  for (int64_t i = 0; i < 50; ++i) ASSERT_EQ(again.train->get(i), ds.train->get(i));
}

TEST(GPTDataset, ResumeAtConsumedSamplesGivesTheSameNextSamples) {
  auto dir = temp_dir();
  GPTDatasetConfig c;
  c.data_path = {make_dataset(dir, "a", 200)};
  c.split = "1,0,0";
  c.seq_length = 8;
  c.num_samples = {400, 0, 0};
  auto ds = build_gpt_datasets(c).train;
  const int64_t mbs = 2, dp = 2;
  std::vector<std::vector<int32_t>> full;
  {
    PretrainingSampler s0(ds->size(), 0, mbs, 0, dp), s1(ds->size(), 0, mbs, 1, dp);
    for (int step = 0; step < 20; ++step) {
      auto a = s0.next(), b = s1.next();
      for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k] + mbs, b[k]) << "ranks take disjoint slices";
      for (int64_t i : a) full.push_back(ds->get(i));
    }
  }
  // Restart after 12 steps: a fresh dataset object (loaded from the cache) and a sampler at 12*mbs*dp.
  auto ds2 = build_gpt_datasets(c).train;
  PretrainingSampler resumed(ds2->size(), 12 * mbs * dp, mbs, 0, dp);
  for (int step = 12; step < 20; ++step) {
    auto a = resumed.next();
    for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(ds2->get(a[k]), full[step * mbs + k]) << "step " << step;
  }
  PretrainingSampler end(10, 8, 2, 0, 2);
  EXPECT_TRUE(end.next().empty());
  EXPECT_THROW(PretrainingSampler(10, 11, 1, 0, 1), Error);
}

TEST(GPTDataset, BadConfigurationsAreNamed) {
  auto dir = temp_dir();
  GPTDatasetConfig c;
  c.seq_length = 8;
  c.build_cache = false;
  c.data_path = {(dir / "nothing").string()};
  try {
    build_gpt_datasets(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing.idx"), std::string::npos) << e.what();
  }
  c.data_path = {"0.5", make_dataset(dir, "a", 20), "0.5"};
  EXPECT_THROW(build_gpt_datasets(c), Error);
  c.data_path = {make_dataset(dir, "tiny", 1)};
  c.seq_length = 1000;
  c.split = "1,0,0";
  EXPECT_THROW(build_gpt_datasets(c), Error);  // fewer tokens than one sample
}

}  // namespace
}  // namespace primus::data
