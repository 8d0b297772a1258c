#include "data/gpt_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"

namespace primus::data {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kAddExtraToken = 1;  // samples carry one more token than seq_length: the last label
constexpr char kCacheMagic[8] = {'P', 'R', 'I', 'M', 'I', 'D', 'X', '1'};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Fisher-Yates with an unbiased-enough bounded draw (multiply-high; bias < n / 2^64).
template <typename T>
void shuffle(T* first, int64_t n, Rng& rng) {
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>((static_cast<unsigned __int128>(rng.next_u64()) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(first[i], first[j]);
  }
}

template <typename T>
void write_array(std::ofstream& f, const std::vector<T>& v) {
  uint64_t n = v.size();
  f.write(kCacheMagic, 8);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
}

template <typename T>
bool read_array(const std::string& path, std::vector<T>& v) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  char magic[8];
  uint64_t n = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, kCacheMagic, 8) != 0 || !f.read(reinterpret_cast<char*>(&n), 8))
    return false;
  std::error_code ec;
  if (fs::file_size(path, ec) != 16 + n * sizeof(T)) return false;
  v.resize(n);
  return static_cast<bool>(f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T))));
}

}  // namespace

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, int64_t doc_begin, int64_t doc_end,
                       int64_t num_samples, int64_t seq_length, uint64_t seed, const std::string& split_name,
                       const std::string& cache_dir, bool build_cache)
    : data_(std::move(data)), seq_length_(seq_length) {
  if (seq_length <= 0) fail("seq_length must be positive, got {}", seq_length);
  if (doc_begin < 0 || doc_end > static_cast<int64_t>(data_->num_sequences()) || doc_begin >= doc_end)
    fail("documents [{}, {}) are not a range of '{}' ({} documents)", doc_begin, doc_end, data_->prefix(),
         data_->num_sequences());
  if (num_samples < 0) fail("number of samples must not be negative, got {}", num_samples);

  // Everything that shapes the indices goes into the name, so a changed parameter never hits a stale file.
  std::error_code ec;
  std::string abs = fs::absolute(data_->prefix(), ec).string();
  std::string desc = fmt::format(
      "GPTDataset v1\npath_prefix={}\nsequences={}\ntokens={}\ndocuments=[{},{})\nnum_samples={}\nseq_length={}\n"
      "random_seed={}\nadd_extra_token_to_sequence={}\n",
      abs, data_->num_sequences(), data_->num_tokens(), doc_begin, doc_end, num_samples, seq_length, seed,
      kAddExtraToken);
  std::string dir = cache_dir.empty() ? data_->prefix() + "/cache/GPTDataset_indices" : cache_dir;
  cache_prefix_ = fmt::format("{}/{:016x}-GPTDataset-{}", dir, fnv1a(desc), split_name);

  if (build_cache && load(cache_prefix_)) {
    from_cache_ = true;
    return;
  }
  build(doc_begin, doc_end, num_samples, seed);
  if (!build_cache) return;
  try {
    fs::create_directories(dir);
    save(cache_prefix_);
    std::ofstream(cache_prefix_ + "-description.txt") << desc;
  } catch (const std::exception& e) {
    // A read-only data folder still trains: the indices stay in memory.
    std::cerr << "warning: cannot cache dataset indices in '" << dir << "' (" << e.what() << "); built in memory\n";
  }
}

void GPTDataset::build(int64_t doc_begin, int64_t doc_end, int64_t num_samples, uint64_t seed) {
  auto sizes = data_->sequence_lengths();
  int64_t tokens_per_epoch = 0;
  for (int64_t d = doc_begin; d < doc_end; ++d) tokens_per_epoch += sizes[d];
  if (tokens_per_epoch <= seq_length_)
    fail("documents [{}, {}) of '{}' hold {} tokens, not enough for one sample of seq_length {} + 1", doc_begin,
         doc_end, data_->prefix(), tokens_per_epoch, seq_length_);

  // Epochs: as many as the requested samples need (one when none are requested).
  num_epochs_ = 1;
  if (num_samples > 0) {
    int64_t need = num_samples * seq_length_ + kAddExtraToken;
    for (int64_t have = tokens_per_epoch; have < need; have += tokens_per_epoch) ++num_epochs_;
  }
  int64_t per_epoch = (tokens_per_epoch - kAddExtraToken) / seq_length_;
  bool separate_final = false;
  int64_t sans_final = 0;
  if (num_epochs_ > 1) {
    sans_final = ((num_epochs_ - 1) * tokens_per_epoch - kAddExtraToken) / seq_length_;
    // A final epoch used for less than 80% is shuffled apart, so its samples do not crowd out earlier ones.
    separate_final = num_samples - sans_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  Rng rng(seed);
  const int64_t ndocs = doc_end - doc_begin;
  document_index_.resize(static_cast<size_t>(num_epochs_ * ndocs));
  for (int64_t e = 0; e < num_epochs_; ++e)
    for (int64_t d = 0; d < ndocs; ++d) document_index_[e * ndocs + d] = static_cast<int32_t>(doc_begin + d);
  if (separate_final) {
    shuffle(document_index_.data(), (num_epochs_ - 1) * ndocs, rng);
    shuffle(document_index_.data() + (num_epochs_ - 1) * ndocs, ndocs, rng);
  } else {
    shuffle(document_index_.data(), static_cast<int64_t>(document_index_.size()), rng);
  }

  // Sample index: walk the document index seq_length tokens at a time; consecutive samples share
  // one token (the last label of one is the first input of the next).
  int64_t total = (num_epochs_ * tokens_per_epoch - kAddExtraToken) / seq_length_;
  sample_index_.resize(static_cast<size_t>(total + 1));
  sample_index_[0] = {0, 0};
  int64_t di = 0, off = 0;
  for (int64_t i = 1; i <= total; ++i) {
    int64_t remaining = seq_length_ + kAddExtraToken;
    while (remaining != 0) {
      int64_t len = sizes[document_index_[di]] - off;
      remaining -= len;
      if (remaining <= 0) {
        off += remaining + len - kAddExtraToken;
        remaining = 0;
      } else {
        ++di;
        off = 0;
      }
    }
    sample_index_[i] = {di, off};
  }

  if (!separate_final) sans_final = total;
  shuffle_index_.resize(static_cast<size_t>(total));
  std::iota(shuffle_index_.begin(), shuffle_index_.end(), 0);
  shuffle(shuffle_index_.data(), sans_final, rng);
  shuffle(shuffle_index_.data() + sans_final, total - sans_final, rng);
}

bool GPTDataset::load(const std::string& prefix) {
  std::vector<int64_t> flat;
  if (!read_array(prefix + "-document_index.bin", document_index_) || !read_array(prefix + "-sample_index.bin", flat) ||
      !read_array(prefix + "-shuffle_index.bin", shuffle_index_))
    return false;
  if (flat.size() % 2 != 0 || flat.size() / 2 != shuffle_index_.size() + 1) return false;
  sample_index_.resize(flat.size() / 2);
  for (size_t i = 0; i < sample_index_.size(); ++i) sample_index_[i] = {flat[2 * i], flat[2 * i + 1]};
  int64_t n = static_cast<int64_t>(data_->num_sequences());
  for (int32_t d : document_index_)
    if (d < 0 || d >= n) return false;  // a corrupt cache is rebuilt, never trusted
  for (auto& [di, off] : sample_index_)
    if (di < 0 || di >= static_cast<int64_t>(document_index_.size())) return false;
  for (int64_t s : shuffle_index_)
    if (s < 0 || s >= size()) return false;
  num_epochs_ = 0;
  return true;
}

void GPTDataset::save(const std::string& prefix) const {
  // Write under a temporary name and rename: ranks building at once never read a half file.
  std::vector<int64_t> flat;
  flat.reserve(sample_index_.size() * 2);
  for (auto& [d, o] : sample_index_) flat.push_back(d), flat.push_back(o);
  auto put = [&](const std::string& name, auto const& v) {
    std::string tmp = fmt::format("{}.tmp{}", name, ::getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      if (!f) throw std::runtime_error("cannot create " + tmp);
      write_array(f, v);
      if (!f) throw std::runtime_error("cannot write " + tmp);
    }
    fs::rename(tmp, name);
  };
  put(prefix + "-document_index.bin", document_index_);
  put(prefix + "-sample_index.bin", flat);
  put(prefix + "-shuffle_index.bin", shuffle_index_);
}

std::vector<int32_t> GPTDataset::get(int64_t i) const {
  if (i < 0 || i >= size()) fail("sample {} is out of range: the dataset has {}", i, size());
  int64_t s = shuffle_index_[i];
  auto [b_doc, b_off] = sample_index_[s];
  auto [e_doc, e_off] = sample_index_[s + 1];
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(seq_length_ + kAddExtraToken));
  if (b_doc == e_doc) {
    data_->append(document_index_[b_doc], b_off, e_off - b_off + kAddExtraToken, out);
  } else {
    data_->append(document_index_[b_doc], b_off, -1, out);
    for (int64_t d = b_doc + 1; d < e_doc; ++d) data_->append(document_index_[d], 0, -1, out);
    data_->append(document_index_[e_doc], 0, e_off + kAddExtraToken, out);
  }
  PRIMUS_CHECK(static_cast<int64_t>(out.size()) == seq_length_ + kAddExtraToken, "sample {} has {} tokens", i,
               out.size());
  return out;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<SampleDataset>> datasets, std::vector<double> weights,
                               int64_t size)
    : datasets_(std::move(datasets)) {
  if (datasets_.empty() || datasets_.size() != weights.size())
    fail("a blend needs one weight per dataset ({} datasets, {} weights)", datasets_.size(), weights.size());
  if (datasets_.size() > 32767) fail("a blend of {} datasets is too many", datasets_.size());
  double sum = 0;
  for (double w : weights) {
    if (!(w >= 0) || !std::isfinite(w)) fail("blend weights must be non-negative numbers, got {}", w);
    sum += w;
  }
  if (sum <= 0) fail("blend weights sum to {}, need a positive sum", sum);
  for (double& w : weights) w /= sum;
  dataset_index_.resize(static_cast<size_t>(size));
  dataset_sample_index_.resize(static_cast<size_t>(size));
  std::vector<int64_t> taken(datasets_.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    double at = std::max<double>(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_err = weights[0] * at - static_cast<double>(taken[0]);
    for (size_t d = 1; d < datasets_.size(); ++d) {
      double err = weights[d] * at - static_cast<double>(taken[d]);
      if (err > best_err) best_err = err, best = d;
    }
    dataset_index_[i] = static_cast<int16_t>(best);
    dataset_sample_index_[i] = taken[best]++;
  }
  for (size_t d = 0; d < datasets_.size(); ++d)
    if (taken[d] > datasets_[d]->size())
      fail("blend needs {} samples of dataset {} but it has {}", taken[d], d, datasets_[d]->size());
}

std::vector<int32_t> BlendedDataset::get(int64_t i) const {
  if (i < 0 || i >= size()) fail("sample {} is out of range: the blend has {}", i, size());
  return datasets_[dataset_index_[i]]->get(dataset_sample_index_[i]);
}

std::array<double, 3> parse_split(const std::string& split) {
  std::array<double, 3> w{0, 0, 0};
  size_t n = 0, pos = 0;
  while (pos <= split.size()) {
    size_t end = split.find_first_of(",/", pos);
    if (end == std::string::npos) end = split.size();
    std::string part = split.substr(pos, end - pos);
    double v = -1;
    auto r = std::from_chars(part.data(), part.data() + part.size(), v);
    if (n >= 3 || r.ec != std::errc() || r.ptr != part.data() + part.size() || v < 0 || !std::isfinite(v))
      fail("split '{}' must be up to three non-negative numbers such as \"969,30,1\"", split);
    w[n++] = v;
    pos = end + 1;
  }
  double sum = w[0] + w[1] + w[2];
  if (sum <= 0) fail("split '{}' sums to zero", split);
  for (double& x : w) x /= sum;
  return w;
}

std::array<std::pair<int64_t, int64_t>, 3> split_ranges(const std::array<double, 3>& split, int64_t n) {
  std::array<int64_t, 4> idx{0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) idx[i + 1] = idx[i] + static_cast<int64_t>(std::llround(split[i] * static_cast<double>(n)));
  int64_t diff = idx[3] - n;  // rounding may overshoot or undershoot by a document or two
  for (int i = 1; i < 4; ++i) idx[i] -= diff;
  for (int i = 1; i < 4; ++i) idx[i] = std::clamp<int64_t>(idx[i], 0, n);
  return {{{idx[0], idx[1]}, {idx[1], idx[2]}, {idx[2], idx[3]}}};
}

GPTDatasets build_gpt_datasets(const GPTDatasetConfig& c) {
  if (c.data_path.empty()) fail("data_path is empty: give a dataset prefix, or weights and prefixes");
  std::vector<double> weights;
  std::vector<std::string> prefixes;
  auto as_number = [](const std::string& s, double& v) {
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
  };
  double first;
  if (c.data_path.size() > 1 && as_number(c.data_path[0], first)) {
    if (c.data_path.size() % 2 != 0)
      fail("data_path with weights must alternate weight and prefix, got {} entries", c.data_path.size());
    for (size_t i = 0; i < c.data_path.size(); i += 2) {
      double w;
      if (!as_number(c.data_path[i], w) || w < 0)
        fail("data_path entry {} ('{}') should be a non-negative weight", i, c.data_path[i]);
      weights.push_back(w);
      prefixes.push_back(c.data_path[i + 1]);
    }
  } else {
    prefixes = c.data_path;
    weights.assign(prefixes.size(), 1.0);  // unweighted lists blend evenly
  }
  for (const auto& p : prefixes) {
    std::error_code ec;
    if (!fs::exists(p + ".idx", ec))
      fail("dataset '{}' not found: no '{}.idx' (data_path entries are prefixes, without .bin/.idx)", p, p);
  }
  double wsum = std::accumulate(weights.begin(), weights.end(), 0.0);
  if (wsum <= 0) fail("data_path weights sum to {}", wsum);
  auto split = parse_split(c.split);
  const char* names[3] = {"train", "valid", "test"};

  std::vector<std::shared_ptr<const IndexedDataset>> data;
  for (const auto& p : prefixes) data.push_back(std::make_shared<IndexedDataset>(p));

  GPTDatasets out;
  std::shared_ptr<SampleDataset>* slots[3] = {&out.train, &out.valid, &out.test};
  for (int s = 0; s < 3; ++s) {
    if (split[s] == 0) continue;
    int64_t target = c.num_samples[s];
    if (data.size() == 1) {
      auto r = split_ranges(split, static_cast<int64_t>(data[0]->num_sequences()))[s];
      if (r.first == r.second) {
        if (target > 0) fail("the {} split of '{}' has no documents ({} in all, split '{}')", names[s], prefixes[0],
                             data[0]->num_sequences(), c.split);
        continue;
      }
      *slots[s] = std::make_shared<GPTDataset>(data[0], r.first, r.second, target, c.seq_length, c.seed, names[s],
                                               c.cache_dir, c.build_cache);
      continue;
    }
    // Each part is built a little larger (Megatron: +0.5%) so the greedy blend never runs past it.
    std::vector<std::shared_ptr<SampleDataset>> parts;
    std::vector<double> ws;
    int64_t one_epoch_size = INT64_MAX;
    for (size_t d = 0; d < data.size(); ++d) {
      double w = weights[d] / wsum;
      if (w == 0) continue;
      auto r = split_ranges(split, static_cast<int64_t>(data[d]->num_sequences()))[s];
      if (r.first == r.second) fail("the {} split of '{}' has no documents", names[s], prefixes[d]);
      int64_t n = target > 0 ? static_cast<int64_t>(std::ceil(std::ceil(target * w) * 1.005)) : 0;
      auto ds = std::make_shared<GPTDataset>(data[d], r.first, r.second, n, c.seq_length, c.seed, names[s], c.cache_dir,
                                             c.build_cache);
      // The greedy blend takes at most w * N + 1 samples of a part, so N <= (size - 1) / w keeps within one epoch.
      one_epoch_size = std::min<int64_t>(one_epoch_size, static_cast<int64_t>((static_cast<double>(ds->size()) - 1) / w) - 1);
      parts.push_back(ds);
      ws.push_back(w);
    }
    int64_t size = target > 0 ? target : one_epoch_size;
    *slots[s] = std::make_shared<BlendedDataset>(parts, ws, size);
  }
  return out;
}

PretrainingSampler::PretrainingSampler(int64_t total_samples, int64_t consumed_samples, int64_t micro_batch_size,
                                       int64_t dp_rank, int64_t dp_size)
    : total_(total_samples), consumed_(consumed_samples), mbs_(micro_batch_size), rank_(dp_rank), dp_(dp_size) {
  if (mbs_ <= 0 || dp_ <= 0 || rank_ < 0 || rank_ >= dp_)
    fail("sampler needs micro_batch_size > 0 and 0 <= dp_rank < dp_size (got {}, {}, {})", mbs_, rank_, dp_);
  if (consumed_ < 0 || consumed_ > total_)
    fail("consumed samples {} is outside the dataset's {} samples", consumed_, total_);
}

std::vector<int64_t> PretrainingSampler::next() {
  if (consumed_ + mbs_ * dp_ > total_) return {};  // drop the last partial global micro-batch
  std::vector<int64_t> idx(static_cast<size_t>(mbs_));
  for (int64_t k = 0; k < mbs_; ++k) idx[k] = consumed_ + rank_ * mbs_ + k;
  consumed_ += mbs_ * dp_;
  return idx;
}

}  // namespace primus::data
