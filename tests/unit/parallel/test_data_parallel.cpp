// Data-parallel gradient buckets and the distributed optimizer on real ranks: run under
// `mpirun -np N` (N = 2 or 4). Every rank runs every case in the same order so that the
// collectives line up.
//
// Gradients are dyadic rationals k/64 with |k| <= 30: any sum of a few of them is exact in fp32
// and their squares sum exactly in double, whatever order MPI adds the ranks' values in. So the
// expected sums, norms and AdamW updates computed locally from the known per-rank values must
// match BIT FOR BIT; a wrong shard, bucket, order or padding shows up as a different number.
// (With arbitrary gradients only MPI's summation order could differ from a local sum, by fp32
// rounding; AdamW itself is elementwise, so it adds no difference of its own.)
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "parallel/data_parallel.h"
#include "parallel/distributed_optimizer.h"
#include "parallel/mpi_process_group.h"

using namespace primus;
using namespace primus::parallel;

namespace {

MpiProcessGroup& world() { return mpi_world(); }

struct Layout {
  std::vector<ParamSegment> tensors;
  int64_t numel = 0;
};

// As ParamStore lays tensors out: 16-float (64-byte) aligned, odd sizes, gaps between them.
// The buffer ends at the last tensor's end (odd), so reduce-scatter must stage the last bucket.
Layout aligned_layout() {
  const int64_t sizes[] = {37, 5, 129, 1, 64, 250, 3, 0, 77, 18};
  Layout l;
  int i = 0;
  for (int64_t n : sizes) {
    const int64_t off = (l.numel + 15) / 16 * 16;
    l.tensors.push_back({fmt::format("t{}", i), off, n, i % 3 != 1});
    l.numel = off + n;
    ++i;
  }
  return l;
}

// Packed back to back with no gaps: most buckets are not a multiple of dp (staging paths).
Layout packed_layout() {
  const int64_t sizes[] = {7, 33, 1, 91, 45, 13, 120, 9};
  Layout l;
  int i = 0;
  for (int64_t n : sizes) {
    l.tensors.push_back({fmt::format("p{}", i), l.numel, n, i % 2 == 0});
    l.numel += n;
    ++i;
  }
  return l;
}

// Rank r's gradient at element i of step s: k/64 with k in [-30, 30].
float grad_value(int r, int s, int64_t i) {
  return static_cast<float>((i * 7 + r * 13 + s * 5) % 61 - 30) / 64.0f;
}

bool in_tensor(const Layout& l, int64_t i) {
  for (const auto& t : l.tensors)
    if (i >= t.offset && i < t.offset + t.numel) return true;
  return false;
}

// This rank's gradients; gaps get values too when `fill_gaps`, so that a gap wrongly treated
// shows up (ParamStore keeps them zero).
std::vector<float> rank_grads(const Layout& l, int r, int s, bool fill_gaps) {
  std::vector<float> g(static_cast<size_t>(l.numel));
  for (int64_t i = 0; i < l.numel; ++i)
    g[static_cast<size_t>(i)] = (fill_gaps || in_tensor(l, i)) ? grad_value(r, s, i) : 0.0f;
  return g;
}

// The sum over the members (world ranks) of a dp group, computed locally.
std::vector<float> summed_grads(const Layout& l, const std::vector<int>& members, int s,
                                bool fill_gaps) {
  std::vector<float> sum(static_cast<size_t>(l.numel), 0.0f);
  for (int r : members) {
    auto g = rank_grads(l, r, s, fill_gaps);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
  }
  return sum;
}

// Stand-in for the backward compute between two tensors' gradients becoming final.
float compute(int iters) {
  volatile float acc = 0.0f;
  for (int i = 0; i < iters; ++i) acc = acc * 0.999f + static_cast<float>(i % 7);
  return acc;
}

// The backward: the last tensor's gradient is final first. Work between marks, as the W passes.
void backward_marks(GradBuckets& b) {
  for (int t = static_cast<int>(b.tensors().size()) - 1; t >= 0; --t) {
    compute(2000);
    b.mark_ready(t);
  }
}

bool bits_equal(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Index of the first element where a and b differ bitwise, or -1.
int64_t first_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!bits_equal(a[i], b[i])) return i;
  return -1;
}

struct Case {
  const char* layout;
  int64_t bucket_size;
  bool overlap;
  GradReduce reduce;
};

std::string describe(const Case& c) {
  return fmt::format("layout {} bucket_size {} overlap {} {}", c.layout, c.bucket_size, c.overlap,
                     grad_reduce_name(c.reduce));
}

Layout layout_named(const std::string& n) { return n == "aligned" ? aligned_layout() : packed_layout(); }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* l : {"aligned", "packed"})
    for (int64_t bs : {int64_t{1}, int64_t{100}, int64_t{300}, int64_t{1} << 30})
      for (bool ov : {true, false})
        for (GradReduce r : {GradReduce::AllReduce, GradReduce::ReduceScatter})
          cases.push_back({l, bs, ov, r});
  return cases;
}

std::vector<int> all_members(const ProcessGroup& g) { return g.world_ranks(); }

// Runs one bucketed reduction of step s over group g and checks it against the local sum.
void check_reduction(ProcessGroup& g, const Case& c, int s, bool shuffle_marks) {
  SCOPED_TRACE(describe(c) + (shuffle_marks ? " (rank-dependent mark order)" : ""));
  const Layout l = layout_named(c.layout);
  const int me = world().rank();
  std::vector<float> grads = rank_grads(l, me, s, /*fill_gaps=*/true);
  const std::vector<float> local = grads;
  GradBuckets b(g, grads.data(), l.numel, l.tensors, {c.bucket_size, c.overlap, c.reduce});
  ASSERT_GE(b.num_buckets(), 1);

  if (shuffle_marks) {
    std::vector<int> order(l.tensors.size());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(static_cast<unsigned>(1000 + me));
    std::shuffle(order.begin(), order.end(), rng);
    for (int t : order) {
      compute(1000);
      b.mark_ready(t);
    }
  } else {
    // Bucket 0 (the end of the buffer) must be posted as soon as its tensors are ready, and
    // not before, when overlapping; nothing may be posted before finish() otherwise.
    const auto& b0 = b.buckets()[0];
    for (int t = static_cast<int>(l.tensors.size()) - 1; t >= 0; --t) {
      compute(2000);
      b.mark_ready(t);
      if (t == b0.first_tensor) {
        EXPECT_EQ(b.started(0), c.overlap);
      }
      if (t > b0.first_tensor) {
        EXPECT_FALSE(b.started(0));
      }
      if (b.num_buckets() > 1 && t > b.buckets()[1].first_tensor) {
        EXPECT_FALSE(b.started(1));
      }
    }
    for (int k = 0; k < b.num_buckets(); ++k) EXPECT_EQ(b.started(k), c.overlap);
  }
  b.finish();
  EXPECT_TRUE(b.finished());

  const std::vector<float> sum = summed_grads(l, all_members(g), s, true);
  if (c.reduce == GradReduce::AllReduce) {
    const int64_t d = first_difference(grads.data(), sum.data(), l.numel);
    EXPECT_EQ(d, -1) << "element " << d << ": " << grads[d] << " vs " << sum[d];
  } else {
    // The rank's shards hold the sum; everything else keeps this rank's own gradients.
    std::vector<uint8_t> mine(static_cast<size_t>(l.numel), 0);
    for (const auto& bk : b.buckets())
      for (int64_t i = bk.shard_begin; i < bk.shard_end; ++i) mine[static_cast<size_t>(i)] = 1;
    int bad = 0;
    for (int64_t i = 0; i < l.numel && bad < 5; ++i) {
      const float want = mine[static_cast<size_t>(i)] ? sum[i] : local[i];
      if (!bits_equal(grads[i], want)) {
        ADD_FAILURE() << "element " << i << (mine[i] ? " (own shard)" : " (not owned)") << ": "
                      << grads[i] << " vs " << want;
        ++bad;
      }
    }
    // Every element of the buffer belongs to exactly one rank's shard (within the covered range).
    std::vector<int32_t> owners(mine.begin(), mine.end());
    g.all_reduce(owners);
    for (int64_t i = l.tensors[0].offset; i < l.numel; ++i)
      ASSERT_EQ(owners[static_cast<size_t>(i)], 1) << "element " << i << " owned by " << owners[i]
                                                   << " ranks";
  }
  // A second step through the same buckets after reset() works the same way.
  b.reset();
  EXPECT_FALSE(b.finished());
  EXPECT_FALSE(b.started(0));
}

}  // namespace

TEST(GradBuckets, DefaultBucketSizeIsMegatrons) {
  EXPECT_EQ(default_bucket_size(1), 40'000'000);
  EXPECT_EQ(default_bucket_size(8), 40'000'000);
  EXPECT_EQ(default_bucket_size(64), 64'000'000);
}

TEST(GradBuckets, LayoutWholeTensorsFromTheEnd) {
  const int n = world().size(), me = world().rank();
  for (const char* name : {"aligned", "packed"}) {
    const Layout l = layout_named(name);
    for (int64_t bs : {int64_t{1}, int64_t{64}, int64_t{100}, int64_t{300}, int64_t{1} << 30}) {
      for (GradReduce mode : {GradReduce::AllReduce, GradReduce::ReduceScatter}) {
        SCOPED_TRACE(fmt::format("{} bucket_size {} {}", name, bs, grad_reduce_name(mode)));
        std::vector<float> g(static_cast<size_t>(l.numel));
        GradBuckets b(world(), g.data(), l.numel, l.tensors, {bs, true, mode});
        const auto& bk = b.buckets();
        ASSERT_GE(bk.size(), 1u);
        // Bucket 0 ends the buffer and holds the last tensor; the buckets tile the buffer
        // backwards from there, each a run of whole tensors.
        EXPECT_EQ(bk[0].end, l.numel);
        EXPECT_EQ(bk[0].last_tensor, static_cast<int>(l.tensors.size()) - 1);
        EXPECT_EQ(bk.back().first_tensor, 0);
        EXPECT_EQ(bk.back().begin, l.tensors[0].offset);
        for (size_t k = 0; k < bk.size(); ++k) {
          EXPECT_EQ(bk[k].begin, l.tensors[static_cast<size_t>(bk[k].first_tensor)].offset);
          if (k + 1 < bk.size()) {
            EXPECT_EQ(bk[k + 1].end, bk[k].begin);
            EXPECT_EQ(bk[k + 1].last_tensor + 1, bk[k].first_tensor);
            // Closed as soon as it reached bucket_size: big enough, and minimal.
            EXPECT_GE(bk[k].end - bk[k].begin, bs);
            if (bk[k].last_tensor > bk[k].first_tensor) {
              EXPECT_LT(bk[k].end - l.tensors[static_cast<size_t>(bk[k].first_tensor + 1)].offset, bs);
            }
          }
          for (int t = bk[k].first_tensor; t <= bk[k].last_tensor; ++t)
            EXPECT_EQ(b.bucket_of(t), static_cast<int>(k));
          const int64_t span = bk[k].end - bk[k].begin;
          if (mode == GradReduce::ReduceScatter) {
            EXPECT_EQ(bk[k].padded_numel % n, 0);
            EXPECT_GE(bk[k].padded_numel, span);
            EXPECT_LT(bk[k].padded_numel - span, n);
            EXPECT_EQ(bk[k].shard_numel * n, bk[k].padded_numel);
            EXPECT_EQ(bk[k].staged, bk[k].padded_numel != span);
            EXPECT_EQ(bk[k].shard_begin, std::min(bk[k].end, bk[k].begin + me * bk[k].shard_numel));
            EXPECT_EQ(bk[k].shard_end, std::min(bk[k].end, bk[k].begin + (me + 1) * bk[k].shard_numel));
          } else {
            EXPECT_FALSE(bk[k].staged);
            EXPECT_EQ(bk[k].padded_numel, span);
          }
        }
        // One tensor a bucket, except that a zero-size tensor joins the bucket before it.
        if (bs == 1 && std::string(name) == "packed") {
          EXPECT_EQ(b.num_buckets(), static_cast<int>(l.tensors.size()));
        }
        if (bs == (int64_t{1} << 30)) {
          EXPECT_EQ(b.num_buckets(), 1);
        }
      }
    }
  }
}

// (a) buckets give exactly the sum over dp, in both modes, with and without overlap, for
// several bucket sizes, with the marks in backward order interleaved with compute.
TEST(GradBuckets, ExactSumEveryModeAndBucketSize) {
  int s = 0;
  for (const Case& c : all_cases()) check_reduction(world(), c, s++, /*shuffle_marks=*/false);
}

// Ranks that mark tensors in different orders still post the collectives in the same (bucket)
// order, so the result is the same; a naive "start when ready" would pair the wrong buckets.
TEST(GradBuckets, RankDependentMarkOrder) {
  int s = 7;
  for (const char* l : {"aligned", "packed"})
    for (GradReduce r : {GradReduce::AllReduce, GradReduce::ReduceScatter})
      check_reduction(world(), {l, 64, true, r}, s++, /*shuffle_marks=*/true);
}

// A dp group that is a sub-group of the world (as with tp = 2): the sum is over its members.
TEST(GradBuckets, SubGroup) {
  const int n = world().size();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks for two dp groups of 2";
  auto dp = world().split(world().rank() / 2, world().rank(), "dp");
  ASSERT_NE(dp, nullptr);
  ASSERT_EQ(dp->size(), 2);
  int s = 20;
  for (GradReduce r : {GradReduce::AllReduce, GradReduce::ReduceScatter})
    check_reduction(*dp, {"packed", 100, true, r}, s++, false);
}

TEST(GradBuckets, MisuseGivesClearErrors) {
  const Layout l = packed_layout();
  std::vector<float> g(static_cast<size_t>(l.numel), 1.0f);
  auto expect_error = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Construction: all local checks.
  expect_error([&] { GradBuckets b(world(), g.data(), l.numel, l.tensors, {0, true}); }, "bucket_size");
  expect_error([&] { GradBuckets b(world(), nullptr, l.numel, l.tensors); }, "null");
  auto overlapping = l.tensors;
  overlapping[2].offset -= 3;
  expect_error([&] { GradBuckets b(world(), g.data(), l.numel, overlapping); }, "'p2'");
  auto outside = l.tensors;
  outside.back().numel += 1;
  expect_error([&] { GradBuckets b(world(), g.data(), l.numel, outside); }, "outside");
  auto unsorted = l.tensors;
  std::swap(unsorted[0], unsorted[1]);
  expect_error([&] { GradBuckets b(world(), g.data(), l.numel, unsorted); }, "ascending");

  // Marks: twice, out of range, after finish; finish twice. Without overlap nothing is posted
  // before finish(), so every rank stays in step.
  {
    GradBuckets b(world(), g.data(), l.numel, l.tensors, {50, false});
    b.mark_ready(3);
    expect_error([&] { b.mark_ready(3); }, "marked ready twice");
    expect_error([&] { b.mark_ready(99); }, "out of range");
    expect_error([&] { b.mark_ready(-1); }, "out of range");
    b.finish();  // without overlap unmarked tensors are fine
    expect_error([&] { b.finish(); }, "twice without reset");
    expect_error([&] { b.mark_ready(0); }, "after finish");
    b.reset();
    b.mark_ready(3);  // a fresh step
    b.finish();
  }
  // With overlap every tensor must be marked before finish(): the error names one missing.
  {
    GradBuckets b(world(), g.data(), l.numel, l.tensors, {1 << 20, true});  // one bucket
    for (int t = 7; t >= 1; --t) b.mark_ready(t);
    EXPECT_FALSE(b.started(0));
    expect_error([&] { b.finish(); }, "tensor 'p0' (index 0, bucket 0) was never marked ready (7 of 8");
    b.mark_ready(0);
    EXPECT_TRUE(b.started(0));
    b.finish();
  }
  // reset() in the middle of a step completes what was posted (an abandoned step).
  {
    GradBuckets b(world(), g.data(), l.numel, l.tensors, {1, true});
    b.mark_ready(7);
    EXPECT_TRUE(b.started(0));
    b.reset();
    EXPECT_FALSE(b.started(0));
  }
  // The distributed optimizer needs reduce-scatter buckets, and reduced gradients.
  std::vector<float> p(static_cast<size_t>(l.numel), 0.5f);
  {
    GradBuckets b(world(), g.data(), l.numel, l.tensors, {50, false, GradReduce::AllReduce});
    expect_error([&] { DistributedOptimizer o(b, p.data(), {}); }, "reduce-scatter");
  }
  {
    GradBuckets b(world(), g.data(), l.numel, l.tensors, {50, false, GradReduce::ReduceScatter});
    expect_error([&] { DistributedOptimizer o(b, p.data(), {.beta1 = 1.5}); }, "adam_beta1");
    DistributedOptimizer o(b, p.data(), {});
    expect_error([&] { o.step(1e-3); }, "before GradBuckets::finish");
    expect_error([&] { o.local_grad_sq_sum(); }, "finish()");
    b.finish();
    expect_error([&] { o.step(-1.0); }, "learning rate");
    EXPECT_EQ(o.step_count(), 0);
    std::vector<float> m(static_cast<size_t>(l.numel - 1));
    expect_error([&] { o.load_state(1, m.data(), m.data(), l.numel - 1); }, fmt::format("buffer has {}", l.numel));
    expect_error([&] { o.set_weight_decay(-0.1); }, "weight_decay");
  }
}

namespace {

// Five steps of the distributed optimizer (with clipping) against one AdamW over the summed
// gradients; then the optimizer state is gathered, loaded into a fresh optimizer built with a
// different bucket size, and both continue for two more steps.
void check_optimizer(ProcessGroup& g, const char* layout_name, int64_t bucket_size, bool overlap) {
  SCOPED_TRACE(fmt::format("layout {} bucket_size {} overlap {} dp {}", layout_name, bucket_size, overlap,
                           g.size()));
  const Layout l = layout_named(layout_name);
  const int me = world().rank();
  const std::vector<int> members = all_members(g);
  const AdamWOptions opts{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

  std::vector<float> params(static_cast<size_t>(l.numel));
  for (int64_t i = 0; i < l.numel; ++i)
    params[static_cast<size_t>(i)] = in_tensor(l, i) ? 0.5f * std::sin(0.37f * float(i)) : 0.0f;
  std::vector<float> ref_params = params;
  AdamW ref(opts, l.numel);

  std::vector<float> grads(static_cast<size_t>(l.numel));
  auto b = std::make_unique<GradBuckets>(g, grads.data(), l.numel, l.tensors,
                                         GradBucketsOptions{bucket_size, overlap, GradReduce::ReduceScatter});
  auto opt = std::make_unique<DistributedOptimizer>(*b, params.data(), opts);
  EXPECT_LE(opt->shard_numel(), l.numel / g.size() + 2 * b->num_buckets());

  const double max_norms[] = {0.0, 1.0, 1e9, 0.5, 0.0, 1.0, 2.0};
  int clipped = 0;
  auto run_step = [&](int s) {
    const std::vector<float> mine = rank_grads(l, me, s, /*fill_gaps=*/false);
    std::copy(mine.begin(), mine.end(), grads.begin());  // in place: the buckets hold the pointer
    backward_marks(*b);
    b->finish();
    std::vector<float> sum = summed_grads(l, members, s, false);
    const double norm = opt->clip_grad_norm(max_norms[s]);
    const double ref_norm = clip_grad_norm(sum.data(), l.numel, max_norms[s]);
    EXPECT_EQ(norm, ref_norm) << "step " << s;  // exact: squares of k/64 sum exactly in double
    if (max_norms[s] > 0 && norm > max_norms[s]) ++clipped;
    const double lr = 1e-2 * (1 + s);
    opt->step(lr);
    ref.step(ref_params.data(), sum.data(), l.tensors, lr);
    const int64_t d = first_difference(params.data(), ref_params.data(), l.numel);
    EXPECT_EQ(d, -1) << "step " << s << " element " << d << ": " << params[d] << " vs " << ref_params[d];
    b->reset();
  };
  for (int s = 0; s < 5; ++s) run_step(s);
  EXPECT_GT(clipped, 0) << "the clipping path was not exercised";
  EXPECT_EQ(opt->step_count(), 5);

  // (c) gather_state: every rank gets the full state, equal to the one-process optimizer's.
  FullOptimizerState st = opt->gather_state();
  EXPECT_EQ(st.step, 5);
  ASSERT_EQ(st.exp_avg.size(), static_cast<size_t>(l.numel));
  for (int64_t i = 0; i < l.numel; ++i) {
    const float m = in_tensor(l, i) ? ref.exp_avg()[i] : 0.0f;
    const float v = in_tensor(l, i) ? ref.exp_avg_sq()[i] : 0.0f;
    ASSERT_TRUE(bits_equal(st.exp_avg[i], m)) << "exp_avg[" << i << "] " << st.exp_avg[i] << " vs " << m;
    ASSERT_TRUE(bits_equal(st.exp_avg_sq[i], v)) << "exp_avg_sq[" << i << "] " << st.exp_avg_sq[i] << " vs " << v;
  }
  // load_state into an optimizer with other shards (another bucket size), then carry on.
  opt.reset();
  b = std::make_unique<GradBuckets>(g, grads.data(), l.numel, l.tensors,
                                    GradBucketsOptions{bucket_size == 1 ? 200 : 1, overlap,
                                                       GradReduce::ReduceScatter});
  opt = std::make_unique<DistributedOptimizer>(*b, params.data(), opts);
  opt->load_state(st);
  EXPECT_EQ(opt->step_count(), 5);
  for (int s = 5; s < 7; ++s) run_step(s);
  FullOptimizerState st2 = opt->gather_state();
  EXPECT_EQ(st2.step, 7);
  for (const auto& t : l.tensors) {
    EXPECT_EQ(first_difference(st2.exp_avg.data() + t.offset, ref.exp_avg() + t.offset, t.numel), -1) << t.name;
    EXPECT_EQ(first_difference(st2.exp_avg_sq.data() + t.offset, ref.exp_avg_sq() + t.offset, t.numel), -1)
        << t.name;
  }
}

}  // namespace

// (b) + (c) + (d): bit for bit, since the gradients' sums are exact (see the top of the file).
TEST(DistributedOptimizer, MatchesOneAdamWOverSummedGradients) {
  for (const char* l : {"aligned", "packed"})
    for (int64_t bs : {int64_t{1}, int64_t{100}, int64_t{1} << 30})
      check_optimizer(world(), l, bs, /*overlap=*/bs != 100);
}

// dp = 1 (e.g. every rank its own group, as with tp = world size): no collective is posted,
// the buffer already is the sum, and the optimizer still matches one AdamW.
TEST(DistributedOptimizer, SingleRankGroup) {
  auto solo = world().split(world().rank(), 0, "dp");
  ASSERT_NE(solo, nullptr);
  ASSERT_EQ(solo->size(), 1);
  for (GradReduce r : {GradReduce::AllReduce, GradReduce::ReduceScatter})
    check_reduction(*solo, {"aligned", 100, true, r}, 30, false);
  check_optimizer(*solo, "aligned", 100, true);
  check_optimizer(*solo, "packed", 1 << 30, false);
}

// (d) with arbitrary fp32 gradients: the sharded norm against one process's norm of the summed
// buffer. The only difference left is MPI's order of adding the ranks' fp32 values (each sum is
// correctly rounded but the order may differ), so 1e-6 relative; the exact case is above.
// Also the TensorFilter and the model-parallel reduction.
TEST(DistributedOptimizer, GradNormOfRandomGradients) {
  const Layout l = aligned_layout();
  const int n = world().size(), me = world().rank();
  auto random_grads = [&](int r) {
    std::mt19937 rng(static_cast<unsigned>(77 + r));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> g(static_cast<size_t>(l.numel), 0.0f);
    for (const auto& t : l.tensors)
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) g[static_cast<size_t>(i)] = dist(rng);
    return g;
  };
  std::vector<float> sum(static_cast<size_t>(l.numel), 0.0f);
  for (int r = 0; r < n; ++r) {
    auto g = random_grads(r);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
  }
  std::vector<float> grads = random_grads(me), params(static_cast<size_t>(l.numel), 0.0f);
  GradBuckets b(world(), grads.data(), l.numel, l.tensors, {100, true, GradReduce::ReduceScatter});
  DistributedOptimizer opt(b, params.data(), {});
  backward_marks(b);
  b.finish();

  const double ref = global_grad_norm(sum.data(), l.numel);
  EXPECT_NEAR(opt.grad_norm(), ref, 1e-6 * ref);
  // Only even tensors counted.
  auto even = [](int t) { return t % 2 == 0; };
  double ref_even_sq = 0.0;
  for (size_t t = 0; t < l.tensors.size(); t += 2)
    ref_even_sq += grad_sq_sum(sum.data() + l.tensors[t].offset, l.tensors[t].numel);
  EXPECT_NEAR(opt.grad_norm(nullptr, even), std::sqrt(ref_even_sq), 1e-6 * std::sqrt(ref_even_sq));
  // A model-parallel group that (here) is the world again: every rank's dp-reduced square sum
  // is counted once more per member, n times in all.
  EXPECT_NEAR(opt.grad_norm(&world()), std::sqrt(n) * ref, 1e-6 * ref * n);
  // The local sums add up to the global square sum.
  const double local = opt.local_grad_sq_sum();
  EXPECT_NEAR(world().all_reduce_value(local), ref * ref, 1e-6 * ref * ref);
  // Clipping scales exactly this rank's shards so that the global norm becomes max_norm.
  const double before = opt.clip_grad_norm(0.25 * ref);
  EXPECT_NEAR(before, ref, 1e-6 * ref);
  EXPECT_NEAR(opt.grad_norm(), 0.25 * ref, 1e-5 * ref);
}

// Measures, for docs/data_parallel.md, the memory and time of one optimizer step with plain DP
// (all-reduce + full AdamW) and with the distributed optimizer. Run only when PRIMUS_DP_BENCH
// is set (it uses tens of MB and a few seconds): see the doc for the command.
namespace {
int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}
}  // namespace

TEST(DataParallelBench, MemoryAndStepTime) {
  const char* env = std::getenv("PRIMUS_DP_BENCH");
  if (!env)
    GTEST_SKIP() << "set PRIMUS_DP_BENCH=<million params> (and PRIMUS_DP_BENCH_OPTIMIZER=full|"
                    "distributed, PRIMUS_DP_BENCH_OVERLAP=0|1) to measure";
  const int64_t numel = std::max<int64_t>(1, std::atoll(env)) * 1'000'000;
  const int n = world().size(), me = world().rank();
  // A model-like layout: 40 tensors of equal size, 16-float aligned.
  Layout l;
  const int64_t each = (numel / 40 + 15) / 16 * 16;
  for (int i = 0; i < 40; ++i) {
    l.tensors.push_back({fmt::format("w{}", i), l.numel, each, true});
    l.numel += each;
  }
  std::vector<float> params(static_cast<size_t>(l.numel), 0.01f);
  std::vector<float> grads(static_cast<size_t>(l.numel), 0.0f);
  const int64_t bucket = default_bucket_size(n) / 8;  // several buckets even at this size
  const char* iters_env = std::getenv("PRIMUS_DP_BENCH_COMPUTE");  // compute per tensor
  const int compute_iters = iters_env ? std::atoi(iters_env) : 300000;
  auto fill = [&] {
    for (int64_t i = 0; i < l.numel; ++i) grads[static_cast<size_t>(i)] = grad_value(me, 0, i);
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // One configuration per process: freed buffers stay in the allocator, so a second
  // configuration in the same process would not show its own memory growth.
  const char* opt_env = std::getenv("PRIMUS_DP_BENCH_OPTIMIZER");
  const char* ov_env = std::getenv("PRIMUS_DP_BENCH_OVERLAP");
  const bool dist_only = opt_env && std::string(opt_env) == "distributed";
  const bool overlap_only = !ov_env || std::string(ov_env) != "0";
  {
    const bool dist = dist_only, overlap = overlap_only;
    {
      world().barrier();
      const int64_t rss0 = rss_bytes();
      int64_t state_bytes = 0, scratch = 0;
      std::vector<double> times, waits;
      {
        GradBuckets b(world(), grads.data(), l.numel, l.tensors,
                      {bucket, overlap, dist ? GradReduce::ReduceScatter : GradReduce::AllReduce});
        std::unique_ptr<DistributedOptimizer> dopt;
        std::unique_ptr<AdamW> adam;
        if (dist) dopt = std::make_unique<DistributedOptimizer>(b, params.data(), AdamWOptions{});
        else adam = std::make_unique<AdamW>(AdamWOptions{}, l.numel);
        for (int it = 0; it < 6; ++it) {
          fill();
          world().barrier();
          const auto t0 = std::chrono::steady_clock::now();
          // A stand-in backward: some compute per tensor (as its W pass), last tensor first.
          for (int t = static_cast<int>(l.tensors.size()) - 1; t >= 0; --t) {
            compute(compute_iters);
            b.mark_ready(t);
          }
          const auto t1 = std::chrono::steady_clock::now();
          b.finish();
          const auto t2 = std::chrono::steady_clock::now();
          if (dist) dopt->step(1e-4);
          else adam->step(params.data(), grads.data(), l.tensors, 1e-4);
          const auto t3 = std::chrono::steady_clock::now();
          b.reset();
          if (it > 0) {
            times.push_back(std::chrono::duration<double, std::milli>(t3 - t0).count());
            waits.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
          }
        }
        state_bytes = dist ? dopt->state_bytes() : 2 * l.numel * int64_t{sizeof(float)};
        scratch = b.scratch_bytes();
        const int64_t rss1 = rss_bytes();
        const double t = world().all_reduce_value(median(times), ReduceOp::Max);
        const double w = world().all_reduce_value(median(waits), ReduceOp::Max);
        const double grown = world().all_reduce_value(static_cast<double>(rss1 - rss0), ReduceOp::Max);
        if (me == 0)
          printf("[bench] dp %d %-24s overlap %d, %lld params: optimizer state %.2f B/param, "
                 "scratch %.2f B/param, RSS growth %.2f B/param; step %.1f ms, of which finish() "
                 "%.1f ms\n",
                 n, dist ? "distributed optimizer" : "all-reduce + full AdamW", int(overlap),
                 static_cast<long long>(l.numel), double(state_bytes) / double(l.numel),
                 double(scratch) / double(l.numel), grown / double(l.numel), t, w);
      }
    }
  }
}
