#include "model/param_store.h"

#include <cmath>

#include "core/rng.h"

namespace primus {

// FNV-1a: a name hash that is the same on every platform and standard library.
static uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

ParamStore::ParamStore(DType dtype) : dtype_(dtype) {
  PRIMUS_CHECK(dtype == DType::F32 || dtype == DType::F64, "a parameter store holds fp32 or fp64, not {}",
               dtype_name(dtype));
}

int ParamStore::add(const std::string& name, const Shape& shape, ParamInit init, bool weight_decay) {
  PRIMUS_CHECK(!values_.defined(), "parameter {} added after allocate()", name);
  const int id = static_cast<int>(infos_.size());
  PRIMUS_CHECK(index_.emplace(name, id).second, "parameter {} registered twice", name);
  StoredParam info;
  info.name = name;
  info.shape = shape;
  info.numel = 1;
  for (int64_t d : shape) info.numel *= d;
  // Keep every tensor 64-byte aligned inside the flat buffer.
  const int64_t align = 64 / static_cast<int64_t>(dtype_size(dtype_));
  info.offset = (numel_ + align - 1) / align * align;
  info.weight_decay = weight_decay;
  info.init = init;
  info.global_shape = shape;
  numel_ = info.offset + info.numel;
  infos_.push_back(info);
  return id;
}

int ParamStore::add_sharded(const std::string& name, const Shape& global, const ShardSpec& shard, ParamInit init,
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

void ParamStore::allocate(Device device) {
  values_ = Tensor::zeros({numel_}, dtype_, device);
  grads_ = Tensor::zeros({numel_}, dtype_, device);
}

void ParamStore::allocate_values(Device device) { values_ = Tensor::zeros({numel_}, dtype_, device); }

int ParamStore::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

Tensor ParamStore::value_tensor(int id) const {
  return values_.slice(0, infos_[id].offset, infos_[id].numel).view(infos_[id].shape);
}

Tensor ParamStore::grad_tensor(int id) const {
  return grads_.slice(0, infos_[id].offset, infos_[id].numel).view(infos_[id].shape);
}

namespace {
template <typename T>
void init_values(const std::vector<StoredParam>& infos, T* values, uint64_t seed, double std, double scaled_std) {
  for (const auto& info : infos) {
    T* v = values + info.offset;
    const Rng rng(seed ^ name_hash(info.name));
    switch (info.init) {
      case ParamInit::Ones:
        for (int64_t i = 0; i < info.numel; ++i) v[i] = T(1);
        break;
      case ParamInit::Zeros:
        for (int64_t i = 0; i < info.numel; ++i) v[i] = T(0);
        break;
      case ParamInit::Normal:
      case ParamInit::ScaledNormal:
      case ParamInit::XavierNormal:
      case ParamInit::AdapterNormal:
      case ParamInit::KaimingUniform: {
        const double fan_out = double(info.global_shape[0]),
                     fan_in = info.global_shape.size() > 1 ? double(info.global_shape[1]) : 1.0;
        const bool uniform = info.init == ParamInit::KaimingUniform;
        const double s = info.init == ParamInit::Normal           ? std
                         : info.init == ParamInit::ScaledNormal   ? scaled_std
                         : info.init == ParamInit::XavierNormal   ? std::sqrt(2.0 / (fan_in + fan_out))
                         : info.init == ParamInit::AdapterNormal  ? 0.2
                                                                  : 1.0 / std::sqrt(fan_in);
        // normal: N(0, s); uniform: U(-s, s), both drawn at the global element's index
        auto draw = [&rng, s, uniform](uint64_t i) {
          return uniform ? s * (2.0 * double(rng.at(i) >> 11) * 0x1.0p-53 - 1.0) : s * rng.normal_at(i);
        };
        if (info.shard.pieces.empty()) {
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < info.numel; ++i) v[i] = T(draw(static_cast<uint64_t>(i)));
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
          v[i] = T(draw(static_cast<uint64_t>(gi)));
        }
        break;
      }
    }
  }
}
}  // namespace

void ParamStore::init(uint64_t seed, double std, double scaled_std) {
  Tensor host = values_.device() == Device::CPU ? values_ : Tensor::zeros({numel_}, dtype_);
  if (dtype_ == DType::F64)
    init_values(infos_, host.data<double>(), seed, std, scaled_std);
  else
    init_values(infos_, host.data<float>(), seed, std, scaled_std);
  if (values_.device() != Device::CPU) values_.copy_from(host);
}

void ParamStore::mark_tp_partial_grads(int id) {
  PRIMUS_CHECK(id >= 0 && size_t(id) < infos_.size(), "no parameter {}", id);
  infos_[size_t(id)].tp_partial_grads = true;
}

void ParamStore::mark_buffer(int id) {
  PRIMUS_CHECK(id >= 0 && size_t(id) < infos_.size(), "no parameter {}", id);
  infos_[size_t(id)].buffer = true;
}

}  // namespace primus
