#include "pipeline/executor.h"

#include <chrono>
#include <map>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string shape_text(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// FNV-1a over everything that decides which messages a rank sends and expects, so that ranks
// handed different schedules fail together before the first transfer instead of hanging.
uint64_t fingerprint(const Schedule& s) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  for (char c : s.algorithm) mix(c);
  mix(s.pp), mix(s.vpp), mix(s.microbatches), mix(static_cast<int>(s.placement));
  for (const auto& ops : s.ranks) {
    mix(static_cast<int64_t>(ops.size()));
    for (const Op& op : ops)
      mix(static_cast<int>(op.type)), mix(op.microbatch), mix(op.chunk), mix(op.overlap_next);
  }
  return h;
}

// What every rank contributes to the agreement check before any transfer.
constexpr int kMaxDims = 8;
enum Field { kValid, kPp, kVpp, kMicrobatches, kFingerprint, kDType, kNdim, kDim0, kFields = kDim0 + kMaxDims };

std::string describe_message(const int64_t* rec) {
  if (!rec[kValid]) return "an invalid shape";
  Shape s(rec + kDim0, rec + kDim0 + rec[kNdim]);
  return fmt::format("{} {}", shape_text(s), dtype_name(static_cast<DType>(rec[kDType])));
}

// All ranks exchange their view of the run and fail alike if they disagree. Skipped for groups
// whose buffers live on the GPU (the host vector below is not a device buffer); the NCCL path
// must carry this check over a host-side group.
void check_agreement(const Schedule& s, const Shape& shape, DType dtype,
                     parallel::ProcessGroup& g) {
  if (g.device() != Device::CPU) return;
  std::vector<int64_t> mine(kFields, 0);
  bool valid = static_cast<int>(shape.size()) <= kMaxDims && !shape.empty();
  for (int64_t d : shape) valid = valid && d > 0;
  mine[kValid] = valid;
  mine[kPp] = s.pp;
  mine[kVpp] = s.vpp;
  mine[kMicrobatches] = s.microbatches;
  mine[kFingerprint] = static_cast<int64_t>(fingerprint(s));
  mine[kDType] = static_cast<int64_t>(dtype);
  if (valid) {
    mine[kNdim] = static_cast<int64_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) mine[kDim0 + i] = shape[i];
  }
  const int n = g.size();
  std::vector<int64_t> all(static_cast<size_t>(n) * kFields);
  g.all_gather(mine.data(), all.data(), kFields, parallel::CommType::I64);

  for (int r = 0; r < n; ++r) {
    const int64_t* rec = &all[static_cast<size_t>(r) * kFields];
    if (!rec[kValid])
      fail("pipeline: rank {} of {} has an invalid message shape (StageRunner::message_shape must "
           "have 1 to {} dimensions, all positive)",
           r, g.describe(), kMaxDims);
  }
  const int64_t* first = all.data();
  for (int r = 1; r < n; ++r) {
    const int64_t* rec = &all[static_cast<size_t>(r) * kFields];
    if (rec[kPp] != first[kPp] || rec[kVpp] != first[kVpp] ||
        rec[kMicrobatches] != first[kMicrobatches] || rec[kFingerprint] != first[kFingerprint])
      fail("pipeline: the ranks of {} were given different schedules (rank 0: pp {} vpp {} "
           "microbatches {}; rank {}: pp {} vpp {} microbatches {}{}); every rank must run the "
           "same schedule",
           g.describe(), first[kPp], first[kVpp], first[kMicrobatches], r, rec[kPp], rec[kVpp],
           rec[kMicrobatches],
           rec[kFingerprint] != first[kFingerprint] ? ", different op lists" : "");
    bool same = rec[kDType] == first[kDType] && rec[kNdim] == first[kNdim];
    for (int i = 0; i < kMaxDims; ++i) same = same && rec[kDim0 + i] == first[kDim0 + i];
    if (!same)
      fail("pipeline: the ranks of {} disagree on the message between stages: rank 0 sends {}, "
           "rank {} sends {} (StageRunner::message_shape / message_dtype must be the same on every "
           "stage)",
           g.describe(), describe_message(first), r, describe_message(rec));
  }
}

struct PendingRecv {
  Tensor buffer;
  parallel::WorkPtr work;
};

// A tensor handed from one stage to the next on the same rank, by (microbatch, stage, direction).
using LocalKey = std::tuple<int, int, int>;

}  // namespace

StageRunner::Overlapped StageRunner::overlapped_forward_backward(int f_microbatch, int f_chunk, const Tensor& input,
                                                                 int b_microbatch, int b_chunk,
                                                                 const Tensor& grad_output, bool with_weight) {
  Overlapped out;
  out.activation = forward(f_microbatch, f_chunk, input);
  out.input_grad = backward_input(b_microbatch, b_chunk, grad_output);
  if (with_weight) backward_weight(b_microbatch, b_chunk);
  return out;
}

int transfer_tag(const Schedule& schedule, const P2P& t) {
  return (t.microbatch * schedule.num_stages() + t.stage) * 2 +
         (t.dir == Direction::Gradient ? 1 : 0);
}

ExecutorStats run_schedule(const Schedule& schedule, StageRunner& runner,
                           parallel::ProcessGroup& pp_group, const ExecutorOptions& options) {
  // ---- checks that every rank makes alike, before any message ----
  if (schedule.pp != pp_group.size())
    fail("pipeline: schedule '{}' is for pipeline_model_parallel_size {} but {} has {} ranks",
         schedule.algorithm, schedule.pp, pp_group.describe(), pp_group.size());
  if (static_cast<int>(schedule.ranks.size()) != schedule.pp)
    fail("pipeline: schedule '{}' lists {} ranks but says pp = {}", schedule.algorithm,
         schedule.ranks.size(), schedule.pp);
  if (options.recv_ahead < 1)
    fail("pipeline: recv_ahead must be at least 1 (got {})", options.recv_ahead);
  const int S = schedule.num_stages();
  const int64_t max_tag = 2 * int64_t{schedule.microbatches} * S - 1;
  if (max_tag > kMaxPipelineTag)
    fail("pipeline: {} microbatches x {} stages need transfer tags up to {}, beyond MPI's "
         "guaranteed limit of {}; use fewer microbatches per iteration (larger micro_batch_size) "
         "or fewer stages",
         schedule.microbatches, S, max_tag, kMaxPipelineTag);
  const Shape shape = runner.message_shape();
  const DType dtype = runner.message_dtype();
  check_agreement(schedule, shape, dtype, pp_group);

  const int me = pp_group.rank();
  const Device device = pp_group.device();
  const auto& ops = schedule.ranks[me];

  // A result leaving a stage must be exactly what the receiver posted for.
  auto check_result = [&](const Tensor& t, const Op& op, int stage, const char* pass) {
    if (!t.defined())
      fail("pipeline rank {}: {} of microbatch {} at stage {} (chunk {}) returned no tensor, but "
           "stage {} needs it",
           me, pass, op.microbatch, stage, op.chunk,
           std::string(pass) == "forward" ? stage + 1 : stage - 1);
    if (t.shape() != shape || t.dtype() != dtype)
      fail("pipeline rank {}: {} of microbatch {} at stage {} (chunk {}) returned {} {}, but "
           "messages between stages are {} {} (StageRunner::message_shape)",
           me, pass, op.microbatch, stage, op.chunk, shape_text(t.shape()), dtype_name(t.dtype()),
           shape_text(shape), dtype_name(dtype));
    if (t.device() != device || !t.is_contiguous())
      fail("pipeline rank {}: {} of microbatch {} at stage {} returned a {} tensor; the pipeline "
           "group {} moves contiguous tensors on its own device",
           me, pass, op.microbatch, stage, t.is_contiguous() ? "wrong-device" : "non-contiguous",
           pp_group.describe());
  };

  // Receives. Posted ones wait in `posted`, by tag, until their op takes them.
  std::map<int, PendingRecv> posted;
  auto post = [&](const P2P& r) {
    const int tag = transfer_tag(schedule, r);
    Tensor buf = Tensor::empty(shape, dtype, device);
    auto work = pp_group.irecv(buf, r.peer, tag);
    posted.emplace(tag, PendingRecv{std::move(buf), std::move(work)});
  };
  // Tag-matching groups (MPI): this rank's receives are posted in its op order, recv_ahead of
  // them ahead of the op that needs them, so that they overlap with compute.
  std::vector<const P2P*> my_recvs;
  for (const Op& o : ops)
    if (o.recv) my_recvs.push_back(&*o.recv);
  size_t next_mine = 0;
  // In-order groups (NCCL) match a pair of ranks' sends and receives in posting order, whatever
  // the tags, and a posted receive holds up the group's stream (the sends behind it included)
  // until its message arrives. There a receive is posted just in time, in the batch of the
  // sends of the op before it (as Megatron's send_forward_recv_backward), and in the order the
  // peer sends: the messages a peer sends before the one needed now (under V-shape schedules
  // both directions of a pair of ranks carry activations and gradients) are received first, and
  // wait for their op.
  const bool in_order = pp_group.p2p_in_posting_order();
  std::map<int, std::vector<P2P>> incoming;  // peer -> what it sends to this rank, in its order
  std::map<int, size_t> incoming_posted;
  if (in_order)
    for (int peer = 0; peer < schedule.pp; ++peer)
      if (peer != me)
        for (const Op& o : schedule.ranks[peer])
          if (o.send && o.send->peer == me) incoming[peer].push_back({peer, o.microbatch, o.send->stage, o.send->dir});
  auto post_more = [&] {
    if (in_order) return;
    for (; next_mine < my_recvs.size() && int(posted.size()) < options.recv_ahead; ++next_mine) post(*my_recvs[next_mine]);
  };
  // In order: the receives op `next` (and its pair's second op) consume, with what comes first.
  auto post_for = [&](size_t next) {
    if (!in_order || next >= ops.size()) return;
    for (size_t j = next; j <= (ops[next].overlap_next ? next + 1 : next) && j < ops.size(); ++j) {
      if (!ops[j].recv) continue;
      const int peer = ops[j].recv->peer, tag = transfer_tag(schedule, *ops[j].recv);
      const std::vector<P2P>& from = incoming[peer];
      size_t& k = incoming_posted[peer];
      while (!posted.count(tag)) {
        PRIMUS_CHECK(k < from.size(), "pipeline rank {}: rank {} never sends the message of op {}", me, peer, j);
        post(from[k++]);
      }
    }
  };
  std::vector<parallel::WorkPtr> sends;
  auto reap_sends = [&] {
    std::erase_if(sends, [](parallel::WorkPtr& w) { return w->test(); });
  };
  std::map<LocalKey, Tensor> local;

  ExecutorStats st;
  int64_t n_f = 0, n_b = 0, n_w = 0, n_pair = 0;
  double t_f = 0, t_b = 0, t_w = 0, t_pair = 0;
  if (options.record_timeline) st.timeline.reserve(ops.size());
  const auto t0 = Clock::now();

  // Times one runner call; adds to the op kind's total.
  auto timed = [&](double& total, int64_t& count, auto&& fn) {
    const auto a = Clock::now();
    auto result = fn();
    const double dt = seconds(a, Clock::now());
    total += dt;
    ++count;
    st.compute_s += dt;
    return result;
  };

  // Where an op's result goes: to the peer (isend) or to a later op on this rank.
  auto deliver = [&](Tensor out, const Op& op, int stage, Direction dir) {
    const int to_stage = dir == Direction::Activation ? stage + 1 : stage - 1;
    check_result(out, op, stage, dir == Direction::Activation ? "forward" : "backward_input");
    if (op.send) {
      PRIMUS_CHECK(op.send->stage == to_stage && op.send->dir == dir,
                   "op sends to stage {} but its result is for stage {}", op.send->stage, to_stage);
      sends.push_back(pp_group.isend(out, op.send->peer, transfer_tag(schedule, *op.send)));
      ++st.messages_sent;
    } else {
      if (schedule.rank_of_stage(to_stage) != me)
        fail("pipeline: schedule '{}' has no send for the {} of microbatch {} from stage {} to "
             "stage {} on rank {}",
             schedule.algorithm, direction_name(dir), op.microbatch, stage, to_stage,
             schedule.rank_of_stage(to_stage));
      local[{op.microbatch, to_stage, static_cast<int>(dir)}] = std::move(out);
    }
  };

  // The input an op consumes: the received message, or the tensor a stage on this rank left.
  auto take_input = [&](const Op& op, size_t i, int stage, Direction dir) -> Tensor {
    if (op.recv) {
      post_more();
      auto it = posted.find(transfer_tag(schedule, *op.recv));
      PRIMUS_CHECK(it != posted.end(), "receive of op {} was not posted", i);
      PendingRecv p = std::move(it->second);
      posted.erase(it);
      post_more();  // keep the window full while this op computes
      const auto a = Clock::now();
      try {
        p.work->wait();
      } catch (const Error& e) {
        fail("pipeline rank {}: receiving the {} of microbatch {} for stage {} from rank {}: {}",
             me, direction_name(op.recv->dir), op.microbatch, stage, op.recv->peer, e.what());
      }
      st.recv_wait_s += seconds(a, Clock::now());
      ++st.messages_received;
      return std::move(p.buffer);
    }
    const bool needs = dir == Direction::Activation ? stage > 0 : stage < S - 1;
    if (!needs) return Tensor();
    auto it = local.find({op.microbatch, stage, static_cast<int>(dir)});
    if (it == local.end())
      fail("pipeline: schedule '{}' runs {} on rank {} before the {} it needs from stage {} "
           "exists (and it is not received)",
           schedule.algorithm, to_string(op, schedule.vpp), me, direction_name(dir),
           dir == Direction::Activation ? stage - 1 : stage + 1);
    Tensor t = std::move(it->second);
    local.erase(it);
    return t;
  };

  post_more();
  post_for(0);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const int stage = schedule.stage_of(me, op.chunk);
    OpRecord rec{op.type, op.microbatch, op.chunk, seconds(t0, Clock::now()), 0, 0};
    if (op.overlap_next && i + 1 < ops.size()) {
      // DualPipe's F&B: both inputs first, then the unit, then both results out.
      const Op& back = ops[i + 1];
      const int back_stage = schedule.stage_of(me, back.chunk);
      PRIMUS_CHECK(op.type == OpType::F && (back.type == OpType::B || back.type == OpType::BW),
                   "overlapped pair {} {} is not a forward and a backward", to_string(op, schedule.vpp),
                   to_string(back, schedule.vpp));
      Tensor in = take_input(op, i, stage, Direction::Activation);
      Tensor g = take_input(back, i + 1, back_stage, Direction::Gradient);
      rec.compute_start_s = seconds(t0, Clock::now());
      const bool with_weight = back.type == OpType::BW;
      StageRunner::Overlapped out = timed(t_pair, n_pair, [&] {
        return runner.overlapped_forward_backward(op.microbatch, op.chunk, in, back.microbatch, back.chunk, g,
                                                  with_weight);
      });
      if (stage < S - 1) deliver(std::move(out.activation), op, stage, Direction::Activation);
      if (back_stage > 0) deliver(std::move(out.input_grad), back, back_stage, Direction::Gradient);
      st.ops += 2;
      post_for(i + 2);
      reap_sends();
      rec.end_s = seconds(t0, Clock::now());
      if (options.record_timeline) {
        st.timeline.push_back(rec);
        st.timeline.push_back({back.type, back.microbatch, back.chunk, rec.start_s, rec.compute_start_s, rec.end_s});
      }
      ++i;
      continue;
    }
    switch (op.type) {
      case OpType::F: {
        Tensor in = take_input(op, i, stage, Direction::Activation);
        rec.compute_start_s = seconds(t0, Clock::now());
        Tensor out = timed(t_f, n_f, [&] { return runner.forward(op.microbatch, op.chunk, in); });
        if (stage < S - 1) deliver(std::move(out), op, stage, Direction::Activation);
        break;
      }
      case OpType::B:
      case OpType::BW: {
        Tensor g = take_input(op, i, stage, Direction::Gradient);
        rec.compute_start_s = seconds(t0, Clock::now());
        Tensor dx = timed(t_b, n_b,
                          [&] { return runner.backward_input(op.microbatch, op.chunk, g); });
        // Send the input gradient before W runs, so the previous stage can start its B.
        if (stage > 0) deliver(std::move(dx), op, stage, Direction::Gradient);
        if (op.type == OpType::BW)
          timed(t_w, n_w, [&] { runner.backward_weight(op.microbatch, op.chunk); return 0; });
        break;
      }
      case OpType::W:
        rec.compute_start_s = seconds(t0, Clock::now());
        timed(t_w, n_w, [&] { runner.backward_weight(op.microbatch, op.chunk); return 0; });
        break;
    }
    ++st.ops;
    post_for(i + 1);
    reap_sends();
    rec.end_s = seconds(t0, Clock::now());
    if (options.record_timeline) st.timeline.push_back(rec);
  }
  for (auto& w : sends) w->wait();
  sends.clear();
  st.wall_s = seconds(t0, Clock::now());
  st.wait_s = std::max(0.0, st.wall_s - st.compute_s);
  st.mean_f_s = n_f ? t_f / n_f : 0;
  st.mean_b_s = n_b ? t_b / n_b : 0;
  st.mean_w_s = n_w ? t_w / n_w : 0;
  st.mean_pair_s = n_pair ? t_pair / n_pair : 0;
  st.pairs = n_pair;

  PRIMUS_CHECK(posted.empty() && next_mine == (in_order ? 0 : my_recvs.size()), "receives left after the last op");
  if (!local.empty()) {
    const auto& [mb, stage, dir] = local.begin()->first;
    fail("pipeline: schedule '{}' left the {} of microbatch {} for stage {} on rank {} unused "
         "({} in all)",
         schedule.algorithm, direction_name(static_cast<Direction>(dir)), mb, stage, me,
         local.size());
  }
  return st;
}

}  // namespace primus::pipeline
