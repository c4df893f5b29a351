// Token data for training: a text file (each byte is a token, vocab 256), a nanoGPT-style .bin of
// uint16 token ids, or by default the English texts every Debian machine has in /usr/share/common-licenses.
// Batches are random windows drawn from the seed and the step alone, so every TP rank sees the same batch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/parallel_dims.h"

namespace train {

struct Corpus {
  at::Tensor tokens;  // int64 [n]
  std::string source;
  int64_t max_token() const;
};

// path "" : the default corpus. A ".bin" suffix: uint16 little-endian ids. Anything else: bytes.
Corpus load_corpus(const std::string& path);

// The text files a text --data path stands for: the file itself, or ("") the default corpus's files, sorted.
// Throws dtensor::Error when the default corpus is missing.
std::vector<std::string> corpus_files(const std::string& path);
// Their text as load_corpus reads it: the file as it is, or the default corpus's files each followed by "\n".
std::string corpus_text(const std::string& path);

struct Batch {
  at::Tensor inputs;  // int64 [batch, seq_len]
  at::Tensor labels;  // int64 [batch, seq_len]: inputs shifted by one
  at::Tensor positions;  // int64 [seq_len]: the tokens' positions (context parallel: its shard's); undefined: 0..
};

// Step `step`'s batch: `batch` windows of seq_len + 1 tokens at offsets drawn from (seed, step).
Batch sample_batch(const Corpus& corpus, int64_t batch, int64_t seq_len, uint64_t seed, int64_t step);

// A held-out split for evaluation: the corpus cut into consecutive windows of seq_len + 1 tokens, window w starting
// at token w * seq_len (each token but the first is predicted once), grouped in order into batches of `batch`
// windows; only whole batches, the first `max_batches` of them (0: all). Throws dtensor::Error naming the corpus when
// it holds no whole batch.
std::vector<Batch> eval_batches(const Corpus& corpus, int64_t batch, int64_t seq_len, int64_t max_batches = 0);

// This rank's part of a global batch (the same on every rank), for training and its dry run alike: its data rank's rows
// [data_rank * B / dp, + B / dp) of the B rows, and under context parallelism its cp rank's chunks of each row
// (load-balanced, dtensor/cp/context_parallel.h) with their positions (on the CPU). dp must divide B.
Batch local_batch(Batch global, const models::ParallelDims& dims);

}  // namespace train
