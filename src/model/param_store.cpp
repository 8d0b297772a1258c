#include "model/param_store.h"


#include "core/rng.h"

namespace primus {

// FNV-1a: a name hash that is the same on every platform and standard library.
static uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

template <typename T>
int ParamStore<T>::add(const std::string& name, const Shape& shape, ParamInit init, bool weight_decay) {
  PRIMUS_CHECK(!values_.defined(), "parameter {} added after allocate()", name);
  PRIMUS_CHECK(find(name) < 0, "parameter {} registered twice", name);
  StoredParam info;
  info.name = name;
  info.shape = shape;
  info.numel = 1;
  for (int64_t d : shape) info.numel *= d;
  // Keep every tensor 64-byte aligned inside the flat buffer.
  const int64_t align = 64 / static_cast<int64_t>(sizeof(T));
  info.offset = (numel_ + align - 1) / align * align;
  info.weight_decay = weight_decay;
  info.init = init;
  info.global_shape = shape;
  numel_ = info.offset + info.numel;
  infos_.push_back(info);
  return static_cast<int>(infos_.size()) - 1;
}

template <typename T>
int ParamStore<T>::add_sharded(const std::string& name, const Shape& global, const ShardSpec& shard, ParamInit init,
                               bool weight_decay) {
  PRIMUS_CHECK(shard.dim >= 0 && size_t(shard.dim) < global.size(), "parameter {}: shard dim {} out of range", name,
               shard.dim);
  Shape local = global;
  local[shard.dim] = 0;
  for (const ShardPiece& pc : shard.pieces) {
    PRIMUS_CHECK(pc.global_start >= 0 && pc.length > 0 && pc.global_start + pc.length <= global[shard.dim],
                 "parameter {}: shard piece [{}, +{}) outside dim {} of size {}", name, pc.global_start, pc.length,
                 shard.dim, global[shard.dim]);
    local[shard.dim] += pc.length;
  }
  if (shard.pieces.empty()) local = global;
  const int id = add(name, local, init, weight_decay);
  infos_[id].global_shape = global;
  infos_[id].shard = shard;
  infos_[id].tp_replicated = shard.pieces.empty();
  return id;
}

template <typename T>
void ParamStore<T>::allocate(Device device) {
  values_ = Tensor::zeros({numel_}, dtype_of<T>::value, device);
  grads_ = Tensor::zeros({numel_}, dtype_of<T>::value, device);
}

template <typename T>
int ParamStore<T>::find(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return static_cast<int>(i);
  return -1;
}

template <typename T>
Tensor ParamStore<T>::value_tensor(int id) const {
  return values_.slice(0, infos_[id].offset, infos_[id].numel).view(infos_[id].shape);
}

template <typename T>
Tensor ParamStore<T>::grad_tensor(int id) const {
  return grads_.slice(0, infos_[id].offset, infos_[id].numel).view(infos_[id].shape);
}

template <typename T>
void ParamStore<T>::init(uint64_t seed, double std, double scaled_std) {
  Tensor host = values_.device() == Device::CPU ? values_ : Tensor::zeros({numel_}, dtype_of<T>::value);
  for (const auto& info : infos_) {
    T* v = host.data<T>() + info.offset;
    const Rng rng(seed ^ name_hash(info.name));
    switch (info.init) {
      case ParamInit::Ones:
        for (int64_t i = 0; i < info.numel; ++i) v[i] = T(1);
        break;
      case ParamInit::Zeros:
        for (int64_t i = 0; i < info.numel; ++i) v[i] = T(0);
        break;
      case ParamInit::Normal:
      case ParamInit::ScaledNormal: {
        const double s = info.init == ParamInit::Normal ? std : scaled_std;
        if (info.shard.pieces.empty()) {
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < info.numel; ++i) v[i] = T(s * rng.normal_at(static_cast<uint64_t>(i)));
          break;
        }
        // A shard draws the numbers of the global elements it holds: local (outer, j, inner) is
        // global (outer, start + j - local start of the piece, inner).
        const int d = info.shard.dim;
        int64_t inner = 1;
        for (size_t k = size_t(d) + 1; k < info.shape.size(); ++k) inner *= info.shape[k];
        const int64_t local_d = info.shape[d], global_d = info.global_shape[d];
        std::vector<int64_t> to_global(local_d);
        int64_t j = 0;
        for (const ShardPiece& pc : info.shard.pieces)
          for (int64_t g = 0; g < pc.length; ++g) to_global[j++] = pc.global_start + g;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < info.numel; ++i) {
          const int64_t in = i % inner, jj = (i / inner) % local_d, outer = i / (inner * local_d);
          const int64_t gi = (outer * global_d + to_global[jj]) * inner + in;
          v[i] = T(s * rng.normal_at(static_cast<uint64_t>(gi)));
        }
        break;
      }
    }
  }
  if (values_.device() != Device::CPU) values_.copy_from(host);
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace primus
