#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

namespace primus::data {
namespace {

using testing::slurp;
using testing::spit;
using testing::temp_dir;

template <typename T>
T read_at(const std::string& s, size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof(T));
  return v;
}

std::string expect_error(const std::string& prefix) {
  try {
    IndexedDataset ds(prefix);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "opening " << prefix << " should fail";
  return "";
}

// Two documents: the first of two sequences (sentences), the second of one.
std::string write_sample(const std::filesystem::path& dir, TokenDType dtype = TokenDType::u16) {
  std::string prefix = (dir / "ds").string();
  IndexedDatasetBuilder b(prefix, dtype);
  b.add_item(std::vector<int32_t>{1, 2, 3});
  b.add_item(std::vector<int32_t>{4, 5});
  b.end_document();
  b.add_item(std::vector<int32_t>{60000, 7, 8, 9});
  b.end_document();
  b.finalize();
  return prefix;
}

TEST(IndexedDataset, IdxLayoutFieldByField) {
  auto dir = temp_dir();
  std::string prefix = write_sample(dir);
  std::string idx = slurp(prefix + ".idx");
  // Megatron's MMIDIDX: magic, u64 version, u8 dtype code, u64 sequences, u64 document entries,
  // int32 lengths, int64 byte pointers, int64 document indices.
  // Then this project's 24-byte pairing trailer, which Megatron's reader ignores.
  ASSERT_EQ(idx.size(), 9u + 8 + 1 + 8 + 8 + 3 * 4 + 3 * 8 + 3 * 8 + 24);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(read_at<uint64_t>(idx, 9), 1u);
  EXPECT_EQ(read_at<uint8_t>(idx, 17), 8u);  // uint16
  EXPECT_EQ(read_at<uint64_t>(idx, 18), 3u);
  EXPECT_EQ(read_at<uint64_t>(idx, 26), 3u);
  size_t o = 34;
  EXPECT_EQ(read_at<int32_t>(idx, o), 3);
  EXPECT_EQ(read_at<int32_t>(idx, o + 4), 2);
  EXPECT_EQ(read_at<int32_t>(idx, o + 8), 4);
  o += 12;
  EXPECT_EQ(read_at<int64_t>(idx, o), 0);
  EXPECT_EQ(read_at<int64_t>(idx, o + 8), 6);   // 3 tokens * 2 bytes
  EXPECT_EQ(read_at<int64_t>(idx, o + 16), 10);
  o += 24;
  EXPECT_EQ(read_at<int64_t>(idx, o), 0);
  EXPECT_EQ(read_at<int64_t>(idx, o + 8), 2);
  EXPECT_EQ(read_at<int64_t>(idx, o + 16), 3);
  o += 24;
  EXPECT_EQ(idx.substr(o, 8), "PRMSTIE1");
  EXPECT_EQ(read_at<uint64_t>(idx, o + 8), 18u);  // the .bin's size
  std::string bin = slurp(prefix + ".bin");
  ASSERT_EQ(bin.size(), 18u);
  EXPECT_EQ(read_at<uint16_t>(bin, 0), 1);
  EXPECT_EQ(read_at<uint16_t>(bin, 10), 60000);
  EXPECT_EQ(read_at<uint16_t>(bin, 16), 9);
}

TEST(IndexedDataset, ReadsBackWhatWasWritten) {
  auto dir = temp_dir();
  for (TokenDType t : {TokenDType::u16, TokenDType::i32, TokenDType::i64}) {
    std::string prefix = write_sample(dir, t);
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), t);
    EXPECT_EQ(ds.num_sequences(), 3u);
    EXPECT_EQ(ds.num_documents(), 2u);
    EXPECT_EQ(ds.num_tokens(), 9);
    EXPECT_EQ(ds.get(0), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(ds.get(2), (std::vector<int32_t>{60000, 7, 8, 9}));
    EXPECT_EQ(ds.get(2, 1, 2), (std::vector<int32_t>{7, 8}));
    EXPECT_THROW(ds.get(3), Error);
    EXPECT_THROW(ds.get(1, 1, 5), Error);
  }
}

TEST(IndexedDataset, DtypeChoiceFollowsMegatron) {
  EXPECT_EQ(optimal_dtype(32000), TokenDType::u16);
  EXPECT_EQ(optimal_dtype(65499), TokenDType::u16);
  EXPECT_EQ(optimal_dtype(65500), TokenDType::i32);
  EXPECT_EQ(optimal_dtype(128256), TokenDType::i32);
  auto dir = temp_dir();
  IndexedDatasetBuilder b((dir / "x").string(), TokenDType::u16);
  EXPECT_THROW(b.add_item(std::vector<int32_t>{70000}), Error);
}

TEST(IndexedDataset, CorruptFilesAreClearErrors) {
  auto dir = temp_dir();
  std::string prefix = write_sample(dir);
  std::string idx = slurp(prefix + ".idx"), bin = slurp(prefix + ".bin");

  spit(prefix + ".bin", bin.substr(0, bin.size() - 2));
  EXPECT_NE(expect_error(prefix).find("do not match"), std::string::npos);
  spit(prefix + ".bin", bin);

  spit(prefix + ".idx", idx.substr(0, idx.size() - 8));
  EXPECT_NE(expect_error(prefix).find("truncated"), std::string::npos);
  spit(prefix + ".idx", idx.substr(0, 20));
  EXPECT_NE(expect_error(prefix).find("truncated"), std::string::npos);

  std::string bad = idx;
  bad[17] = 9;
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("unknown dtype code 9"), std::string::npos);

  bad = idx;
  bad[0] = 'X';
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("MMIDIDX"), std::string::npos);

  bad = idx;
  bad[9] = 2;
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("version 2"), std::string::npos);

  bad = idx;
  int64_t p = 4;  // second pointer no longer follows the first sequence
  std::memcpy(bad.data() + 34 + 12 + 8, &p, 8);
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("sequence 1"), std::string::npos);

  bad = idx;
  uint64_t huge = 1ull << 60;  // a count that would overflow a size computation
  std::memcpy(bad.data() + 18, &huge, 8);
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("truncated or corrupt"), std::string::npos);

  std::filesystem::remove(prefix + ".bin");
  spit(prefix + ".idx", idx);
  EXPECT_NE(expect_error(prefix).find("ds.bin"), std::string::npos);
}

// Issue 21: a .bin/.idx pair from two corpora that happen to have the same size trained silently on
// wrong boundaries. The trailer ties them; an .idx as Megatron writes it (no trailer) still opens.
TEST(IndexedDataset, ABinFromAnotherCorpusOfTheSameSizeIsRefused) {
  auto dir = temp_dir();
  std::filesystem::create_directories(dir / "a");
  const std::string a = write_sample(dir / "a");
  {
    IndexedDatasetBuilder b((dir / "b").string(), TokenDType::u16);  // same lengths, other tokens
    b.add_item(std::vector<int32_t>{4, 5, 6});
    b.add_item(std::vector<int32_t>{7, 8});
    b.end_document();
    b.add_item(std::vector<int32_t>{9, 9, 9, 9});
    b.end_document();
    b.finalize();
  }
  ASSERT_EQ(std::filesystem::file_size(a + ".bin"), std::filesystem::file_size((dir / "b.bin").string()));
  std::filesystem::copy_file(dir / "b.bin", a + ".bin", std::filesystem::copy_options::overwrite_existing);
  try {
    IndexedDataset ds(a);
    ADD_FAILURE() << "opened a mismatched pair";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not the .bin"), std::string::npos) << e.what();
  }
  // Without the trailer (Megatron's own files) the pair is read as before.
  std::string idx = slurp(a + ".idx");
  idx.resize(idx.size() - 24);
  std::ofstream(a + ".idx", std::ios::binary | std::ios::trunc) << idx;
  IndexedDataset ds(a);
  EXPECT_EQ(ds.get(0), (std::vector<int32_t>{4, 5, 6}));
}

// Issue 21: re-running preprocess onto a dataset a job has mapped rewrote the files in place
// (SIGBUS in the job). Now the builder writes temporary files and renames them into place: an
// open dataset keeps its data, and an abandoned builder leaves the old files and no temporaries.
TEST(IndexedDataset, RewritingADatasetLeavesAnOpenOneIntact) {
  auto dir = temp_dir();
  const std::string prefix = write_sample(dir);
  IndexedDataset open_one(prefix);
  const auto before = open_one.get(2);
  {
    IndexedDatasetBuilder b(prefix, TokenDType::u16);
    b.add_item(std::vector<int32_t>{1});
    b.end_document();
    // Abandoned (an error mid-way): the old files stay, no temporary remains.
  }
  EXPECT_EQ(IndexedDataset(prefix).num_sequences(), 3u);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  {
    IndexedDatasetBuilder b(prefix, TokenDType::u16);
    b.add_item(std::vector<int32_t>{1});
    b.end_document();
    b.finalize();
  }
  EXPECT_EQ(IndexedDataset(prefix).num_sequences(), 1u);
  EXPECT_EQ(open_one.get(2), before);  // still the old mapping, still readable
}

}  // namespace
}  // namespace primus::data
