// Attention under context parallelism: the attention core (model/attention_core.h) of a layout
// with context_parallel_size > 1.
//
// Each of the cp ranks holds two chunks of every sequence, chunk r and chunk 2 cp - 1 - r of the
// 2 cp equal chunks (Megatron's and Transformer Engine's load balance: the early chunk sees few
// keys, the late one many, so every rank does the same causal work), its rows ordered [chunk j in
// {0, 1}][batch][position]. Its queries must attend to the keys and values of every earlier
// position, which live on the other ranks.
//
// p2p (ring attention). The rank's keys and values ([k | v] columns, 2 chunks) travel around the
// cp group: at step i the rank holds those of rank (r - i) mod cp, posts the send of that block to
// rank r + 1 and the receive of the next from rank r - 1, and computes meanwhile. A query chunk a
// against a key chunk b is full attention when b < a, causal when b == a (the diagonal), skipped
// when b > a; each pair's output and log-sum-exp are merged into the running fp32 result
// (backend attention_merge). Every step costs every rank the same: the causal diagonal at step 0,
// then both query chunks against the early key chunk (from a lower rank) or the late query chunk
// against both key chunks (from a higher rank). The backward walks the same ring with the merged
// output and log-sum-exp: dq accumulates here; each key/value block's gradient travels with it,
// each rank adding its share, and arrives back at its owner after the last step. Key/value blocks
// move in the activation dtype, their gradients in fp32 (the stat dtype).
//
// a2a (Ulysses). An all-to-all over the cp group exchanges the rank's rows of heads for every
// rank's rows of heads/cp heads (and query groups/cp groups): each rank then holds the whole
// sequence, in position order, for its heads, runs the one-process attention kernel on it, and a
// second all-to-all returns the output rows to their owners. The backward mirrors it. Needs heads
// and query groups (per tensor-parallel rank) divisible by cp; the whole sequence's qkv and output
// of the rank's heads stay saved for the backward.
#pragma once

#include <cstdint>
#include <vector>

#include "core/context_parallel_rows.h"
#include "kernels/backend.h"
#include "model/attention_core.h"
#include "parallel/process_group.h"

namespace primus {

// A rank's rows are its two chunks of every sequence, [chunk j][batch][seq / (2 cp)]: the data
// loader hands them over in that order (data/microbatch.h, context_parallel_rows).
class ContextParallelAttention final : public AttentionCore {
 public:
  ContextParallelAttention(ops::Backend& backend, parallel::ProcessGroup& cp, CpComm comm, DType activation);

  // s: this rank's heads and groups (after tensor parallelism), s.batch sequences and s.seq = this
  // rank's tokens per sequence (two chunks). qkv [batch * seq, qkv_stride] rotated, in the rows'
  // chunk order; out [batch * seq, heads * head_dim]. Saves what the backward needs in c.lse (and,
  // a2a, c.seq_qkv, c.seq_out).
  // docs: packed documents (model/documents.h): each ring block's queries get their rows' document
  // starts and the key block's first position; the all-to-all's whole sequences get theirs.
  void forward(const Tensor& qkv, Tensor& out, AttentionSaves& c, const ops::AttentionShape& s,
               const DocumentRows* docs) override;
  // dqkv [batch * seq, qkv_stride] is overwritten with the gradients of this rank's q, k and v.
  void backward(const Tensor& qkv, const Tensor& out, const AttentionSaves& c, const Tensor& dout, Tensor& dqkv,
                const ops::AttentionShape& s, const DocumentRows* docs) override;

 private:
  void ring_forward(const Tensor& qkv, Tensor& out, AttentionSaves& c, const ops::AttentionShape& s,
                    const Tensor& doc_start);
  void ring_backward(const Tensor& qkv, const Tensor& out, const AttentionSaves& c, const Tensor& dout, Tensor& dqkv,
                     const ops::AttentionShape& s, const Tensor& doc_start);
  void a2a_forward(const Tensor& qkv, Tensor& out, AttentionSaves& c, const ops::AttentionShape& s,
                   const Tensor& seq_doc_start);
  void a2a_backward(const AttentionSaves& c, const Tensor& dout, Tensor& dqkv, const ops::AttentionShape& s,
                    const Tensor& seq_doc_start);
  // The block pair (query chunk j of this rank, key chunk `key_chunk`): bs with the queries'
  // document starts and the keys' first position, when documents are packed.
  ops::AttentionShape pair_shape(const ops::AttentionShape& bs, const Tensor& doc_start, int j, int key_chunk) const;
  // Global chunk index of this rank's chunk j, and of rank `r`'s.
  int chunk_of(int rank, int j) const { return int(cp_chunk_index(j, size_, rank)); }

  ops::Backend& be_;
  parallel::ProcessGroup& cp_;
  CpComm comm_;
  DType act_, stat_;
  int size_, rank_;
};

}  // namespace primus
