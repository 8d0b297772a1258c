#include "parallel/process_group.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::F32: return 4;
    case CommType::F64: return 8;
    case CommType::BF16: return 2;
    case CommType::F16: return 2;
    case CommType::I32: return 4;
    case CommType::I64: return 8;
    case CommType::U8: return 1;
  }
  return 0;
}

const char* comm_type_name(CommType t) {
  switch (t) {
    case CommType::F32: return "fp32";
    case CommType::F64: return "fp64";
    case CommType::BF16: return "bf16";
    case CommType::F16: return "fp16";
    case CommType::I32: return "int32";
    case CommType::I64: return "int64";
    case CommType::U8: return "uint8";
  }
  return "?";
}

CommType comm_type_of(DType t) {
  switch (t) {
    case DType::F32: return CommType::F32;
    case DType::F64: return CommType::F64;
    case DType::BF16: return CommType::BF16;
    case DType::F16: return CommType::F16;
    case DType::I32: return CommType::I32;
    case DType::F8E4M3: return CommType::U8;  // bytes: moved, never reduced
  }
  fail("no wire type for dtype {}", static_cast<int>(t));
}

void wait_all(std::vector<WorkPtr>& works) {
  for (auto& w : works)
    if (w) w->wait();
}

std::unique_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  if (ranks.empty()) fail("new_group '{}' on {}: the rank list is empty", name, describe());
  std::vector<int> seen;
  for (int r : ranks) {
    check_rank("new_group", "member rank", r);
    if (std::find(seen.begin(), seen.end(), r) != seen.end())
      fail("new_group '{}' on {}: rank {} is listed twice", name, describe(), r);
    seen.push_back(r);
  }
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  const int color = it == ranks.end() ? -1 : 0;
  const int key = it == ranks.end() ? 0 : static_cast<int>(it - ranks.begin());
  return split(color, key, name);
}

std::string ProcessGroup::describe() const {
  return fmt::format("{} group (world ranks {})", name(), fmt::join(world_ranks(), ","));
}

void ProcessGroup::check_rank(const char* op, const char* what, int r) const {
  if (r < 0 || r >= size())
    fail("{} on {}: {} {} is out of range (the group has {} rank{})", op, describe(), what, r,
         size(), size() == 1 ? "" : "s");
}

void ProcessGroup::check_count(const char* op, int64_t count) const {
  if (count < 0) fail("{} on {}: negative element count {}", op, describe(), count);
}

void ProcessGroup::check_tensor(const char* op, const char* what, const Tensor& t) const {
  if (!t.defined()) fail("{} on {}: {} tensor is undefined", op, describe(), what);
  if (!t.is_contiguous())
    fail("{} on {}: {} tensor {} is not contiguous (communicate a contiguous copy)", op,
         describe(), what, t.shape_str());
  if (t.device() != device())
    fail("{} on {}: {} tensor lives on the {} but the {} backend needs {} buffers", op, describe(),
         what, t.device() == Device::CPU ? "CPU" : "GPU", backend(),
         device() == Device::CPU ? "CPU" : "GPU");
}

namespace {
// The two tensors of a reduce_scatter/all_gather/all_to_all: same dtype, sizes related by n.
void check_pair(const ProcessGroup& g, const char* op, const Tensor& in, const Tensor& out,
                int64_t in_per_out_num, int64_t in_per_out_den) {
  if (in.dtype() != out.dtype())
    fail("{} on {}: input is {} but output is {}", op, g.describe(), dtype_name(in.dtype()),
         dtype_name(out.dtype()));
  // in.numel() must equal out.numel() * num / den.
  if (in.numel() * in_per_out_den != out.numel() * in_per_out_num)
    fail("{} on {}: input has {} elements ({}) and output {} ({}); with {} ranks the {} must be "
         "{} times the {}",
         op, g.describe(), in.numel(), in.shape_str(), out.numel(), out.shape_str(), g.size(),
         in_per_out_num >= in_per_out_den ? "input" : "output",
         in_per_out_num >= in_per_out_den ? in_per_out_num / in_per_out_den
                                          : in_per_out_den / in_per_out_num,
         in_per_out_num >= in_per_out_den ? "output" : "input");
}
}  // namespace

void ProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", "the", t);
  all_reduce(t.raw(), t.numel(), comm_type_of(t.dtype()), op);
}

void ProcessGroup::reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) {
  check_tensor("reduce_scatter", "input", input);
  check_tensor("reduce_scatter", "output", output);
  check_pair(*this, "reduce_scatter", input, output, size(), 1);
  reduce_scatter(input.raw(), output.raw(), output.numel(), comm_type_of(input.dtype()), op);
}

void ProcessGroup::all_gather(const Tensor& input, Tensor& output) {
  check_tensor("all_gather", "input", input);
  check_tensor("all_gather", "output", output);
  check_pair(*this, "all_gather", input, output, 1, size());
  all_gather(input.raw(), output.raw(), input.numel(), comm_type_of(input.dtype()));
}

void ProcessGroup::broadcast(Tensor& t, int root) {
  check_tensor("broadcast", "the", t);
  broadcast(t.raw(), t.numel(), comm_type_of(t.dtype()), root);
}

void ProcessGroup::all_to_all(const Tensor& input, Tensor& output) {
  check_tensor("all_to_all", "input", input);
  check_tensor("all_to_all", "output", output);
  check_pair(*this, "all_to_all", input, output, 1, 1);
  if (input.numel() % size() != 0)
    fail("all_to_all on {}: {} elements ({}) do not split into {} equal chunks", describe(),
         input.numel(), input.shape_str(), size());
  all_to_all(input.raw(), output.raw(), input.numel() / size(), comm_type_of(input.dtype()));
}

WorkPtr ProcessGroup::iall_reduce(Tensor& t, ReduceOp op) {
  check_tensor("iall_reduce", "the", t);
  auto w = iall_reduce(t.raw(), t.numel(), comm_type_of(t.dtype()), op);
  w->keep_alive(t);
  return w;
}

WorkPtr ProcessGroup::ireduce_scatter(const Tensor& input, Tensor& output, ReduceOp op) {
  check_tensor("ireduce_scatter", "input", input);
  check_tensor("ireduce_scatter", "output", output);
  check_pair(*this, "ireduce_scatter", input, output, size(), 1);
  auto w = ireduce_scatter(input.raw(), output.raw(), output.numel(), comm_type_of(input.dtype()),
                           op);
  w->keep_alive(input);
  w->keep_alive(output);
  return w;
}

WorkPtr ProcessGroup::iall_gather(const Tensor& input, Tensor& output) {
  check_tensor("iall_gather", "input", input);
  check_tensor("iall_gather", "output", output);
  check_pair(*this, "iall_gather", input, output, 1, size());
  auto w = iall_gather(input.raw(), output.raw(), input.numel(), comm_type_of(input.dtype()));
  w->keep_alive(input);
  w->keep_alive(output);
  return w;
}

WorkPtr ProcessGroup::isend(const Tensor& t, int dst, int tag) {
  check_tensor("isend", "the", t);
  auto w = isend(t.raw(), t.numel(), comm_type_of(t.dtype()), dst, tag);
  w->keep_alive(t);
  return w;
}

WorkPtr ProcessGroup::irecv(Tensor& t, int src, int tag) {
  check_tensor("irecv", "the", t);
  auto w = irecv(t.raw(), t.numel(), comm_type_of(t.dtype()), src, tag);
  w->keep_alive(t);
  return w;
}

}  // namespace primus::parallel

namespace primus::parallel {

std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& text) {
  std::vector<int64_t> lens(size_t(pg.size()));
  int64_t len = int64_t(text.size());
  pg.all_gather(&len, lens.data(), 1, CommType::I64);
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::string mine = text;
  mine.resize(size_t(longest), ' ');
  std::vector<char> all(size_t(longest) * size_t(pg.size()));
  pg.all_gather(mine.data(), all.data(), longest, CommType::U8);
  std::vector<std::string> out;
  for (int r = 0; r < pg.size(); ++r)
    out.emplace_back(all.data() + size_t(r) * size_t(longest), size_t(lens[size_t(r)]));
  return out;
}

}  // namespace primus::parallel
