// --dtype and --device for the tools that load a model (llama_generate, serve, llama_train), apart from cli.h so that the
// tools without a model (tprun, tokenize, the benches) do not include the models' headers.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/dtype.h"

namespace tools_cli {

// --dtype (llama_generate, serve, llama_train): models/common/dtype.h's names; another is a bad flag (exit 2).
// random_init: the tool can make a random model (no checkpoint), which auto makes float32.
inline CLI::Option* add_dtype(CLI::App& app, std::string& dtype, bool random_init = true) {
  return app.add_option("--dtype", dtype,
                        std::string("the dtype the model computes in: auto (the checkpoint's config.json dtype") +
                            (random_init ? "; float32 for a random init" : "") + "), bfloat16, float16 or float32")
      ->check(CLI::IsMember(models::dtype_names()));
}

// --device (llama_generate, serve, llama_train): cpu, or cuda (cuda:LOCAL_RANK, as torchrun's one process per GPU).
inline CLI::Option* add_device(CLI::App& app, std::string& device) {
  return app.add_option("--device", device,
                        "where the model runs (cuda: cuda:LOCAL_RANK, NCCL between ranks, or DTENSOR_CUDA_BACKEND=gloo "
                        "when ranks share a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

}  // namespace tools_cli
