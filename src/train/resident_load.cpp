#include "train/resident_load.h"

#include "core/error.h"

namespace primus::train {

float* ResidentLoad::tensor(const Tensor& flat, int64_t at, int64_t n) {
  PRIMUS_CHECK(flat.dtype() == DType::F32 && at >= 0 && n >= 0 && at + n <= flat.numel(),
               "ResidentLoad::tensor outside its tensor");
  if (flat.device() == Device::CPU) return flat.data<float>() + at;
  TensorCopy& c = tensors_[flat.raw()];
  if (!c.host.defined()) c = {flat, flat.to(Device::CPU)};  // what is not read keeps its value
  return c.host.data<float>() + at;
}

float* ResidentLoad::moment(FlatAdamW& adam, bool second, int64_t at, int64_t n) {
  PRIMUS_CHECK(at >= 0 && n >= 0 && at + n <= adam.numel(), "ResidentLoad::moment outside its optimizer");
  AdamCopy& c = adams_[&adam];
  if (float* own = adam.host_moment(second)) return own + at;
  if (c.m.empty()) {  // a host copy of both moments, as they are
    c.m = adam.exp_avg();
    c.v = adam.exp_avg_sq();
  }
  return (second ? c.v : c.m).data() + at;
}

void ResidentLoad::add(int64_t begin, int64_t numel, std::array<float*, 3> data, parallel::ProcessGroup* replicas) {
  if (numel <= 0) return;
  checkpoint::LoadTarget t;
  t.begin = begin;
  t.numel = numel;
  for (int s = 0; s < 3; ++s) t.data[s] = data[size_t(s)];
  t.replicas = replicas;
  targets_.push_back(t);
}

void ResidentLoad::commit(int64_t step) {
  for (auto& [raw, c] : tensors_) {
    Tensor flat = c.flat;  // a handle on the buffer
    flat.copy_from(c.host);
  }
  for (auto& [adam, c] : adams_)
    adam->set_state(step, c.m.empty() ? nullptr : c.m.data(), c.v.empty() ? nullptr : c.v.data());
}

uint64_t ResidentLoad::staging_bytes() const {
  uint64_t bytes = 0;
  for (const auto& [raw, c] : tensors_) bytes += uint64_t(c.host.nbytes());
  for (const auto& [adam, c] : adams_) bytes += (c.m.size() + c.v.size()) * sizeof(float);
  return bytes;
}

}  // namespace primus::train
