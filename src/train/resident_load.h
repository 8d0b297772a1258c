// A resume's destinations: where the checkpoint's elements go in the rank's own resident state
// (checkpoint::LoadTarget), so that a resume allocates nothing of the model's size. Host fp32
// buffers (the CPU) are read into in place; state the host cannot write directly (device memory)
// goes through a host copy of that buffer alone, copied in by commit(). The data-parallel
// strategies describe their buffers with it (DataParallelStrategy::load_targets).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/tensor.h"
#include "optim/flat_adamw.h"

namespace primus::train {

class ResidentLoad {
 public:
  // Host pointers to write elements [at, at + n) of a flat fp32 tensor / of an optimizer's moment.
  float* tensor(const Tensor& flat, int64_t at, int64_t n);
  float* moment(FlatAdamW& adam, bool second, int64_t at, int64_t n);
  // Elements [begin, begin + numel) of the store's flat layout go to data (values, exp_avg,
  // exp_avg_sq; nullptr: not read); replicas: the ranks that hold the range identically.
  void add(int64_t begin, int64_t numel, std::array<float*, 3> data, parallel::ProcessGroup* replicas = nullptr);
  const std::vector<checkpoint::LoadTarget>& targets() const { return targets_; }
  // After the load: the host copies into their buffers, and every optimizer met here given the
  // step count.
  void commit(int64_t step);
  // Host memory of the copies (0 where every buffer was written in place).
  uint64_t staging_bytes() const;

 private:
  struct TensorCopy {
    Tensor flat;
    Tensor host;  // the whole tensor, on the CPU
  };
  struct AdamCopy {
    std::vector<float> m, v;  // empty: written in place
  };
  std::vector<checkpoint::LoadTarget> targets_;
  std::map<const void*, TensorCopy> tensors_;  // by the buffer's address
  std::map<FlatAdamW*, AdamCopy> adams_;
};

}  // namespace primus::train
