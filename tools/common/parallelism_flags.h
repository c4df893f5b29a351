// The flags of a training job's parallelism and precision, declared once over train::TrainOptions for every tool
// that takes a job (llama_train runs it; llama_plan dry-runs and searches it): torchtitan's `parallelism` section
// (--tp, --dp, --ep, --cp, FSDP's options), its TP knobs (--plan, SP, loss parallel, async TP), mixed precision and
// float8, activation checkpointing (the dry run measures its memory), and the step's shape (--seq-len, --batch). Same
// names, defaults and checks in both tools.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "tools/common/cli.h"
#include "tools/common/dtype_option.h"
#include "train/options.h"

namespace tools_cli {

// What parsing saw beyond the fields: --dp given (--ep sets dp to ep when it was not).
struct ParallelismSeen {
  bool dp = false;
};

inline void add_parallelism_flags(CLI::App& app, train::TrainOptions& o, ParallelismSeen& seen) {
  app.add_option("--tp", o.tp, "TP degree")
      ->check(positive())->default_str(o.tp > 0 ? std::to_string(o.tp) : "the world size / (dp x cp)");
  app.add_option_function<int64_t>("--dp", [&](const int64_t& v) { o.dp = v, seen.dp = true; },
                                   "data-parallel degree on a (dp, tp) mesh, world = dp * tp; each dp rank trains on "
                                   "its batch / dp sequences of the global batch")
      ->check(positive())->default_str("1");
  app.add_option("--ep", o.ep,
                 "expert parallelism (a mixture of experts): the experts split over N of the dp ranks, tokens sent to "
                 "them by all_to_all (--dp defaults to N; DDP only)")
      ->check(positive());
  app.add_option("--cp", o.cp,
                 "context parallelism: each sequence split over N ranks (load-balanced chunks), attention as ring "
                 "attention; world = dp x cp x tp, and DDP / FSDP reduce over dp x cp")
      ->check(positive());
  app.add_option("--cp-rotate-method", o.cp_rotate_method,
                 "how ring attention's keys and values travel: allgather (one all-gather) or alltoall (a ring of "
                 "rotations, each overlapped with a block)")
      ->check(CLI::IsMember({"allgather", "alltoall"}));
  app.add_option("--pp", o.pp,
                 "pipeline parallelism: the layers cut into N stages on N groups of ranks (outermost: world = pp x dp x "
                 "cp x tp), activations and gradients sent between them by the schedule")
      ->check(positive());
  app.add_option("--pp-schedule", o.pp_schedule,
                 "the pipeline's order of forwards and backwards (torch.distributed.pipelining's): GPipe, 1F1B, or ZBH1 "
                 "(1F1B with the backward split in input and weight gradients, zero bubble's H1)")
      ->check(CLI::IsMember({"GPipe", "1F1B", "Interleaved1F1B", "ZBH1"}));
  app.add_option("--pp-microbatches", o.pp_microbatches,
                 "pipeline microbatches per step (each dp rank's rows cut into N); default: pp")
      ->check(positive());
  app.add_option("--pp-split-points", o.pp_split_points,
                 "the first layer of every stage but the first, e.g. 2,4 (default: torchtitan's even split)");
  app.add_flag_callback("--ddp", [&] { o.data_parallel = models::DataParallel::ddp; },
                        "the data-parallel kind: replicate (DDP, default)");
  app.add_flag_callback("--fsdp", [&] { o.data_parallel = models::DataParallel::fsdp; },
                        "the data-parallel kind: fully_shard (FSDP2)");
  app.add_flag("--reshard-after-forward,!--no-reshard-after-forward", o.reshard_after_forward,
               "fsdp: free each block's gathered parameters after its forward (default on)");
  app.add_flag("--fsdp-prefetch,!--no-fsdp-prefetch", o.fsdp_prefetch,
               "fsdp: the next block's all-gather runs while this one computes (default on)");
  add_dtype(app, o.dtype);
  app.add_option_function<std::string>(
         "--mixed-precision", [&](const std::string& v) { o.mixed_precision = train::mixed_precision_from_string(v); },
         "compute in bf16 with float32 master weights, optimizer state and gradient reductions, as torchtitan "
         "(default); off: compute in --dtype; fp16 is refused (it needs loss scaling)")
      ->check(CLI::IsMember({"bf16", "fp16", "off"}))->default_str(train::to_string(o.mixed_precision));
  CLI::Option* float8 = app.add_flag("--float8", o.float8,
               "the decoder's Linear layers (not lm_head) compute through float8 matmuls with dynamic scales "
               "(torchao's Float8Linear; dims divisible by 16)");
  app.add_option_function<std::string>(
         "--float8-recipe", [&](const std::string& v) { o.float8_recipe = dtensor::float8_recipe_from_string(v); },
         "with --float8: tensorwise (one scale per tensor, e5m2 gradients; default) or rowwise (a scale per row)")
      ->check(CLI::IsMember({"tensorwise", "rowwise"}))->default_str("tensorwise")->needs(float8);
  app.add_option_function<std::string>(
         "--float8-matmul", [&](const std::string& v) { o.float8_matmul = dtensor::float8_matmul_from_string(v); },
         "with --float8: how its matmuls run: auto (the fastest here, timed at start and named in the first line; "
         "default), scaled_mm (at::_scaled_mm), emulated (torchao's emulate: fp32 GEMM of the float8 values), "
         "emulated_bf16 (the same in a bf16 GEMM)")
      ->check(CLI::IsMember({"auto", "scaled_mm", "emulated", "emulated_bf16"}))->default_str("auto")->needs(float8);
  app.add_option_function<std::string>(
         "--activation-checkpoint", [&o](const std::string& v) { o.ac.mode = llama::ac_mode_from_string(v); },
         "activation checkpointing (torchtitan's): none; full: every block keeps only its input and recomputes its "
         "forward in backward; selective: every Nth block (--selective-ac-option N)")
      ->check(CLI::IsMember({"none", "full", "selective"}))->default_str("none");
  app.add_option_function<std::string>(
         "--selective-ac-option",
         [&o](const std::string& v) {
           if (v == "op") {
             throw UsageError("--selective-ac-option op: op-level selective checkpointing (keep matmul outputs) is not "
                              "supported yet; give a block frequency N (every Nth block) or --activation-checkpoint full");
           }
           o.ac.selective_every = std::stoll(v);
         },
         "with --activation-checkpoint selective: checkpoint every Nth block (default 2)")
      ->check(CLI::Validator([](std::string& v) {
        if (v == "op") return std::string();
        try {
          size_t used = 0;
          return std::stoll(v, &used) >= 1 && used == v.size() ? std::string() : "must be a block frequency >= 1";
        } catch (...) {
          return std::string("must be a block frequency >= 1");
        }
      }, "N"));
  app.add_option("--seq-len", o.seq_len, "tokens per sequence")->check(positive());
  app.add_option("--batch", o.batch, "sequences per step, the global batch")->check(positive());
  app.add_flag("--sequence-parallel,!--no-sequence-parallel", o.sequence_parallel, "sequence parallel (default on)");
  app.add_flag("--loss-parallel,!--no-loss-parallel", o.loss_parallel, "loss parallel (default on)");
  app.add_flag("--async-tp,!--no-async-tp", o.async_tp,
               "SP's all-gathers and reduce-scatters fused with their matmuls, pipelined (async TP; needs sequence "
               "parallel; default off)");
  app.add_flag("--gradient-sync,!--no-gradient-sync", o.gradient_sync,
               "reduce gradients once after backward (default on)");
  app.add_option_function<std::string>(
         "--plan",
         [&](const std::string& v) {
           o.plan_auto = v == "auto";
           if (!o.plan_auto) o.plan = llama::tp_plan_from_string(v);
         },
         "the TP plan (hf: no sequence or loss parallel; auto: searched, which also sets SP, loss parallel, async TP "
         "and FSDP / DDP, overriding their flags)")
      ->check(CLI::IsMember({"torchtitan", "hf", "auto"}))->default_str(llama::to_string(o.plan));
  app.add_option("--memory-budget-mb", o.memory_budget_mb, "with --plan auto: the per-rank peak memory the plan must fit")
      ->check(positive());
}

// After parsing: the defaults that follow other flags (--dp from --ep).
inline void resolve_parallelism_flags(train::TrainOptions& o, const ParallelismSeen& seen) {
  if (o.ep > 1 && !seen.dp) o.dp = o.ep;
}

}  // namespace tools_cli
