// FLOPs of the matmuls a rank runs, counted at the dispatcher (RecordFunction): the dry run's compute
// measure. Counted: mm, addmm, bmm, baddbmm (2·m·k·n per product) and the CPU flash attention kernels
// (forward 4·b·h·s_q·s_kv·d, halved when causal; backward twice that). Calls whose inputs are DTensors
// are skipped (the local call inside them is the one counted), and so is the dispatch's shape inference.
// Elementwise work is not counted: on the hardware this models, step time is matmuls and communication.
// Internal header.
#pragma once

#include <cstdint>

namespace dtensor::detail {

// While alive, counts the calling thread's matmul FLOPs (and the autograd engine's on its behalf).
class MatmulFlopCounter {
 public:
  MatmulFlopCounter();
  ~MatmulFlopCounter();
  MatmulFlopCounter(const MatmulFlopCounter&) = delete;
  MatmulFlopCounter& operator=(const MatmulFlopCounter&) = delete;
  double flops() const;

 private:
  uint64_t handle_;
  double* previous_;
  double flops_ = 0;
};

}  // namespace dtensor::detail
