// All of a model's parameters in one contiguous buffer, and their gradients in another of the
// same layout. One buffer makes the optimizer a single loop, the gradient norm one reduction,
// data-parallel reduction a handful of bucketed collectives, and a checkpoint one write.
// Layers register their tensors first; allocate() then fixes the layout.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "optim/adamw.h"

namespace primus {

// Normal and ScaledNormal draw N(0, std) with the run's init_method_std (scaled: over the layers);
// the LoRA adapters' (model/options.h LoraInit) draw from the global shape's fans: XavierNormal
// std sqrt(2 / (fan_in + fan_out)), AdapterNormal N(0, 0.2), KaimingUniform U(-b, b) with
// b = 1 / sqrt(fan_in) (PyTorch's kaiming_uniform_ with a = sqrt 5); fan_in = shape[1].
enum class ParamInit : uint8_t { Normal, ScaledNormal, Ones, Zeros, XavierNormal, AdapterNormal, KaimingUniform };

// Where a rank's tensor sits in the model's global tensor. The local tensor is the concatenation,
// along `dim`, of `pieces` of the global one, in order: one piece for a plain tensor-parallel
// split, three for the fused QKV weight ([q; k; v] rows, each split by heads), two for the fused
// gate/up weight. Checkpoints store this so that any layout can load any other (resharding).
struct ShardPiece {
  int64_t global_start = 0;  // along dim, in the global tensor
  int64_t length = 0;
  bool operator==(const ShardPiece&) const = default;
};
struct ShardSpec {
  int dim = 0;
  std::vector<ShardPiece> pieces;  // empty: the whole tensor (not sharded)
};

struct StoredParam {
  std::string name;  // Megatron-style, e.g. "decoder.layers.0.self_attention.linear_qkv.weight"
  Shape shape;
  int64_t offset = 0;  // into the flat buffers, in elements
  int64_t numel = 0;
  bool weight_decay = true;  // false for norms and biases
  ParamInit init = ParamInit::Normal;
  Shape global_shape;  // the whole model's tensor; equals shape when not sharded
  ShardSpec shard;     // which part of it this rank holds
  // A tensor that every tensor-parallel rank holds whole (norm weights, unsharded biases): its
  // gradient norm is counted once, and with sequence parallelism its gradient is summed over tp.
  bool tp_replicated = true;
  // Held whole by every tp rank, but each rank's gradient covers only its own heads (the QK-norm
  // weights): summed over tp with or without sequence parallelism.
  bool tp_partial_grads = false;
  // Not trained by the optimizer: a state the model updates itself and checkpoints save with the
  // weights (the MoE expert bias; Megatron registers it as a buffer). Its gradient stays zero.
  bool buffer = false;
};

// The master copy of a model's parameters: fp32 for training (fp32 or bf16 mixed precision),
// fp64 for the finite-difference gradient tests.
class ParamStore {
 public:
  explicit ParamStore(DType dtype = DType::F32);
  int add(const std::string& name, const Shape& shape, ParamInit init, bool weight_decay);
  // A tensor-parallel shard: `global` is the whole tensor's shape, `shard` the part held here
  // (its pieces must add up to shape[shard.dim]).
  int add_sharded(const std::string& name, const Shape& global, const ShardSpec& shard, ParamInit init,
                  bool weight_decay);
  // See StoredParam::tp_partial_grads.
  void mark_tp_partial_grads(int id);
  void mark_buffer(int id);  // see StoredParam::buffer
  // Fixes the layout and allocates values and gradients (zeroed) on `device`.
  void allocate(Device device = Device::CPU);
  // Values only (a transient full copy of sharded weights, to fill or to save).
  void allocate_values(Device device = Device::CPU);

  DType dtype() const { return dtype_; }
  const std::vector<StoredParam>& infos() const { return infos_; }
  int64_t numel() const { return numel_; }
  int find(const std::string& name) const;  // -1 when absent

  // Typed pointers into host buffers (T must be the store's dtype).
  template <typename T> T* value(int id) const { return values_.data<T>() + infos_[id].offset; }
  template <typename T> T* grad(int id) const { return grads_.data<T>() + infos_[id].offset; }
  Tensor value_tensor(int id) const;  // shaped views, on the store's device
  Tensor grad_tensor(int id) const;
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  void zero_grad() { grads_.zero_(); }

  // Fills every parameter from (seed, name, global element index): the same weights for any
  // thread count, any tensor-parallel split (a shard draws the values of its global slice), any
  // device (a device store is filled on the host, then copied) and any dtype.
  void init(uint64_t seed, double std, double scaled_std);
  Device device() const { return values_.device(); }

 private:
  DType dtype_;
  std::vector<StoredParam> infos_;
  std::unordered_map<std::string, int> index_;  // name -> id: registration stays linear in the count
  int64_t numel_ = 0;
  Tensor values_, grads_;
};

// The optimizer's view of a store: one segment per tensor, with its weight-decay flag.
inline std::vector<ParamSegment> segments_of(const ParamStore& p) {
  std::vector<ParamSegment> out;
  for (const auto& i : p.infos()) out.push_back({i.name, i.offset, i.numel, i.weight_decay});
  return out;
}

}  // namespace primus
