// Next-token choice from logits (HF's LogitsProcessors in their usual order: temperature, top-k, top-p, then
// a multinomial draw; greedy is argmax). The draw uses this sampler's own CPU generator, seeded by the
// caller: ranks that hold the same replicated logits and the same seed draw the same tokens with no
// communication beyond the gather that made the logits replicated.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace inference {

struct SamplingOptions {
  double temperature = 0.0;  // <= 0: greedy (argmax; top_k and top_p unused)
  int64_t top_k = 0;         // 0: off; else keep the k most likely tokens
  double top_p = 1.0;        // 1: off; else keep the smallest set whose probability reaches top_p
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0; }
  // Throws dtensor::Error naming the first bad field (top_k < 0, top_p outside (0, 1]).
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // logits [b, vocab] (plain, the same on every rank) -> tokens [b] (int64).
  at::Tensor sample(const at::Tensor& logits);
  // The filtered log-probabilities the draw uses ([b, vocab], -inf where filtered out); for tests.
  at::Tensor filtered_logits(const at::Tensor& logits) const;

 private:
  SamplingOptions options_;
  at::Generator generator_;
};

}  // namespace inference
