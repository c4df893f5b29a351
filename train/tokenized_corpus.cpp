#include "train/tokenized_corpus.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "dtensor/core/error.h"

namespace fs = std::filesystem;

namespace train {
namespace {

constexpr char kMagic[8] = {'D', 'T', 'T', 'O', 'K', 'v', '1', '\0'};
constexpr size_t kChunk = 1 << 16;  // bytes of text per encode call (then to the next line break)

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  DTENSOR_CHECK(in, "dtensor: llama_train: cannot read '", path.string(), "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

uint64_t fnv1a(const std::string& bytes, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ULL;
  return h;
}

fs::path cache_dir() {
  if (const char* d = std::getenv("DTENSOR_CACHE_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return fs::path(home && *home ? home : "/tmp") / ".cache" / "dtensor" / "tokens";
}

}  // namespace

std::string tokenized_cache_path(const std::string& path, const std::string& tokenizer_dir) {
  uint64_t h = fnv1a(read_file(fs::path(tokenizer_dir) / "tokenizer.json"));
  for (const auto& f : corpus_files(path)) {
    h = fnv1a(fs::absolute(f).string(), h);
    h = fnv1a(std::to_string(fs::file_size(f)) + ":" +
                  std::to_string(fs::last_write_time(f).time_since_epoch().count()), h);
  }
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.ids", static_cast<unsigned long long>(h));
  return (cache_dir() / name).string();
}

Corpus load_tokenized_corpus(const std::string& path, const std::string& tokenizer_dir, bool progress) {
  const std::string cache = tokenized_cache_path(path, tokenizer_dir);
  const std::string source = (path.empty() ? std::string("/usr/share/common-licenses") : path) + " (tokenized by " +
                             tokenizer_dir + ")";
  if (fs::exists(cache)) {
    const std::string bytes = read_file(cache);
    if (bytes.size() >= 16 && bytes.compare(0, 8, kMagic, 8) == 0 && (bytes.size() - 16) % 4 == 0) {
      std::vector<int64_t> ids((bytes.size() - 16) / 4);
      for (size_t i = 0; i < ids.size(); ++i) {
        uint32_t v = 0;
        std::memcpy(&v, bytes.data() + 16 + 4 * i, 4);
        ids[i] = v;
      }
      return {at::tensor(ids, at::kLong), source + ", cached " + cache};
    }
  }
  const auto tok = tokenizer::Tokenizer::from_pretrained(tokenizer_dir);
  const std::string text = corpus_text(path);
  std::vector<int64_t> ids;
  const auto start = std::chrono::steady_clock::now();
  // On a terminal a bar redrawn in place; into a file or a pipe (a log) a line per tenth, no carriage returns.
  const bool terminal = ::isatty(2) != 0;
  int last_tenth = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = std::min(text.size(), at + kChunk);
    if (end < text.size()) {
      const size_t nl = text.find('\n', end);
      end = nl == std::string::npos ? text.size() : nl + 1;
    }
    const auto chunk = tok.encode(text.substr(at, end - at), /*add_special_tokens=*/false);
    ids.insert(ids.end(), chunk.begin(), chunk.end());
    at = end;
    if (progress && !terminal) {
      const int tenth = static_cast<int>(10 * at / text.size());
      if (tenth > last_tenth) {
        last_tenth = tenth;
        std::fprintf(stderr, "tokenizing %s: %3d%% %.1f/%.1f MB\n", path.empty() ? "the default corpus" : path.c_str(),
                     tenth * 10, static_cast<double>(at) / 1e6, static_cast<double>(text.size()) / 1e6);
      }
    } else if (progress) {
      const int width = 30, done = static_cast<int>(width * at / text.size());
      std::fprintf(stderr, "\rtokenizing %s [%s%s] %3d%% %.1f/%.1f MB", path.empty() ? "the default corpus" : path.c_str(),
                   std::string(static_cast<size_t>(done), '#').c_str(), std::string(static_cast<size_t>(width - done), '.').c_str(),
                   static_cast<int>(100 * at / text.size()), static_cast<double>(at) / 1e6, static_cast<double>(text.size()) / 1e6);
    }
  }
  if (progress) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%stokenized %zu tokens in %.2f s -> %s\n", terminal ? "\n" : "", ids.size(), s, cache.c_str());
  }
  // Written whole, then renamed: a concurrent or interrupted writer never leaves a partial cache.
  fs::create_directories(fs::path(cache).parent_path());
  const std::string tmp = cache + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    const uint64_t n = ids.size();
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&n), 8);
    for (int64_t id : ids) {
      const auto v = static_cast<uint32_t>(id);
      out.write(reinterpret_cast<const char*>(&v), 4);
    }
    DTENSOR_CHECK(out.good(), "dtensor: llama_train: cannot write the token cache '", tmp, "'");
  }
  fs::rename(tmp, cache);
  return {at::tensor(ids, at::kLong), source};
}

}  // namespace train
