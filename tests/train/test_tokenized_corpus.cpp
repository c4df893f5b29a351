// llama_train's text data through a Hugging Face tokenizer (train/tokenized_corpus.h): tokenized once into the
// cache, read back from it, and decoding the ids gives the text back (a byte-level tokenizer loses nothing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness/subprocess.h"
#include "tokenizer/tokenizer.h"
#include "train/tokenized_corpus.h"
#include "harness/temp_dir.h"

namespace fs = std::filesystem;

TEST(TokenizedCorpus, TokenizesOnceCachesAndRoundTrips) {
  const std::string root = dtensor::testing::temp_dir("tokcorpus");
  const auto made = dtensor::testing::run_process(
      {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/hf_tokenizer_oracle.py", "make", root, "--kinds", "gpt2"},
      {{"OMP_NUM_THREADS", "1"}, {"RAYON_NUM_THREADS", "1"}, {"TOKENIZERS_PARALLELISM", "false"}}, 300);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ::setenv("DTENSOR_CACHE_DIR", (root + "/cache").c_str(), 1);
  const std::string data = DTENSOR_SOURCE_DIR "/README.md", tok_dir = root + "/gpt2";
  const std::string cache = train::tokenized_cache_path(data, tok_dir);
  EXPECT_FALSE(fs::exists(cache));

  const train::Corpus first = train::load_tokenized_corpus(data, tok_dir, /*progress=*/false);
  EXPECT_TRUE(fs::exists(cache));
  std::ifstream in(data, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const auto tok = tokenizer::Tokenizer::from_pretrained(tok_dir);
  const auto* p = first.tokens.data_ptr<int64_t>();
  EXPECT_EQ(tok.decode(std::vector<int64_t>(p, p + first.tokens.numel())), text);
  EXPECT_LT(first.tokens.numel(), static_cast<int64_t>(text.size()) * 2 / 3);  // real merges, not bytes

  const train::Corpus again = train::load_tokenized_corpus(data, tok_dir, false);
  EXPECT_NE(again.source.find("cached"), std::string::npos) << again.source;
  EXPECT_TRUE(at::equal(again.tokens, first.tokens));
  ::unsetenv("DTENSOR_CACHE_DIR");
}
