// The flags every tool that loads a model shares (--dtype, --device; generation's and serving's --ep), apart from cli.h
// so that the tools without a model (tprun, tokenize, the benches) do not include the models' headers.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "tools/common/cli.h"

namespace tools_cli {

// --dtype (llama_generate, serve, llama_train): models/common/dtype.h's names; another is a bad flag (exit 2).
// random_init: the tool can make a random model (no checkpoint), which auto makes float32.
inline CLI::Option* add_dtype(CLI::App& app, std::string& dtype, bool random_init = true) {
  return app.add_option("--dtype", dtype,
                        std::string("the dtype the model computes in: auto (the checkpoint's config.json dtype") +
                            (random_init ? "; float32 for a random init" : "") + "), bfloat16, float16 or float32")
      ->check(CLI::IsMember(models::dtype_names()));
}

// --quantize (llama_generate, serve): how the Linear weights are stored once loaded (llama/build.h's Quantization).
inline CLI::Option* add_quantize(CLI::App& app, std::string& quantize) {
  return app.add_option("--quantize", quantize,
                        "the Linear weights once loaded: none; int8 (torchao's int8 weight-only, one scale per row); "
                        "int4 or int4-G (torchao's int4 weight-only, groups of G = 32, 64, 128 (int4), 256 along "
                        "in_features); the activations in --dtype; lm_head included")
      ->check(CLI::IsMember({"none", "int8", "int4", "int4-32", "int4-64", "int4-128", "int4-256"}));
}

// --weights-prepack / --no-weights-prepack (llama_generate, serve): the bf16 Linear weights packed at load for the
// CPU's batched GEMM (dtensor/quant/weight_prepack.h), where its kernel runs (AVX-512 BF16 without AMX).
inline CLI::Option* add_weights_prepack(CLI::App& app, bool& prepack) {
  return app.add_flag("--weights-prepack,!--no-weights-prepack", prepack,
                      "pack the bf16 Linear weights once at load for the batched GEMM where its kernel runs (default; "
                      "IPEX's weights_prepack); --no-weights-prepack keeps them as loaded");
}

// --device (llama_generate, serve, llama_train): cpu, or cuda (cuda:LOCAL_RANK, as torchrun's one process per GPU).
inline CLI::Option* add_device(CLI::App& app, std::string& device) {
  return app.add_option("--device", device,
                        "where the model runs (cuda: cuda:LOCAL_RANK, NCCL between ranks, or DTENSOR_CUDA_BACKEND=gloo "
                        "when ranks share a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

// --ep (llama_generate, serve): a mixture of experts' experts split over the N ranks of the job, every rank with the same
// tokens (llama::TPPlan::ep); a training job's --ep is in parallelism_flags.h (it borrows data-parallel ranks there).
inline CLI::Option* add_inference_ep(CLI::App& app, int64_t& ep) {
  return app.add_option("--ep", ep,
                        "expert parallelism (a mixture of experts): the experts split over the N ranks (N = the world "
                        "size), dense layers whole; instead of TP")
      ->check(positive());
}

}  // namespace tools_cli
