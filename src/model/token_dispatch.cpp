#include "model/token_dispatch.h"

#include <algorithm>

#include "core/error.h"

namespace primus {

TokenDispatch parse_token_dispatch(const std::string& s) {
  if (s == "allgather") return TokenDispatch::AllGather;
  if (s == "alltoall") return TokenDispatch::AllToAll;
  fail("moe_token_dispatcher_type '{}' is not one of: allgather, alltoall", s);
}

TokenDispatcher::TokenDispatcher(parallel::ProcessGroup& ep, ops::Backend& backend, int64_t num_experts,
                                 TokenDispatch type)
    : ep_(ep), be_(backend), E_(num_experts), local_(num_experts / ep.size()), type_(type) {
  if (num_experts % ep.size() != 0)
    fail("num_experts ({}) must be divisible by expert_model_parallel_size ({})", num_experts, ep.size());
}

DispatchPlan TokenDispatcher::plan(const std::vector<int64_t>& token_offsets) const {
  PRIMUS_CHECK(int64_t(token_offsets.size()) == E_ + 1, "dispatch plan: {} offsets for {} experts",
               token_offsets.size(), E_);
  const int P = ep_.size();
  // The counts travel as int32 on the group's device (NCCL needs device buffers).
  Tensor mine = Tensor::empty({E_}, DType::I32, Device::CPU);
  for (int64_t e = 0; e < E_; ++e)
    mine.data<int32_t>()[e] = int32_t(token_offsets[size_t(e + 1)] - token_offsets[size_t(e)]);
  Tensor send = be_.empty({E_}, DType::I32), recv = be_.empty({int64_t(P) * E_}, DType::I32);
  send.copy_from(mine);
  ep_.all_gather(send.raw(), recv.raw(), E_, parallel::CommType::I32);
  Tensor all = Tensor::empty({int64_t(P) * E_}, DType::I32, Device::CPU);
  all.copy_from(recv);
  // Without values (the shape-only walk) every rank routes as this one does: the same counts.
  const Tensor& counts = be_.device() == Device::Meta ? mine : all;
  DispatchPlan p;
  for (int s = 0; s < (be_.device() == Device::Meta ? P : 1); ++s)
    p.counts.insert(p.counts.end(), counts.data<int32_t>(), counts.data<int32_t>() + counts.numel());
  p.expert_offsets.assign(size_t(E_ + 1), 0);
  const int me = ep_.rank();
  for (int64_t e = 0; e < E_; ++e) {
    int64_t n = 0;
    if (e / local_ == me)
      for (int s = 0; s < P; ++s) n += count(p, s, e);
    p.expert_offsets[size_t(e + 1)] = p.expert_offsets[size_t(e)] + n;
  }
  p.token_rows = token_offsets.back();
  p.expert_rows = p.expert_offsets.back();
  return p;
}

int64_t TokenDispatcher::token_first(const DispatchPlan& p, int src, int dst) const {
  int64_t n = 0;
  for (int64_t e = 0; e < int64_t(dst) * local_; ++e) n += count(p, src, e);
  return n;
}

int64_t TokenDispatcher::to_rank(const DispatchPlan& p, int src, int dst) const {
  int64_t n = 0;
  for (int64_t e = int64_t(dst) * local_; e < int64_t(dst + 1) * local_; ++e) n += count(p, src, e);
  return n;
}

// alltoall: the most rows one rank sends another (every piece is padded to it).
int64_t TokenDispatcher::piece_rows(const DispatchPlan& p) const {
  int64_t pad = 0;
  for (int s = 0; s < ep_.size(); ++s)
    for (int d = 0; d < ep_.size(); ++d) pad = std::max(pad, to_rank(p, s, d));
  return pad;
}

// allgather: the most token-side rows of one rank.
int64_t TokenDispatcher::rank_rows(const DispatchPlan& p) const {
  int64_t pad = 0;
  for (int s = 0; s < ep_.size(); ++s) pad = std::max(pad, token_first(p, s, ep_.size()));
  return pad;
}

namespace {

// Calls f(expert side row, row inside src's piece for this rank, rows) for each of this rank's
// experts that src sent rows to. The piece is src's rows for this rank, in expert order.
template <typename F>
void for_pieces(const DispatchPlan& p, int me, int64_t E, int64_t L, int src, F&& f) {
  int64_t in_piece = 0;
  for (int64_t e = int64_t(me) * L; e < int64_t(me + 1) * L; ++e) {
    int64_t before = 0;  // rows of lower source ranks in this expert
    for (int s = 0; s < src; ++s) before += p.counts[size_t(s * E + e)];
    const int64_t n = p.counts[size_t(src * E + e)];
    if (n > 0) f(p.expert_offsets[size_t(e)] + before, in_piece, n);
    in_piece += n;
  }
}

void copy_rows(Tensor& dst, int64_t at, const Tensor& src, int64_t from, int64_t n) {
  Tensor d = dst.slice(0, at, n);
  d.copy_from(src.slice(0, from, n));
}

}  // namespace

Tensor TokenDispatcher::dispatch(const DispatchPlan& p, const Tensor& token_rows, int64_t width, DType dtype) const {
  const int P = ep_.size(), me = ep_.rank();
  const parallel::CommType ct = parallel::comm_type_of(dtype);
  Tensor out = p.expert_rows > 0 ? be_.empty({p.expert_rows, width}, dtype) : Tensor();
  if (type_ == TokenDispatch::AllToAll) {
    const int64_t pad = piece_rows(p);
    if (pad == 0) return out;
    Tensor send = be_.zeros({P * pad, width}, dtype), recv = be_.empty({P * pad, width}, dtype);
    for (int d = 0; d < P; ++d)
      if (const int64_t n = to_rank(p, me, d); n > 0) copy_rows(send, d * pad, token_rows, token_first(p, me, d), n);
    ep_.all_to_all(send.raw(), recv.raw(), pad * width, ct);
    for (int s = 0; s < P; ++s)
      for_pieces(p, me, E_, local_, s,
                 [&](int64_t at, int64_t in_piece, int64_t n) { copy_rows(out, at, recv, s * pad + in_piece, n); });
    return out;
  }
  const int64_t pad = rank_rows(p);
  if (pad == 0) return out;
  Tensor send = be_.zeros({pad, width}, dtype), recv = be_.empty({P * pad, width}, dtype);
  if (p.token_rows > 0) copy_rows(send, 0, token_rows, 0, p.token_rows);
  ep_.all_gather(send.raw(), recv.raw(), pad * width, ct);
  for (int s = 0; s < P; ++s) {
    const int64_t first = token_first(p, s, me);
    for_pieces(p, me, E_, local_, s, [&](int64_t at, int64_t in_piece, int64_t n) {
      copy_rows(out, at, recv, s * pad + first + in_piece, n);
    });
  }
  return out;
}

Tensor TokenDispatcher::combine(const DispatchPlan& p, const Tensor& expert_rows, int64_t width, DType dtype) const {
  const int P = ep_.size(), me = ep_.rank();
  const parallel::CommType ct = parallel::comm_type_of(dtype);
  Tensor out = p.token_rows > 0 ? be_.empty({p.token_rows, width}, dtype) : Tensor();
  if (type_ == TokenDispatch::AllToAll) {
    const int64_t pad = piece_rows(p);
    if (pad == 0) return out;
    Tensor send = be_.zeros({P * pad, width}, dtype), recv = be_.empty({P * pad, width}, dtype);
    for (int s = 0; s < P; ++s)  // back to each source rank, in the order it sent them
      for_pieces(p, me, E_, local_, s,
                 [&](int64_t at, int64_t in_piece, int64_t n) { copy_rows(send, s * pad + in_piece, expert_rows, at, n); });
    ep_.all_to_all(send.raw(), recv.raw(), pad * width, ct);
    for (int d = 0; d < P; ++d)
      if (const int64_t n = to_rank(p, me, d); n > 0) copy_rows(out, token_first(p, me, d), recv, d * pad, n);
    return out;
  }
  const int64_t pad = rank_rows(p);
  if (pad == 0) return out;
  // Each rank writes its experts' outputs where the rows sat in the gathered buffer; the sum over
  // ranks adds zeros to every row but one, so each rank receives its own rows unchanged.
  Tensor send = be_.zeros({P * pad, width}, dtype), recv = be_.empty({pad, width}, dtype);
  for (int s = 0; s < P; ++s) {
    const int64_t first = token_first(p, s, me);
    for_pieces(p, me, E_, local_, s, [&](int64_t at, int64_t in_piece, int64_t n) {
      copy_rows(send, s * pad + first + in_piece, expert_rows, at, n);
    });
  }
  ep_.reduce_scatter(send.raw(), recv.raw(), pad * width, ct, parallel::ReduceOp::Sum);
  if (p.token_rows > 0) copy_rows(out, 0, recv, 0, p.token_rows);
  return out;
}

}  // namespace primus
