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
  numel_ = info.offset + info.numel;
  infos_.push_back(info);
  return static_cast<int>(infos_.size()) - 1;
}

template <typename T>
void ParamStore<T>::allocate() {
  values_ = Tensor::zeros({numel_}, dtype_of<T>::value);
  grads_ = Tensor::zeros({numel_}, dtype_of<T>::value);
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
  for (const auto& info : infos_) {
    T* v = values_.data<T>() + info.offset;
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
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < info.numel; ++i) v[i] = T(s * rng.normal_at(static_cast<uint64_t>(i)));
        break;
      }
    }
  }
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace primus
