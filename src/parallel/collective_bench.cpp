#include "parallel/collective_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"
#include "core/tensor.h"

namespace primus::parallel {
namespace {

struct OpName {
  CollOp op;
  const char* names[3];
};
const OpName kOpNames[] = {
    {CollOp::AllReduce, {"all_reduce", "allreduce", nullptr}},
    {CollOp::AllGather, {"all_gather", "allgather", nullptr}},
    {CollOp::ReduceScatter, {"reduce_scatter", "reducescatter", nullptr}},
    {CollOp::AllToAll, {"alltoall", "all_to_all", "a2a"}},
    {CollOp::Broadcast, {"broadcast", "bcast", nullptr}},
    {CollOp::SendRecv, {"sendrecv", "send_recv", "p2p"}},
};

// The check pattern: rank r's element i of its input (whole numbers 0..2).
double pattern(int r, int64_t i) { return double((i + 2 * int64_t(r)) % 3); }

Tensor host_pattern(DType t, int r, int64_t n, int64_t offset = 0) {
  Tensor h = Tensor::empty({n}, t);
  for (int64_t i = 0; i < n; ++i) {
    const double v = pattern(r, offset + i);
    switch (t) {
      case DType::F32: h.data<float>()[i] = float(v); break;
      case DType::F64: h.data<double>()[i] = v; break;
      case DType::BF16: h.data<bf16>()[i] = bf16::from_float(float(v)); break;
      case DType::I32: h.data<int32_t>()[i] = int32_t(v); break;
      default: fail("benchmark collectives: dtype {} is not supported", dtype_name(t));
    }
  }
  return h;
}

double value_at(const Tensor& h, int64_t i) {
  switch (h.dtype()) {
    case DType::F32: return h.data<float>()[i];
    case DType::F64: return h.data<double>()[i];
    case DType::BF16: return h.data<bf16>()[i].to_float();
    case DType::I32: return h.data<int32_t>()[i];
    default: return std::nan("");
  }
}

// The buffers of one op on this rank, and how to run it and check it.
class OpRun {
 public:
  OpRun(ProcessGroup& g, CollOp op, DType t, int64_t per_rank)
      : g_(g),
        op_(op),
        t_(t),
        ct_(comm_type_of(t)),
        c_(per_rank),
        n_(g.size()),
        r_(g.rank()),
        has_recv_(op != CollOp::AllReduce && op != CollOp::Broadcast) {
    const int64_t in = op == CollOp::ReduceScatter || op == CollOp::AllToAll ? c_ * n_ : c_;
    const int64_t out = op == CollOp::AllGather || op == CollOp::AllToAll ? c_ * n_ : c_;
    send_ = Tensor::zeros({in}, t, g.device());
    if (has_recv_) recv_ = Tensor::zeros({out}, t, g.device());
  }

  void run() {
    switch (op_) {
      case CollOp::AllReduce: g_.all_reduce(send_.raw(), c_, ct_, ReduceOp::Sum); break;
      case CollOp::AllGather: g_.all_gather(send_.raw(), recv_.raw(), c_, ct_); break;
      case CollOp::ReduceScatter: g_.reduce_scatter(send_.raw(), recv_.raw(), c_, ct_, ReduceOp::Sum); break;
      case CollOp::AllToAll: g_.all_to_all(send_.raw(), recv_.raw(), c_, ct_); break;
      case CollOp::Broadcast: g_.broadcast(send_.raw(), c_, ct_, 0); break;
      case CollOp::SendRecv: {
        std::vector<WorkPtr> w;
        w.push_back(g_.irecv(recv_.raw(), c_, ct_, (r_ + n_ - 1) % n_));
        w.push_back(g_.isend(send_.raw(), c_, ct_, (r_ + 1) % n_));
        wait_all(w);
        break;
      }
    }
  }

  // Fills the input with the pattern, runs once, returns the elements of this rank's result that
  // differ from the expected one.
  int64_t check() {
    if (op_ == CollOp::Broadcast && r_ != 0) {
      send_.zero_();
    } else {
      send_.copy_from(host_pattern(t_, r_, send_.numel()).to(g_.device()));
    }
    run();
    const Tensor got = (has_recv_ ? recv_ : send_).to(Device::CPU);
    const double tol = t_ == DType::BF16 && n_ > 128 ? 1.0 / 128 : 0.0;  // sums past 256 round in bf16
    int64_t wrong = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const double want = expected(i);
      if (std::abs(value_at(got, i) - want) > tol * std::abs(want)) ++wrong;
    }
    return wrong;
  }

  void clear() {  // the timed runs start from zeros (repeated in-place sums stay finite)
    send_.zero_();
    if (has_recv_) recv_.zero_();
  }

 private:
  double sum_over_ranks(int64_t i) const {
    double s = 0;
    for (int q = 0; q < n_; ++q) s += pattern(q, i);
    return s;
  }
  double expected(int64_t i) const {
    switch (op_) {
      case CollOp::AllReduce: return sum_over_ranks(i);
      case CollOp::AllGather: return pattern(int(i / c_), i % c_);
      case CollOp::ReduceScatter: return sum_over_ranks(int64_t(r_) * c_ + i);
      case CollOp::AllToAll: return pattern(int(i / c_), int64_t(r_) * c_ + i % c_);
      case CollOp::Broadcast: return pattern(0, i);
      case CollOp::SendRecv: return pattern((r_ + n_ - 1) % n_, i);
    }
    return 0;
  }

  ProcessGroup& g_;
  CollOp op_;
  DType t_;
  CommType ct_;
  int64_t c_;
  int n_, r_;
  bool has_recv_;  // all_reduce and broadcast work in place
  Tensor send_, recv_;
};

bool is_split(CollOp op) { return op == CollOp::AllGather || op == CollOp::ReduceScatter || op == CollOp::AllToAll; }

}  // namespace

const char* coll_op_name(CollOp op) {
  for (const auto& o : kOpNames)
    if (o.op == op) return o.names[0];
  return "?";
}

CollOp parse_coll_op(const std::string& name) {
  std::vector<std::string> ours;
  for (const auto& o : kOpNames) {
    ours.push_back(o.names[0]);
    for (const char* n : o.names)
      if (n && name == n) return o.op;
  }
  fail("unknown collective '{}'; one of: {}", name, fmt::join(ours, ", "));
}

DType parse_coll_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "float") return DType::F32;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  if (name == "float64" || name == "fp64" || name == "double") return DType::F64;
  if (name == "int32" || name == "int") return DType::I32;
  fail("unknown dtype '{}' for benchmark collectives; one of: float32, bfloat16, float64, int32", name);
}

double bus_bandwidth_factor(CollOp op, int n) {
  switch (op) {
    case CollOp::AllReduce: return 2.0 * double(n - 1) / double(n);
    case CollOp::AllGather:
    case CollOp::ReduceScatter:
    case CollOp::AllToAll: return double(n - 1) / double(n);
    case CollOp::Broadcast:
    case CollOp::SendRecv: return 1.0;
  }
  return 1.0;
}

int64_t elements_per_rank(CollOp op, int64_t bytes, DType t, int n) {
  const int64_t elements = bytes / int64_t(dtype_size(t));
  return is_split(op) ? elements / n : elements;
}

int64_t measured_bytes(CollOp op, int64_t per_rank, DType t, int n) {
  return per_rank * int64_t(dtype_size(t)) * (is_split(op) ? n : 1);
}

CollResult run_collective(ProcessGroup& g, CollOp op, DType t, int64_t bytes, const CollBenchOptions& o) {
  CollResult r;
  r.op = op;
  r.dtype = t;
  r.ranks = g.size();
  r.count = elements_per_rank(op, bytes, t, g.size());
  if (r.count <= 0)
    fail("benchmark collectives: {} bytes of {} is less than one element per rank for {} over {} ranks", bytes,
         dtype_name(t), coll_op_name(op), g.size());
  r.bytes = measured_bytes(op, r.count, t, g.size());
  OpRun run(g, op, t, r.count);
  if (o.check) {
    r.checked = true;
    r.wrong = g.all_reduce_value(run.check());
  }
  run.clear();
  for (int i = 0; i < o.warmup; ++i) run.run();
  g.barrier();  // on GPUs also waits for the group's stream
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) run.run();
  g.barrier();
  const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
  r.seconds = g.all_reduce_value(mine, ReduceOp::Max);
  r.algbw_gbs = double(r.bytes) / r.seconds / 1e9;
  r.busbw_gbs = r.algbw_gbs * bus_bandwidth_factor(op, g.size());
  return r;
}

std::vector<int64_t> size_sweep(int64_t min_bytes, int64_t max_bytes, double factor) {
  if (min_bytes <= 0) fail("--min-bytes must be positive, got {}", min_bytes);
  if (max_bytes < min_bytes) fail("--max-bytes ({}) is less than --min-bytes ({})", max_bytes, min_bytes);
  if (!(factor > 1)) fail("--step-factor must be greater than 1, got {}", factor);
  std::vector<int64_t> out;
  for (double b = double(min_bytes); b <= double(max_bytes) * (1 + 1e-12); b *= factor) out.push_back(int64_t(b));
  return out;
}

int64_t parse_byte_size(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  double scale = 1;
  if (unit == "K" || unit == "k" || unit == "KB" || unit == "KiB")
    scale = 1024.0;
  else if (unit == "M" || unit == "m" || unit == "MB" || unit == "MiB")
    scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GB" || unit == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    fail("'{}' is not a size (bytes, or a number with K, M or G)", text);
  if (end == text.c_str() || !(v > 0)) fail("'{}' is not a size (bytes, or a number with K, M or G)", text);
  return int64_t(v * scale);
}

}  // namespace primus::parallel
