#include "train/data.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/cp/context_parallel.h"

namespace train {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  DTENSOR_CHECK(in, "dtensor: llama_train: cannot read '", path.string(), "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

at::Tensor bytes_to_tokens(const std::string& bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(t.data_ptr<uint8_t>()));
  return t.to(at::kLong);
}

}  // namespace

int64_t Corpus::max_token() const { return tokens.max().item<int64_t>(); }

std::vector<std::string> corpus_files(const std::string& path) {
  if (!path.empty()) return {path};
  const std::filesystem::path dir = "/usr/share/common-licenses";
  std::vector<std::string> files;
  if (std::filesystem::is_directory(dir)) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path().string());  // GPL -> GPL-3: once
    }
  }
  DTENSOR_CHECK(!files.empty(), "dtensor: llama_train: the default corpus ", dir.string(),
                " is missing; pass --data FILE");
  std::sort(files.begin(), files.end());
  return files;
}

std::string corpus_text(const std::string& path) {
  if (!path.empty()) return read_file(path);
  std::string text;
  for (const auto& f : corpus_files(path)) text += read_file(f) + "\n";
  return text;
}

Corpus load_corpus(const std::string& path) {
  if (path.empty()) {
    return {bytes_to_tokens(corpus_text(path)),
            "/usr/share/common-licenses (" + std::to_string(corpus_files(path).size()) + " files)"};
  }
  std::string bytes = read_file(path);
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0) {
    DTENSOR_CHECK(bytes.size() % 2 == 0, "dtensor: llama_train: '", path, "' has an odd byte count for uint16 ids");
    std::vector<int64_t> ids(bytes.size() / 2);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<uint8_t>(bytes[2 * i]) | (static_cast<int64_t>(static_cast<uint8_t>(bytes[2 * i + 1])) << 8);
    }
    return {at::tensor(ids, at::kLong), path + " (uint16 ids)"};
  }
  return {bytes_to_tokens(bytes), path};
}

Batch sample_batch(const Corpus& corpus, int64_t batch, int64_t seq_len, uint64_t seed, int64_t step) {
  const int64_t n = corpus.tokens.numel();
  DTENSOR_CHECK(n >= seq_len + 2, "dtensor: llama_train: corpus ", corpus.source, " has ", n,
                " tokens, fewer than seq_len + 2 = ", seq_len + 2);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(step) + 1);
  at::Tensor starts = at::randint(n - seq_len - 1, {batch, 1}, gen, at::kLong);
  at::Tensor index = starts + at::arange(seq_len + 1, at::kLong);  // [batch, seq_len + 1]
  at::Tensor windows = corpus.tokens.index_select(0, index.flatten()).view({batch, seq_len + 1});
  return {windows.narrow(1, 0, seq_len).contiguous(), windows.narrow(1, 1, seq_len).contiguous(), at::Tensor()};
}

std::vector<Batch> eval_batches(const Corpus& corpus, int64_t batch, int64_t seq_len, int64_t max_batches) {
  const int64_t n = corpus.tokens.numel();
  const int64_t windows = n > seq_len ? (n - 1) / seq_len : 0;
  int64_t count = windows / batch;
  DTENSOR_CHECK(count > 0, "dtensor: llama_train: --eval-data ", corpus.source, " has ", n, " tokens: fewer than one batch of ",
                batch, " windows of seq_len + 1 = ", seq_len + 1, " tokens (", batch * seq_len + 1, " tokens)");
  if (max_batches > 0) count = std::min(count, max_batches);
  std::vector<Batch> out;
  for (int64_t k = 0; k < count; ++k) {
    const at::Tensor starts = (at::arange(batch, at::kLong) + k * batch).mul_(seq_len).unsqueeze(1);  // [batch, 1]
    const at::Tensor index = starts + at::arange(seq_len + 1, at::kLong);
    const at::Tensor w = corpus.tokens.index_select(0, index.flatten()).view({batch, seq_len + 1});
    out.push_back({w.narrow(1, 0, seq_len).contiguous(), w.narrow(1, 1, seq_len).contiguous(), at::Tensor()});
  }
  return out;
}

Batch local_batch(Batch b, const models::ParallelDims& dims) {
  const int64_t rows = b.inputs.size(0);
  DTENSOR_CHECK(rows % dims.dp == 0, "dtensor: llama_train: batch ", rows, " is not divisible by dp ", dims.dp);
  if (dims.dp > 1) {
    const int64_t mine = rows / dims.dp;
    b.inputs = b.inputs.narrow(0, dims.data_rank() * mine, mine);
    b.labels = b.labels.narrow(0, dims.data_rank() * mine, mine);
  }
  if (dims.cp_enabled()) {
    const dtensor::DeviceMesh cp_mesh = dims.cp_mesh();
    const int64_t seq_len = b.inputs.size(1);
    b.inputs = dtensor::cp::context_parallel_shard(b.inputs, 1, cp_mesh);
    b.labels = dtensor::cp::context_parallel_shard(b.labels, 1, cp_mesh);
    b.positions = dtensor::cp::context_parallel_positions(seq_len, cp_mesh).cpu();
  }
  return b;
}

}  // namespace train
