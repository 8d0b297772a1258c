#include "parallel/self_process_group.h"

#include <cstring>

#include "core/error.h"

namespace primus::parallel {
namespace {
struct DoneWork final : Work {
  void wait() override {}
  bool test() override { return true; }
};
void copy(const void* src, void* dst, int64_t count, CommType t) {
  if (src != dst && count > 0) std::memmove(dst, src, size_t(count) * comm_type_size(t));
}
}  // namespace

void SelfProcessGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp) {
  check_count("reduce_scatter", recv_count);
  copy(send, recv, recv_count, t);
}
void SelfProcessGroup::all_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  check_count("all_gather", send_count);
  copy(send, recv, send_count, t);
}
void SelfProcessGroup::broadcast(void*, int64_t count, CommType, int root) {
  check_count("broadcast", count);
  check_rank("broadcast", "root", root);
}
void SelfProcessGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) {
  check_count("all_to_all", count_per_rank);
  copy(send, recv, count_per_rank, t);
}
WorkPtr SelfProcessGroup::iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) {
  all_reduce(buf, count, t, op);
  return std::make_unique<DoneWork>();
}
WorkPtr SelfProcessGroup::ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) {
  reduce_scatter(send, recv, recv_count, t, op);
  return std::make_unique<DoneWork>();
}
WorkPtr SelfProcessGroup::iall_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  all_gather(send, recv, send_count, t);
  return std::make_unique<DoneWork>();
}
WorkPtr SelfProcessGroup::isend(const void*, int64_t, CommType, int dst, int) {
  fail("{}: a group of one process has no peer to send to (rank {})", describe(), dst);
}
WorkPtr SelfProcessGroup::irecv(void*, int64_t, CommType, int src, int) {
  fail("{}: a group of one process has no peer to receive from (rank {})", describe(), src);
}
std::unique_ptr<ProcessGroup> SelfProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  for (int r : ranks) check_rank("new_group", "member", r);
  if (ranks.empty()) return nullptr;
  return std::make_unique<SelfProcessGroup>(name);
}
std::unique_ptr<ProcessGroup> SelfProcessGroup::split(int color, int, const std::string& name) {
  if (color < 0) return nullptr;
  return std::make_unique<SelfProcessGroup>(name);
}

}  // namespace primus::parallel
