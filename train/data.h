// Token data for training: a text file (each byte is a token, vocab 256), a nanoGPT-style .bin of
// uint16 token ids, or by default the English texts every Debian machine has in /usr/share/common-licenses.
// Batches are random windows drawn from the seed and the step alone, so every TP rank sees the same batch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace train {

struct Corpus {
  at::Tensor tokens;  // int64 [n]
  std::string source;
  int64_t max_token() const;
};

// path "" : the default corpus. A ".bin" suffix: uint16 little-endian ids. Anything else: bytes.
Corpus load_corpus(const std::string& path);

struct Batch {
  at::Tensor inputs;  // int64 [batch, seq_len]
  at::Tensor labels;  // int64 [batch, seq_len]: inputs shifted by one
};

// Step `step`'s batch: `batch` windows of seq_len + 1 tokens at offsets drawn from (seed, step).
Batch sample_batch(const Corpus& corpus, int64_t batch, int64_t seq_len, uint64_t seed, int64_t step);

}  // namespace train
