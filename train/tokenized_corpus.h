// Text files through a Hugging Face tokenizer, once: `llama_train --data FILE` with a tokenizer (--tokenizer DIR,
// or --hf-dir's tokenizer.json) tokenizes FILE into a cached binary of uint32 ids and reads that on every later
// run. The cache key is the file (path, size, modification time) and the tokenizer (tokenizer.json's bytes), so a
// changed file or tokenizer tokenizes again. Rank 0 shows a progress bar on stderr.
//
// The text is encoded in chunks that end at line breaks (without special tokens), so a bar can move and memory
// stays flat; the ids are those of encoding each chunk alone.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"
#include "train/data.h"

namespace train {

// path "": the default corpus's files. The cache lives in $DTENSOR_CACHE_DIR, else ~/.cache/dtensor/tokens.
Corpus load_tokenized_corpus(const std::string& path, const std::string& tokenizer_dir, bool progress);

// Where load_tokenized_corpus keeps (or would keep) the ids of `path` under `tokenizer_dir`.
std::string tokenized_cache_path(const std::string& path, const std::string& tokenizer_dir);

}  // namespace train
