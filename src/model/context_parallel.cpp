#include "model/context_parallel.h"

#include <utility>

#include "core/device.h"

namespace primus {

namespace {

// MPI tags of the ring's messages (NCCL matches by posting order; the tags are checked only).
constexpr int kTagKv = 701, kTagDkv = 702;

// What both ring passes start from: a chunk's geometry, the neighbours on the ring, and this
// rank's [k | v] rows copied out of qkv (the block that travels first) beside a buffer for the next.
struct RingStart {
  int64_t B, ch, rows, HD, KV;
  ops::AttentionShape bs;
  int next_rank, prev_rank;
  Tensor kv, incoming;
};

RingStart ring_start(ops::Backend& be, DType act, const Tensor& qkv, const ops::AttentionShape& s, int rank, int size) {
  const int64_t B = s.batch, ch = s.seq / 2, rows = B * ch, HD = s.heads * s.head_dim;
  const int64_t KV = 2 * s.groups * s.head_dim;
  RingStart r{B, ch, rows, HD, KV, {B, ch, s.heads, s.groups, s.head_dim}, (rank + 1) % size, (rank + size - 1) % size,
              be.empty({2 * rows, KV}, act), be.empty({2 * rows, KV}, act)};
  copy_block(r.kv, 0, 0, qkv, 0, HD, 2 * rows, KV);
  return r;
}

}  // namespace

ContextParallelAttention::ContextParallelAttention(ops::Backend& backend, parallel::ProcessGroup& cp, CpComm comm,
                                                   DType activation)
    : be_(backend),
      cp_(cp),
      comm_(comm),
      act_(activation),
      stat_(ops::stat_dtype(activation)),
      size_(cp.size()),
      rank_(cp.rank()) {}

void ContextParallelAttention::forward(const Tensor& qkv, Tensor& out, AttentionSaves& c, const ops::AttentionShape& s,
                                       const DocumentRows* docs) {
  if (comm_ == CpComm::P2P)
    ring_forward(qkv, out, c, s, docs ? docs->doc_start : Tensor());
  else
    a2a_forward(qkv, out, c, s, docs ? docs->seq_doc_start : Tensor());
}

void ContextParallelAttention::backward(const Tensor& qkv, const Tensor& out, const AttentionSaves& c,
                                        const Tensor& dout, Tensor& dqkv, const ops::AttentionShape& s,
                                        const DocumentRows* docs) {
  if (comm_ == CpComm::P2P)
    ring_backward(qkv, out, c, dout, dqkv, s, docs ? docs->doc_start : Tensor());
  else
    a2a_backward(c, dout, dqkv, s, docs ? docs->seq_doc_start : Tensor());
}

ops::AttentionShape ContextParallelAttention::pair_shape(const ops::AttentionShape& bs, const Tensor& doc_start, int j,
                                                         int key_chunk) const {
  if (!doc_start.defined()) return bs;
  const int64_t rows = bs.batch * bs.seq;
  return with_documents(bs, doc_start.slice(0, j * rows, rows), int64_t(key_chunk) * bs.seq);
}

// ---------------------------------------------------------------------------------------------
// p2p: ring attention

void ContextParallelAttention::ring_forward(const Tensor& qkv, Tensor& out, AttentionSaves& c,
                                            const ops::AttentionShape& s, const Tensor& doc_start) {
  auto [B, ch, rows, HD, KV, bs, next_rank, prev_rank, kv, incoming] = ring_start(be_, act_, qkv, s, rank_, size_);
  Tensor acc[2], lse[2];  // per query chunk: the running output (stat dtype) and log-sum-exp
  for (int i = 0; i < size_; ++i) {
    std::vector<parallel::WorkPtr> moving;
    if (i + 1 < size_) {  // the next block comes in while this one computes
      moving.push_back(cp_.isend(kv, next_rank, kTagKv));
      moving.push_back(cp_.irecv(incoming, prev_rank, kTagKv));
      moving.back()->test();  // starts it (NCCL issues posted transfers at the next call)
    }
    const int src = (rank_ + size_ - i) % size_;
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 2; ++l) {
        const int a = chunk_of(rank_, j), b = chunk_of(src, l);
        if (b > a) continue;  // keys after every query of the chunk
        Tensor o = be_.empty({rows, HD}, act_), L = be_.empty({B, s.heads, ch}, stat_);
        be_.attention_block_forward(qkv.slice(0, j * rows, rows), kv.slice(0, l * rows, rows), o, L,
                                    pair_shape(bs, doc_start, j, b), b == a);
        if (acc[j].defined()) {
          be_.attention_merge(acc[j], lse[j], o, L, bs);
        } else if (act_ == stat_) {
          acc[j] = o;
          lse[j] = L;
        } else {
          acc[j] = be_.empty({rows, HD}, stat_);
          be_.cast(o, acc[j]);
          lse[j] = L;
        }
      }
    parallel::wait_all(moving);
    if (i + 1 < size_) std::swap(kv, incoming);
  }
  c.lse = be_.empty({2, B, s.heads, ch}, stat_);
  for (int j = 0; j < 2; ++j) {
    Tensor o = out.slice(0, j * rows, rows);
    if (act_ == stat_)
      o.copy_from(acc[j]);
    else
      be_.cast(acc[j], o);
    c.lse.slice(0, j, 1).view(lse[j].shape()).copy_from(lse[j]);
  }
}

void ContextParallelAttention::ring_backward(const Tensor& qkv, const Tensor& out, const AttentionSaves& c,
                                             const Tensor& dout, Tensor& dqkv, const ops::AttentionShape& s,
                                             const Tensor& doc_start) {
  auto [B, ch, rows, HD, KV, bs, next_rank, prev_rank, kv, incoming] = ring_start(be_, act_, qkv, s, rank_, size_);
  Tensor dq = be_.zeros({2 * rows, HD}, stat_);
  // The key/value gradient of the block held at step i, summed over the ranks it visited so far,
  // arrives from the previous rank one step later; the last one to arrive is this rank's own.
  Tensor dkv_in;
  parallel::WorkPtr dkv_recv;
  std::vector<parallel::WorkPtr> sent;
  for (int i = 0; i < size_; ++i) {
    std::vector<parallel::WorkPtr> moving;
    if (i + 1 < size_) {
      moving.push_back(cp_.isend(kv, next_rank, kTagKv));
      moving.push_back(cp_.irecv(incoming, prev_rank, kTagKv));
      moving.back()->test();
    }
    const int src = (rank_ + size_ - i) % size_;
    Tensor dkv = be_.zeros({2 * rows, KV}, stat_);
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 2; ++l) {
        const int a = chunk_of(rank_, j), b = chunk_of(src, l);
        if (b > a) continue;
        Tensor dq_j = dq.slice(0, j * rows, rows), dkv_l = dkv.slice(0, l * rows, rows);
        be_.attention_block_backward(qkv.slice(0, j * rows, rows), kv.slice(0, l * rows, rows),
                                     out.slice(0, j * rows, rows), c.lse.slice(0, j, 1).view({B, s.heads, ch}),
                                     dout.slice(0, j * rows, rows), dq_j, dkv_l, pair_shape(bs, doc_start, j, b),
                                     b == a);
      }
    if (dkv_recv) {
      dkv_recv->wait();
      be_.add(dkv, dkv_in, dkv);
    }
    sent.push_back(cp_.isend(dkv, next_rank, kTagDkv));
    dkv_in = be_.empty({2 * rows, KV}, stat_);
    dkv_recv = cp_.irecv(dkv_in, prev_rank, kTagDkv);
    dkv_recv->test();
    parallel::wait_all(moving);
    if (i + 1 < size_) std::swap(kv, incoming);
  }
  dkv_recv->wait();
  parallel::wait_all(sent);
  // dqkv = [dq | dk | dv] in the activation dtype.
  Tensor dq_a = dq, dkv_a = dkv_in;
  if (act_ != stat_) {
    dq_a = be_.empty(dq.shape(), act_);
    dkv_a = be_.empty(dkv_in.shape(), act_);
    be_.cast(dq, dq_a);
    be_.cast(dkv_in, dkv_a);
  }
  copy_block(dqkv, 0, 0, dq_a, 0, 0, 2 * rows, HD);
  copy_block(dqkv, 0, HD, dkv_a, 0, 0, 2 * rows, KV);
}

// ---------------------------------------------------------------------------------------------
// a2a: all-to-all over heads

namespace {

// Rows of every rank's two chunks (blocks of rank q at rows [q n, (q+1) n), n = 2 batch ch, each in
// [chunk][batch][position] order) to the whole sequences in position order ([batch][position]), or
// back (core/context_parallel_rows.h). width: columns of both.
void chunks_to_sequence(const Tensor& ranks_rows, const Tensor& sequence, int cp, int64_t batch, int64_t ch,
                        int64_t width, bool to_sequence) {
  const int64_t S = 2 * cp * ch;
  const Tensor blocks = ranks_rows.view({int64_t(cp) * 2 * batch, ch * width});  // row: (q, j, b)
  const Tensor seqs = sequence.view({batch, S * width});                       // row: b
  for (int q = 0; q < cp; ++q)
    for (int j = 0; j < 2; ++j) {
      const int64_t col = cp_chunk_index(j, cp, q) * ch * width, row = (int64_t(q) * 2 + j) * batch;
      if (to_sequence)
        copy_block(seqs, 0, col, blocks, row, 0, batch, ch * width);
      else
        copy_block(blocks, row, 0, seqs, 0, col, batch, ch * width);
    }
}

}  // namespace

void ContextParallelAttention::a2a_forward(const Tensor& qkv, Tensor& out, AttentionSaves& c,
                                           const ops::AttentionShape& s, const Tensor& seq_doc_start) {
  const int P = size_;
  const int64_t D = s.head_dim, Hc = s.heads / P, Gc = s.groups / P, HD = s.heads * D, GD = s.groups * D;
  const int64_t B = s.batch, ch = s.seq / 2, N = B * s.seq, S = s.seq * P, Qc = (Hc + 2 * Gc) * D;
  const parallel::CommType t = parallel::comm_type_of(act_);
  // Rank q receives its heads' q, k and v columns of every row here.
  Tensor send = be_.empty({P * N, Qc}, act_), recv = be_.empty({P * N, Qc}, act_);
  for (int q = 0; q < P; ++q) {
    copy_block(send, q * N, 0, qkv, 0, q * Hc * D, N, Hc * D);
    copy_block(send, q * N, Hc * D, qkv, 0, HD + q * Gc * D, N, Gc * D);
    copy_block(send, q * N, (Hc + Gc) * D, qkv, 0, HD + GD + q * Gc * D, N, Gc * D);
  }
  cp_.all_to_all(send.raw(), recv.raw(), N * Qc, t);
  c.seq_qkv = be_.empty({B * S, Qc}, act_);
  chunks_to_sequence(recv, c.seq_qkv, P, B, ch, Qc, true);
  c.seq_out = be_.empty({B * S, Hc * D}, act_);
  c.lse = be_.empty({B, Hc, S}, stat_);
  be_.attention_forward(c.seq_qkv, c.seq_out, c.lse, with_documents({B, S, Hc, Gc, D}, seq_doc_start));
  // Every rank's rows of this rank's heads go back to it.
  Tensor back = be_.empty({P * N, Hc * D}, act_), mine = be_.empty({P * N, Hc * D}, act_);
  chunks_to_sequence(back, c.seq_out, P, B, ch, Hc * D, false);
  cp_.all_to_all(back.raw(), mine.raw(), N * Hc * D, t);
  for (int q = 0; q < P; ++q) copy_block(out, 0, q * Hc * D, mine, q * N, 0, N, Hc * D);
}

void ContextParallelAttention::a2a_backward(const AttentionSaves& c, const Tensor& dout, Tensor& dqkv,
                                            const ops::AttentionShape& s, const Tensor& seq_doc_start) {
  const int P = size_;
  const int64_t D = s.head_dim, Hc = s.heads / P, Gc = s.groups / P, HD = s.heads * D, GD = s.groups * D;
  const int64_t B = s.batch, ch = s.seq / 2, N = B * s.seq, S = s.seq * P, Qc = (Hc + 2 * Gc) * D;
  const parallel::CommType t = parallel::comm_type_of(act_);
  Tensor send = be_.empty({P * N, Hc * D}, act_), recv = be_.empty({P * N, Hc * D}, act_);
  for (int q = 0; q < P; ++q) copy_block(send, q * N, 0, dout, 0, q * Hc * D, N, Hc * D);
  cp_.all_to_all(send.raw(), recv.raw(), N * Hc * D, t);
  Tensor dout_full = be_.empty({B * S, Hc * D}, act_), dqkv_full = be_.empty({B * S, Qc}, act_);
  chunks_to_sequence(recv, dout_full, P, B, ch, Hc * D, true);
  be_.attention_backward(c.seq_qkv, c.seq_out, c.lse, dout_full, dqkv_full,
                         with_documents({B, S, Hc, Gc, D}, seq_doc_start));
  Tensor back = be_.empty({P * N, Qc}, act_), mine = be_.empty({P * N, Qc}, act_);
  chunks_to_sequence(back, dqkv_full, P, B, ch, Qc, false);
  cp_.all_to_all(back.raw(), mine.raw(), N * Qc, t);
  for (int q = 0; q < P; ++q) {
    copy_block(dqkv, 0, q * Hc * D, mine, q * N, 0, N, Hc * D);
    copy_block(dqkv, 0, HD + q * Gc * D, mine, q * N, Hc * D, N, Gc * D);
    copy_block(dqkv, 0, HD + GD + q * Gc * D, mine, q * N, (Hc + Gc) * D, N, Gc * D);
  }
}

}  // namespace primus
