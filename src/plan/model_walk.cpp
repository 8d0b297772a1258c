#include "plan/model_walk.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/meta_device.h"
#include "plan/model_options.h"

namespace primus::plan {
namespace {

// The bytes a tensor takes on the meta device (and in the host pool): rounded up to 64.
double held(const Tensor& t) { return t.defined() ? double((t.nbytes() + 63) / 64 * 64) : 0.0; }

double in_use() { return double(meta_memory_stats().in_use); }

// Which parameter an op's weight pointer falls in: the model's master values, gradients or
// working copy, all laid out like the ParamStore.
class ParamResolver {
 public:
  explicit ParamResolver(LlamaModel& m) : infos_(m.params().infos()) {
    for (const Tensor* t :
         {&m.params().values(), &m.params().grads(), static_cast<const Tensor*>(&m.working_weights())})
      if (t->defined()) buffers_.push_back({t->raw(), t->nbytes(), dtype_size(t->dtype())});
  }
  int operator()(const void* p) const {
    if (!p) return -1;
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (const Buffer& b : buffers_) {
      const auto base = reinterpret_cast<uintptr_t>(b.base);
      if (a < base || a >= base + b.bytes) continue;
      const int64_t element = int64_t((a - base) / b.elem);
      auto it = std::upper_bound(infos_.begin(), infos_.end(), element,
                                 [](int64_t e, const StoredParam& s) { return e < s.offset; });
      if (it == infos_.begin()) return -1;
      --it;
      return element < it->offset + it->numel ? int(it - infos_.begin()) : -1;
    }
    return -1;
  }

 private:
  struct Buffer {
    const void* base;
    size_t bytes, elem;
  };
  const std::vector<StoredParam>& infos_;
  std::vector<Buffer> buffers_;
};

// One pass of the walk: the ops and collectives it records and the bytes it holds.
class PassWindow {
 public:
  PassWindow(ops::MetaBackend& be, parallel::CommLog& log) : be_(be), log_(log) {
    be_.take_calls();
    log_.take();
    start_ = in_use();
    reset_peak_meta_memory();
  }
  // Ends the window: the pass's record; the peak and the change of live bytes over it.
  PassRecord finish(const ParamResolver& resolve, double& peak, double& change) {
    PassRecord r;
    r.ops = be_.take_calls();
    r.comms = log_.take();
    for (const ops::OpCall& c : r.ops) r.params.push_back(resolve(c.weight));
    peak = double(meta_memory_stats().peak) - start_;
    change = in_use() - start_;
    return r;
  }

 private:
  ops::MetaBackend& be_;
  parallel::CommLog& log_;
  double start_ = 0;
};

ModelPartition partition_of(const RankShape& s, parallel::CommLog& log,
                            std::vector<std::unique_ptr<parallel::RecordingProcessGroup>>& groups) {
  auto group = [&](const char* name, int size) -> parallel::ProcessGroup* {
    if (size <= 1) return nullptr;
    groups.push_back(std::make_unique<parallel::RecordingProcessGroup>(name, size, 0, log));
    return groups.back().get();
  };
  ModelPartition p;
  p.tp_size = s.tp;
  p.tp_group = group("tp", s.tp);
  p.sequence_parallel = s.sequence_parallel;
  p.chunks = s.chunks;
  p.cp_size = s.cp;
  p.cp_group = group("cp", s.cp);
  p.cp_comm = s.cp_comm;
  p.ep_size = s.ep;
  p.ep_group = group("ep", s.ep);
  p.etp_size = s.etp;
  return p;
}

}  // namespace

double PassRecord::flops() const {
  double f = 0;
  for (const ops::OpCall& c : ops) f += c.flops;
  return f;
}

const std::string& RankRecord::param_name(int id) const {
  static const std::string none;
  return id >= 0 && size_t(id) < params.size() ? params[size_t(id)].name : none;
}

RankShape rank_shape(const ModelSpec& spec, const ParallelLayout& L, const config::TrainingArgs& a, Precision precision,
                     int pp_rank) {
  RankShape s;
  s.micro_batch_size = a.micro_batch_size;
  s.seq_length = a.seq_length > 0 ? a.seq_length : spec.max_position_embeddings;
  s.precision = precision;
  s.options = model_options(a);
  s.tp = L.tp;
  s.sequence_parallel = L.sequence_parallel;
  s.cp = L.cp;
  s.cp_comm = L.cp_all_to_all ? CpComm::A2A : CpComm::P2P;
  s.ep = L.ep;
  s.etp = L.etp;
  if (pp_rank >= 0) s.chunks = model_chunks(L, pp_rank);
  s.pipeline = L.schedule.has_value();
  return s;
}

namespace {

// One rank's model on the shape-only backend and one microbatch through its passes.
class RankWalk {
 public:
  RankWalk(const ModelSpec& spec, const RankShape& shape)
      : shape_(shape),
        be_(shape.load),
        log_([this] { return be_.calls().size(); }),
        before_(in_use()),
        model_(spec, be_, shape.precision, resident(shape.options), partition_of(shape, log_, groups_)),
        resolve_(model_) {}

  // What the model holds before any pass, and its parameters.
  void describe(RankRecord& rec) {
    rec.params = model_.params().infos();
    rec.units = model_.weight_units();
    rec.param_numel = model_.params().numel();
    rec.first_trainable = model_.first_trainable();
    rec.trainable_begin = model_.trainable_begin();
    rec.master = model_.params().dtype();
    rec.activation = model_.activation_dtype();
    rec.weight_bytes = held(model_.params().values()) + held(model_.params().grads()) +
                       (model_.has_separate_working_weights() ? held(model_.working_weights()) : 0.0);
    rec.model_bytes = in_use() - before_ - rec.weight_bytes;
  }

  // One microbatch: token ids spread over the vocabulary, every target counted.
  void begin(RankRecord& rec) {
    const int64_t V = model_.spec().vocab_size, seq = shape_.seq_length / shape_.cp, N = shape_.micro_batch_size * seq;
    std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) {
      tokens[size_t(i)] = int32_t(i % V);
      targets[size_t(i)] = int32_t((i + 1) % V);
    }
    const double start = in_use();
    model_.begin_microbatch(ctx_, tokens.data(), targets.data(), shape_.micro_batch_size, seq);
    rec.microbatch_bytes = in_use() - start;
    message_ = {model_.activation_rows(shape_.micro_batch_size, seq), model_.spec().hidden_size};
    rec.message = message_;
    rec.chunks.resize(size_t(model_.num_chunks()));
    for (int c = 0; c < model_.num_chunks(); ++c) rec.chunks[size_t(c)].chunk = model_.partition().chunks[size_t(c)];
  }

  // F of chunk c: its input arrives (its own), its output is sent away.
  void forward(ChunkRecord& ch, int c) {
    PassWindow win(be_, log_);
    {
      Tensor input = ch.chunk.has_embedding ? Tensor() : message();
      Tensor out = model_.forward_chunk(ctx_, c, input);
    }
    ch.f = win.finish(resolve_, ch.peak_f, ch.kept_after_f);
  }

  // B of chunk c, or without a pipeline the fused backward of the whole model.
  void backward(ChunkRecord& ch, int c) {
    PassWindow win(be_, log_);
    if (shape_.pipeline) {
      Tensor dy = ch.chunk.has_head ? Tensor() : message();
      Tensor dx = model_.backward_input_chunk(ctx_, c, dy, kDloss);
    } else {
      model_.backward(ctx_, kDloss);
    }
    double peak = 0, change = 0;
    ch.b = win.finish(resolve_, peak, change);
    ch.peak_b = ch.kept_after_f + peak;
    ch.kept_after_b = ch.kept_after_f + change;
  }

  void weights(ChunkRecord& ch, int c) {
    PassWindow win(be_, log_);
    model_.backward_weight_chunk(ctx_, c);
    double peak = 0, change = 0;
    ch.w = win.finish(resolve_, peak, change);
    ch.peak_w = ch.kept_after_b + peak;
  }

 private:
  static constexpr double kDloss = 1.0;
  static LlamaOptions resident(LlamaOptions o) {
    o.resident_weights = true;  // the passes read the model's own (empty) buffers
    return o;
  }
  Tensor message() const { return be_.empty(message_, model_.activation_dtype()); }

  RankShape shape_;
  ops::MetaBackend be_;
  parallel::CommLog log_;
  std::vector<std::unique_ptr<parallel::RecordingProcessGroup>> groups_;
  double before_;
  LlamaModel model_;
  ParamResolver resolve_;
  LlamaContext ctx_;
  Shape message_;
};

}  // namespace

RankRecord walk_rank(const ModelSpec& spec, const RankShape& shape) {
  const auto t0 = std::chrono::steady_clock::now();
  if (shape.micro_batch_size < 1 || shape.seq_length < 1)
    fail("the shape-only walk needs a positive micro_batch_size and seq_length (got {} and {})", shape.micro_batch_size,
         shape.seq_length);
  if (shape.cp < 1 || shape.seq_length % shape.cp != 0)
    fail("seq_length {} does not split over context_parallel_size {}", shape.seq_length, shape.cp);
  RankRecord rec;
  rec.shape = shape;
  RankWalk walk(spec, shape);
  walk.describe(rec);
  walk.begin(rec);
  const int n = int(rec.chunks.size());
  if (!shape.pipeline && n != 1) fail("a walk without a pipeline runs one chunk, not {}", n);
  for (int c = 0; c < n; ++c) walk.forward(rec.chunks[size_t(c)], c);  // F in chunk order
  for (int c = n; c-- > 0;) walk.backward(rec.chunks[size_t(c)], c);   // B (or the fused backward) in reverse
  if (shape.pipeline)
    for (int c = n; c-- > 0;) walk.weights(rec.chunks[size_t(c)], c);  // W in reverse
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rec;
}

std::vector<RankRecord> walk_ranks(const ModelSpec& spec, const ParallelLayout& L, const config::TrainingArgs& a,
                                   Precision precision, const ops::RouterLoad& load) {
  std::vector<RankRecord> out;
  std::map<std::string, size_t> walked;  // partition kind -> its first rank
  for (int r = 0; r < L.pp; ++r) {
    RankShape shape = rank_shape(spec, L, a, precision, r);
    shape.load = load;
    std::string kind;
    for (const ModelPartition::Chunk& c : shape.chunks) {
      kind += c.has_embedding ? "E" : "";
      for (int64_t l = c.first_layer; l < c.first_layer + c.num_layers; ++l)
        kind += !spec.is_moe_layer(l) ? "d" : load.per_layer.count(l) ? "m" + std::to_string(l) : "m";
      kind += c.has_head ? "H|" : "|";
    }
    const auto it = walked.find(kind);
    if (it != walked.end()) {
      out.push_back(out[it->second]);
      out.back().shape = shape;
      continue;
    }
    walked[kind] = out.size();
    out.push_back(walk_rank(spec, shape));
  }
  return out;
}

}  // namespace primus::plan
