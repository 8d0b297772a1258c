// The attention core of a block's attention part: softmax(q k^T) v over the fused qkv rows of
// kernels/cpu/attention.h, for this rank's heads. Which core runs is a property of the layout:
//
//   LocalAttention            the backend's attention kernels over this rank's whole sequences
//   ContextParallelAttention  (model/context_parallel.h) each rank holds two chunks of every
//                             sequence; a ring (p2p) or an all-to-all over heads (a2a)
//
// A core owns what its backward reads (AttentionSaves), so the attention parts that call it (GQA,
// MLA: model/attention_parts.h) never know which one runs.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/backend.h"
#include "model/documents.h"
#include "model/model_spec.h"
#include "model/options.h"
#include "parallel/process_group.h"

namespace primus {

// What a core keeps from its forward for its backward: the log-sum-exps, and for a2a the whole
// sequence's qkv and output of this rank's heads.
struct AttentionSaves {
  Tensor lse, seq_qkv, seq_out;
};

class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // qkv [rows, qkv_stride] rotated; out [rows, heads * head_dim] (allocated by the caller);
  // s: this rank's heads and groups, s.batch sequences of s.seq of this rank's tokens. docs: the
  // microbatch's packed documents (model/documents.h), attention kept inside each; null: none.
  virtual void forward(const Tensor& qkv, Tensor& out, AttentionSaves& saves, const ops::AttentionShape& s,
                       const DocumentRows* docs) = 0;
  // dqkv [rows, qkv_stride] is overwritten with the gradients of q, k and v.
  virtual void backward(const Tensor& qkv, const Tensor& out, const AttentionSaves& saves, const Tensor& dout,
                        Tensor& dqkv, const ops::AttentionShape& s, const DocumentRows* docs) = 0;
};

class LocalAttention final : public AttentionCore {
 public:
  LocalAttention(ops::Backend& backend, DType activation) : be_(backend), stat_(ops::stat_dtype(activation)) {}
  void forward(const Tensor& qkv, Tensor& out, AttentionSaves& saves, const ops::AttentionShape& s,
               const DocumentRows* docs) override;
  void backward(const Tensor& qkv, const Tensor& out, const AttentionSaves& saves, const Tensor& dout, Tensor& dqkv,
                const ops::AttentionShape& s, const DocumentRows* docs) override;

 private:
  ops::Backend& be_;
  DType stat_;
};

// The core for a layout: local with one cp rank, else the context-parallel one over cp_group.
std::unique_ptr<AttentionCore> make_attention_core(ops::Backend& backend, DType activation, int cp_size,
                                                   parallel::ProcessGroup* cp_group, CpComm comm);

// cp_comm_type a2a gives each cp rank heads / cp of every tensor-parallel rank's heads and query
// groups (MLA packs one group per head): throws naming the sizes when they do not divide. The
// layout planner and the model both call it.
void check_all_to_all_heads(const ModelSpec& spec, int tp_size, int cp_size);

}  // namespace primus
