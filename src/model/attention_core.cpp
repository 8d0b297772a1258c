#include "model/attention_core.h"

#include "model/context_parallel.h"

namespace primus {

void LocalAttention::forward(const Tensor& qkv, Tensor& out, AttentionSaves& saves, const ops::AttentionShape& s,
                             const DocumentRows* docs) {
  saves.lse = be_.empty({s.batch, s.heads, s.seq}, stat_);
  be_.attention_forward(qkv, out, saves.lse, with_documents(s, docs ? docs->doc_start : Tensor()));
}

void LocalAttention::backward(const Tensor& qkv, const Tensor& out, const AttentionSaves& saves, const Tensor& dout,
                              Tensor& dqkv, const ops::AttentionShape& s, const DocumentRows* docs) {
  be_.attention_backward(qkv, out, saves.lse, dout, dqkv, with_documents(s, docs ? docs->doc_start : Tensor()));
}

std::unique_ptr<AttentionCore> make_attention_core(ops::Backend& backend, DType activation, int cp_size,
                                                   parallel::ProcessGroup* cp_group, CpComm comm) {
  if (cp_size == 1) return std::make_unique<LocalAttention>(backend, activation);
  if (!cp_group || cp_group->size() != cp_size)
    fail("context parallel size {} needs a cp group of that size", cp_size);
  if (cp_group->device() != backend.device())
    fail("the context-parallel group {} moves {} buffers but the model computes on the {}", cp_group->describe(),
         device_name(cp_group->device()), device_name(backend.device()));
  return std::make_unique<ContextParallelAttention>(backend, *cp_group, comm, activation);
}

void check_all_to_all_heads(const ModelSpec& spec, int tp, int cp) {
  // MLA packs one group per head.
  const int64_t heads = spec.num_attention_heads / tp,
                groups = (spec.multi_latent_attention ? spec.num_attention_heads : spec.query_groups()) / tp;
  if (heads % cp != 0 || groups % cp != 0)
    fail("cp_comm_type a2a splits the attention heads over context_parallel_size {}: {} heads and {} query groups "
         "per tensor-parallel rank (num_attention_heads {}, num_query_groups {}, tensor_model_parallel_size {}) are "
         "not divisible by {}; use cp_comm_type p2p",
         cp, heads, groups, spec.num_attention_heads, spec.query_groups(), tp, cp);
}

}  // namespace primus
