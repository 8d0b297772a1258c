// Streams, events and the deferred executor of the emulated device, with the CUDA runtime's
// stream and event functions.
//
// Work is queued per stream and does not run when it is issued: it runs when the host waits for
// something (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a copy to host
// memory, a query, cudaFree), and then the executor repeatedly picks, with a generator seeded
// from PRIMUS_EMU_SEED, one of the streams whose next op may run and runs that op. An op may run
// once the ops before it on its stream have, the events it waits for (cudaStreamWaitEvent) have
// been reached, and, on the legacy default stream (or a blocking stream after it), the implicit
// synchronisation between them is met: nothing else orders two streams, so their work
// interleaves op by op in seeded orders, and a missing event wait shows as a wrong result in some
// schedules.
//
// It always shows as a hazard: every op carries a vector clock (one component per stream: how
// many ops of that stream happen before it, through stream order, event waits, the legacy
// stream's synchronisation, and the host's waits, which order whatever the host issues
// afterwards). memory.cpp checks every access of the running op against the last ops that wrote
// and read the same bytes: an earlier op not ordered before the running one is reported, whichever
// ran first in this schedule.
//
// Copies from pageable host memory to the device read the source when they are issued (the
// runtime stages it), copies to pageable host memory wait until done (as the runtime's do).
// Event times are the wall-clock times at which the record ran.
//
// Across processes (NCCL communicators of several ranks) an op may wait for its peers; the
// executor then runs other streams' work, and waits (unlocked) when nothing can progress. A
// device thread started by the first such communicator runs queued work when the host has not
// called into the runtime for 20 ms, so that a rank whose host blocks elsewhere (in MPI, say)
// does not hold up its peers' collectives: a GPU keeps working while its host waits. Work that
// makes no progress for PRIMUS_EMU_HANG_SECONDS (default 100) is reported as a hang.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "emu/emulator.h"

namespace emu::detail {

Running g_running;

namespace {

using Clock = std::chrono::steady_clock;
using VC = std::vector<uint32_t>;

void merge(VC& into, const VC& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

struct Pending {
  std::unique_ptr<Op> op;
  uint32_t id;
  std::vector<std::pair<uint32_t, uint32_t>> deps;  // (stream, position) that must have run first
  VC vc;
};

struct Stream {
  uint32_t idx = 0;
  bool blocking = true;  // synchronises with the legacy default stream
  std::deque<Pending> q;
  uint32_t enq = 0, done = 0;  // ops queued and run, ever
  VC vc;                       // the clock of its last queued op
};

struct OpRecord {
  uint32_t stream, pos;
  OpLabel label;
};

struct EventRec {
  bool recorded = false;
  uint32_t stream = 0, pos = 0;  // its latest record
  VC vc;
  bool has_time = false;
  Clock::time_point t;
};

class RecordOp final : public Op {
 public:
  RecordOp(std::shared_ptr<EventRec> e, uint32_t pos) : e_(std::move(e)), pos_(pos) {}
  Status run() override {
    if (e_->pos == pos_) {  // (a later record replaced this one: its time is the later one's)
      e_->t = Clock::now();
      e_->has_time = true;
    }
    return kDone;
  }

 private:
  std::shared_ptr<EventRec> e_;
  uint32_t pos_;
};

class NoOp final : public Op {
 public:
  Status run() override { return kDone; }
};

struct State {
  std::mutex mu;
  std::vector<std::unique_ptr<Stream>> streams;  // by index; 0: legacy default, 1: per-thread default
  std::map<cudaStream_t, uint32_t> handles;
  std::map<cudaEvent_t, std::shared_ptr<EventRec>> events;
  std::vector<OpRecord> ops = std::vector<OpRecord>(1);  // by id (0: none)
  std::vector<std::pair<uint32_t, uint32_t>> op_pos = std::vector<std::pair<uint32_t, uint32_t>>(1);
  VC host_vc;
  Rng rng{mix_seed(base_seed(), 0x5eed5)};
  size_t pending = 0;
  std::vector<Stream*> busy;  // streams with queued work
  bool device_thread = false, exiting = false;
  std::atomic<int64_t> last_host_call{0};
  State() {
    for (uint32_t i = 0; i < 2; ++i) {
      auto s = std::make_unique<Stream>();
      s->idx = i;
      streams.push_back(std::move(s));
    }
  }
};
State& st() {
  static State* s = new State;  // never destroyed: ops may still be queued at exit
  return *s;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

cudaError_t fail(cudaError_t e) {
  set_last_error(e);
  return e;
}

Stream* stream_of(State& s, cudaStream_t h) {
  if (h == nullptr || h == cudaStreamLegacy) return s.streams[0].get();
  if (h == cudaStreamPerThread) return s.streams[1].get();
  const auto it = s.handles.find(h);
  return it == s.handles.end() ? nullptr : s.streams[it->second].get();
}

std::string stream_name(uint32_t idx) {
  if (idx == 0) return "the legacy default stream";
  if (idx == 1) return "the per-thread default stream";
  return "stream " + std::to_string(idx);
}

uint32_t enqueue_locked(State& s, Stream& q, std::unique_ptr<Op> op, const OpLabel& label,
                        std::vector<std::pair<uint32_t, uint32_t>> deps = {}, const VC* also = nullptr) {
  merge(q.vc, s.host_vc);
  if (also) merge(q.vc, *also);
  if (q.idx == 0) {  // the legacy stream waits for every blocking stream, and they for it
    for (const auto& b : s.streams) {
      if (b->idx == 0 || !b->blocking) continue;
      if (b->enq > b->done) deps.push_back({b->idx, b->enq});
      merge(q.vc, b->vc);
    }
  } else if (q.blocking) {
    const Stream& l = *s.streams[0];
    if (l.enq > l.done) deps.push_back({0, l.enq});
    merge(q.vc, l.vc);
  }
  ++q.enq;
  if (q.vc.size() <= q.idx) q.vc.resize(q.idx + 1, 0);
  q.vc[q.idx] = q.enq;
  const uint32_t id = uint32_t(s.ops.size());
  s.ops.push_back({q.idx, q.enq, label});
  s.op_pos.push_back({q.idx, q.enq});
  if (q.q.empty()) s.busy.push_back(&q);
  q.q.push_back(Pending{std::move(op), id, std::move(deps), q.vc});
  ++s.pending;
  return id;
}

bool deps_met(const State& s, const Pending& p) {
  for (const auto& [stream, pos] : p.deps)
    if (s.streams[stream]->done < pos) return false;
  return true;
}

Op::Status run_head(State& s, Stream& q) {
  Pending& p = q.q.front();
  g_running = Running{p.id, p.vc.data(), p.vc.size(), s.op_pos.data()};
  const Op::Status r = p.op->run();
  g_running = Running{};
  if (r == Op::kDone) {
    q.q.pop_front();
    ++q.done;
    --s.pending;
    if (q.q.empty()) s.busy.erase(std::find(s.busy.begin(), s.busy.end(), &q));
  }
  return r;
}

double hang_seconds() {
  static const double v = [] {
    const char* e = std::getenv("PRIMUS_EMU_HANG_SECONDS");
    return e && *e ? std::atof(e) : 100.0;
  }();
  return v;
}

[[noreturn]] void report_hang(State& s) {
  std::string what;
  for (const Stream* q : s.busy) {
    what += "\n  " + stream_name(q->idx) + " waits in " + describe_op(q->q.front().id);
    const std::string w = q->q.front().op->waits_for();
    if (!w.empty()) what += ": " + w;
  }
  fatal("emulated device: nothing has progressed for %.0f s (PRIMUS_EMU_HANG_SECONDS): a GPU would hang here. "
        "Queued work:%s",
        hang_seconds(), what.c_str());
}

// One pass: runs the first op, in a random order of the ready streams, that progresses. Returns
// false when every ready op waits for other processes (or nothing is queued).
bool step(State& s) {
  std::vector<Stream*> ready;
  for (Stream* q : s.busy)
    if (deps_met(s, q->q.front())) ready.push_back(q);
  for (size_t k = ready.size(); k > 0; --k) {
    std::swap(ready[s.rng.below(uint32_t(k))], ready[k - 1]);
    if (run_head(s, *ready[k - 1]) != Op::kStalled) return true;
  }
  return false;
}

// Runs ops until `done()` holds (with the lock held; released while waiting for other processes).
void drain(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done) {
  State& s = st();
  Clock::time_point stalled_since{};
  int sleep_us = 1;
  while (!done()) {
    if (step(s)) {
      stalled_since = {};
      sleep_us = 1;
      continue;
    }
    if (s.busy.empty()) fatal("emulated runtime: the host waits for work that is not queued (internal error)");
    const Clock::time_point now = Clock::now();
    if (stalled_since == Clock::time_point{})
      stalled_since = now;
    else if (std::chrono::duration<double>(now - stalled_since).count() > hang_seconds())
      report_hang(s);
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 2000);
    lk.lock();
  }
}

void touch() { st().last_host_call.store(now_ns(), std::memory_order_relaxed); }

std::atomic<uint64_t> g_host_waits{0};  // host_wait_count()

// The host waits until position `pos` of stream `idx` has run; then it knows all that happened
// before that position (`vc`, a copy: the stream's own clock moves on as work is queued).
void host_waits(std::unique_lock<std::mutex>& lk, uint32_t idx, uint32_t pos, const VC vc) {
  ++g_host_waits;
  State& s = st();
  drain(lk, [&] { return s.streams[idx]->done >= pos; });
  merge(s.host_vc, vc);
}

// A query: the device moves on by one op at most (a host polling in a loop sees progress).
cudaError_t host_polls(std::unique_lock<std::mutex>& lk, uint32_t idx, uint32_t pos, const VC vc) {
  State& s = st();
  if (s.streams[idx]->done < pos && !step(s)) {
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lk.lock();
  }
  if (s.streams[idx]->done < pos) return cudaErrorNotReady;
  merge(s.host_vc, vc);
  return cudaSuccess;
}

// The event of a handle, or null (with the lock held).
std::shared_ptr<EventRec> event_of(State& s, cudaEvent_t event) {
  const auto it = s.events.find(event);
  return it == s.events.end() ? nullptr : it->second;
}

void device_thread_main() {
  install_fault_stack();  // (the fault handler's reports need a stack of their own)
  State& s = st();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::unique_lock<std::mutex> lk(s.mu);
    if (s.exiting) return;
    if (!s.pending || now_ns() - s.last_host_call.load(std::memory_order_relaxed) < 20'000'000) continue;
    const Clock::time_point until = Clock::now() + std::chrono::milliseconds(20);
    while (s.pending && Clock::now() < until && step(s)) {
    }
  }
}

}  // namespace

bool valid_stream(cudaStream_t h) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return stream_of(s, h) != nullptr;
}

uint32_t enqueue(cudaStream_t h, std::unique_ptr<Op> op, const OpLabel& label) {
  State& s = st();
  touch();
  std::lock_guard<std::mutex> lock(s.mu);
  Stream* q = stream_of(s, h);
  if (!q) fatal("emulated runtime: work queued on a stream that does not exist (internal error)");
  return enqueue_locked(s, *q, std::move(op), label);
}

void run_and_wait(cudaStream_t h, std::unique_ptr<Op> op, const OpLabel& label) {
  State& s = st();
  touch();
  std::unique_lock<std::mutex> lk(s.mu);
  Stream* q = stream_of(s, h);
  if (!q) fatal("emulated runtime: work queued on a stream that does not exist (internal error)");
  enqueue_locked(s, *q, std::move(op), label);
  host_waits(lk, q->idx, q->enq, q->vc);
}

void wait_until(const std::function<bool()>& done) {
  State& s = st();
  touch();
  std::unique_lock<std::mutex> lk(s.mu);
  drain(lk, done);  // (no host clock update: `done` need not cover a whole stream)
}

void progress_some() {
  State& s = st();
  std::unique_lock<std::mutex> lk(s.mu, std::try_to_lock);
  if (!lk.owns_lock()) return;
  while (s.pending && step(s)) {
  }
}

void start_device_thread() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.device_thread) return;
  s.device_thread = true;
  std::thread(device_thread_main).detach();
  std::atexit([] {
    std::lock_guard<std::mutex> lock(st().mu);
    st().exiting = true;
  });
}

std::string describe_op(uint32_t id) {
  const State& s = st();
  if (id == 0 || id >= s.ops.size()) return "(no op)";
  const OpRecord& r = s.ops[id];
  std::string out = r.label.what;
  if (r.label.file) out += " launched at " + std::string(r.label.file) + ":" + std::to_string(r.label.line);
  if (r.label.caller) out += " by " + std::string(r.label.caller);
  out += " (op " + std::to_string(r.pos) + " of " + stream_name(r.stream) + ")";
  return out;
}

uint64_t host_wait_count() { return g_host_waits.load(); }

}  // namespace emu::detail

using namespace emu::detail;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream) return fail(cudaErrorInvalidValue);
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto q = std::make_unique<Stream>();
  q->idx = uint32_t(s.streams.size());
  q->blocking = !(flags & cudaStreamNonBlocking);
  *stream = reinterpret_cast<cudaStream_t>(new char);
  s.handles[*stream] = q->idx;
  s.streams.push_back(std::move(q));
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

// Work still queued on the stream runs, as on a GPU ("resources are released once the device has
// completed all work in the stream").
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.handles.erase(stream)) return fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  State& s = st();
  touch();
  std::unique_lock<std::mutex> lk(s.mu);
  Stream* q = stream_of(s, stream);
  if (!q) return fail(cudaErrorInvalidResourceHandle);
  host_waits(lk, q->idx, q->enq, q->vc);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  State& s = st();
  touch();
  std::unique_lock<std::mutex> lk(s.mu);
  Stream* q = stream_of(s, stream);
  if (!q) return fail(cudaErrorInvalidResourceHandle);
  return host_polls(lk, q->idx, q->enq, q->vc);
}

cudaError_t cudaDeviceSynchronize(void) {
  State& s = st();
  touch();
  ++g_host_waits;
  std::unique_lock<std::mutex> lk(s.mu);
  std::vector<uint32_t> target;
  VC vc;
  for (const auto& q : s.streams) {
    target.push_back(q->enq);
    merge(vc, q->vc);
  }
  drain(lk, [&] {
    for (size_t i = 0; i < target.size(); ++i)
      if (s.streams[i]->done < target[i]) return false;
    return true;
  });
  merge(s.host_vc, vc);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  if (!event) return fail(cudaErrorInvalidValue);
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  *event = reinterpret_cast<cudaEvent_t>(new char);
  s.events[*event] = std::make_shared<EventRec>();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.events.erase(event)) return fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<char*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  State& s = st();
  touch();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::shared_ptr<EventRec> e = event_of(s, event);
  Stream* q = stream_of(s, stream);
  if (!e || !q) return fail(cudaErrorInvalidResourceHandle);
  e->recorded = true;
  e->has_time = false;
  e->stream = q->idx;
  e->pos = q->enq + 1;
  enqueue_locked(s, *q, std::make_unique<RecordOp>(e, e->pos), OpLabel{"cudaEventRecord"});
  e->vc = q->vc;
  return cudaSuccess;
}

// The stream's later work waits for the event's latest record (none: nothing to wait for).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  State& s = st();
  touch();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::shared_ptr<EventRec> e = event_of(s, event);
  Stream* q = stream_of(s, stream);
  if (!e || !q) return fail(cudaErrorInvalidResourceHandle);
  if (!e->recorded) return cudaSuccess;
  enqueue_locked(s, *q, std::make_unique<NoOp>(), OpLabel{"cudaStreamWaitEvent"}, {{e->stream, e->pos}}, &e->vc);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  State& s = st();
  touch();
  std::unique_lock<std::mutex> lk(s.mu);
  const std::shared_ptr<EventRec> e = event_of(s, event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (e->recorded) host_waits(lk, e->stream, e->pos, e->vc);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  State& s = st();
  touch();
  std::unique_lock<std::mutex> lk(s.mu);
  const std::shared_ptr<EventRec> e = event_of(s, event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  return e->recorded ? host_polls(lk, e->stream, e->pos, e->vc) : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::shared_ptr<EventRec> a = event_of(s, start), b = event_of(s, end);
  if (!ms || !a || !b || !a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (!a->has_time || !b->has_time) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}

}  // extern "C"
