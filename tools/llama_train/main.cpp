// llama_train: the main job. A Llama-3-style model trained under torchtitan's tensor + sequence parallel
// plan, one process per TP rank:
//
//   tprun --nproc-per-node 2 llama_train            # built-in defaults: a few million parameters, 300 steps
//   tprun --nproc-per-node 2 llama_train --help
//
// Rank 0 prints one progress line per logged step and, last, a machine-readable `summary` line.
// A bad command line prints one `error:` line on rank 0 and exits 2 on every rank, before any communication.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dtensor/mesh/launch_env.h"
#include "dtensor/mesh/fatal_signals.h"
#include "common/dtype.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/core/bf16_gemm.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/peft/lora.h"
#include "llama/parallelize.h"
#include "train/plan_search.h"
#include "dtensor/checkpoint/step_checkpoints.h"
#include "train/checkpointing.h"
#include "train/loop.h"
#include "train/pipeline.h"
#include "train/tokenized_corpus.h"
#include "tools/llama_train/options.h"
#include "train/export.h"

namespace {

// Preemption (torchtitan / TorchElastic): SIGTERM (tprun forwards its own) asks for a checkpoint at the next step
// boundary and a clean exit; a second SIGTERM ends the process (SA_RESETHAND).
volatile std::sig_atomic_t preempt_requested = 0;
void on_sigterm(int) { preempt_requested = 1; }

void install_preemption_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux: KiB
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// "[312, 305]": every rank's peak resident memory (one small all-gather, outside the counted steps).
std::string peak_rss_per_rank(const dtensor::DeviceMesh& mesh) {
  at::Tensor mine = at::full({1}, peak_rss_mb(), at::kDouble);
  at::Tensor all = mesh.size() > 1 ? dtensor::all_gather(mine, 0, mesh, 0) : mine;
  std::string s = "[";
  for (int64_t r = 0; r < all.numel(); ++r) s += (r ? ", " : "") + std::to_string(std::lround(all[r].item<double>()));
  return s + "]";
}

// --plan auto: the plan search of llama_plan --search (every rank computes the same choice: a fixed cost model, no
// measurement), its winner written into the options and its name returned. Rank 0 prints the choice and why.
// Throws dtensor::Error when no candidate fits the memory budget.
std::string choose_plan(train::TrainOptions& o, int64_t tp, bool print) {
  const train::PlanOptions base = train::plan_options_of(o, tp);
  const dtensor::AutoPlanOptions search{.memory_budget_bytes = o.memory_budget_mb << 20, .cost = train::fixed_cost_model()};
  const train::SearchResult r = train::search_plan(base, search);
  o.plan = r.best.plan;
  o.sequence_parallel = r.best.sequence_parallel;
  o.loss_parallel = r.best.loss_parallel;
  o.async_tp = r.best.async_tp;
  o.data_parallel = r.best.data_parallel;
  if (!print) return r.result.best.name;
  std::printf("plan auto: %s, predicted %.3f ms/step, peak %.2f MB per rank (%zu candidates)\nplan auto: why: %s\n",
              r.result.best.name.c_str(), r.result.best.predicted_step_ms,
              static_cast<double>(r.result.best.predicted_peak_bytes) / 1e6, r.result.candidates.size(), r.result.why.c_str());
  for (const auto& [path, style] : r.result.best.plan) std::printf("plan auto:   %s: %s\n", path.c_str(), style.c_str());
  std::fflush(stdout);
  return r.result.best.name;
}

// Every rank chose alone, before the process group: ranks with different plans would exchange mismatched shards, so
// a disagreement is an error naming both choices, never a run.
void check_same_choice(const dtensor::DeviceMesh& world_mesh, const std::string& mine) {
  if (world_mesh.size() == 1) return;
  const auto h = static_cast<int64_t>(std::hash<std::string>()(mine) >> 1);
  const at::Tensor all = dtensor::all_gather(at::full({1}, h, at::TensorOptions(at::kLong).device(world_mesh.device())), 0, world_mesh, 0).cpu();
  for (int64_t r = 0; r < all.numel(); ++r) {
    DTENSOR_CHECK(all[r].item<int64_t>() == h, "llama_train: --plan auto chose ", mine, " on rank ",
                  world_mesh.get_rank(), " but another plan on rank ", r, ": the plan search must agree on every rank");
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::report_fatal_signals();  // a crash says where, on this rank's stderr
  const dtensor::LaunchEnv launch = dtensor::LaunchEnv::peek();  // before the group: --help and usage errors on rank 0
  const int rank = launch.rank;
  const int world_size = launch.world_size;
  train::TrainOptions options;
  train::Corpus corpus, eval_corpus;
  std::string auto_choice;  // --plan auto's winner
  try {
    bool help = false;
    options = llama_train::parse_options(std::vector<std::string>(argv + 1, argv + argc), help);
    if (help) {
      if (rank == 0) std::fputs(llama_train::help_text().c_str(), stdout);
      return 0;
    }
    train::check_options(options, world_size);
    // Text through --tokenizer when there is one (bytes otherwise); a .bin holds ids already. --data and --eval-data alike.
    auto load = [&](const std::string& path) {
      const bool text = path.empty() || !path.ends_with(".bin");
      return !options.tokenizer_dir.empty() && text
                 ? train::load_tokenized_corpus(path, options.tokenizer_dir, /*progress=*/rank == 0)
                 : train::load_corpus(path);
    };
    corpus = load(options.data);
    train::fit_to_corpus(options, corpus);
    if (!options.eval_data.empty()) {
      eval_corpus = load(options.eval_data);
      train::fit_eval_corpus(options, eval_corpus);
    }
    // The plan's size checks (heads, kv heads, ffn, vocab vs the TP degree) before any communication.
    const int64_t tp = train::tp_degree(options, world_size);
    if (options.plan_auto) auto_choice = choose_plan(options, tp, rank == 0);
    if (tp > 1 && options.plan == llama::TPPlan::hf) llama::hf_plan(options.model, tp);
    if (tp > 1 && options.plan == llama::TPPlan::torchtitan) llama::torchtitan_plan(options.model, tp);
    if (options.lora()) dtensor::peft::find_targets(*llama::meta_model(options.model), *train::lora_config(options));
  } catch (const std::exception& e) {
    return tools_cli::usage_error_exit(rank, e.what());
  }
  try {
    auto world = dtensor::init_process_group();
    models::ParallelDims dims = train::parallel_dims(options, world->size());
    const dtensor::DeviceMesh& mesh = dims.build_mesh();
    const dtensor::DeviceMesh tp_mesh = dims.tp_mesh();
    // --float8-matmul auto: the kinds timed on this model's largest local matmul (its feed-forward's), every rank's
    // timings summed so that all pick the same kind; the layers are built with it.
    std::string kernel_choices;  // the first line's float8 and bf16 matmul choices
    if (options.float8 && options.float8_matmul == dtensor::Float8MatmulKind::auto_select && tp_mesh.device().is_cpu()) {
      const dtensor::Float8MatmulTimings t = dtensor::time_float8_matmuls(
          options.batch * options.seq_len / std::max<int64_t>(1, options.cp), options.model.hidden_size,
          options.model.intermediate_size / tp_mesh.size(),
          at::TensorOptions(tp_mesh.device()).dtype(train::compute_dtype(options)), world->world_group().get());
      options.float8_matmul = t.fastest;
      kernel_choices = " float8_matmul=auto: " + t.to_string();
    } else if (options.float8) {
      kernel_choices = " float8_matmul=" + dtensor::to_string(options.float8_matmul);
    }
    // The bf16 GEMM's way on this CPU (core/bf16_gemm.h), measured once per process, named in the first line.
    if (tp_mesh.device().is_cpu() && train::compute_dtype(options) == at::kBFloat16) {
      kernel_choices += " " + dtensor::bf16_gemm_report();
    }
    llama::LlamaForCausalLM model = train::build_model(options, dims);  // meta-first: each rank only its shards
    const int64_t tokens_per_step = options.batch * train::gradient_accumulation_steps(options) * options.seq_len;
    if (rank == 0) {
      if (options.pp > 1) {
        const auto spec = train::pipeline_spec(options);
        const auto sim = dtensor::pp::simulate(dtensor::pp::rank_programs(spec), spec);
        const llama::StageLayers first = train::pipeline_stage_layers(options, 0);
        std::printf("pipeline: pp=%lld schedule=%s microbatches=%d stage0 layers [%lld, %lld) bubble (simulated, F = I = W) %.3f\n",
                    static_cast<long long>(options.pp), options.pp_schedule.c_str(), spec.microbatches,
                    static_cast<long long>(first.first), static_cast<long long>(first.last), sim.bubble_fraction);
      }
      std::printf("llama_train: device=%s params=%s mixed_precision=%s dp=%lld (%s) ep=%lld cp=%lld tp=%lld plan=%s sequence_parallel=%d loss_parallel=%d async_tp=%d%s batch=%lld x %lld micro-batches | %s | corpus %s, %lld tokens\n",
                  tp_mesh.device().str().c_str(), models::dtype_name(train::param_dtype(options)).c_str(),
                  train::to_string(options.mixed_precision).c_str(), static_cast<long long>(options.dp), options.dp * options.cp > 1 ? models::to_string(options.data_parallel).c_str() : "none",
                  static_cast<long long>(options.ep), static_cast<long long>(options.cp), static_cast<long long>(tp_mesh.size()), llama::to_string(options.plan).c_str(), options.sequence_parallel,
                  options.loss_parallel, options.async_tp, kernel_choices.c_str(), static_cast<long long>(options.batch),
                  static_cast<long long>(train::gradient_accumulation_steps(options)), options.model.to_string().c_str(), corpus.source.c_str(),
                  static_cast<long long>(corpus.tokens.numel()));
    }
    if (rank == 0 && options.lora()) {
      // PEFT's print_trainable_parameters.
      int64_t trainable = 0, all = 0;
      for (const auto& p : dtensor::nn::unique_parameters(*model)) {
        all += p.numel();
        if (p.requires_grad()) trainable += p.numel();
      }
      std::string targets;
      for (const auto& t : options.lora_targets) targets += (targets.empty() ? "" : ",") + t;
      std::printf("lora: r=%lld alpha=%g targets=%s%s | trainable params: %lld || all params: %lld || trainable%%: %.4f\n",
                  static_cast<long long>(options.lora_rank), options.lora_alpha, targets.c_str(),
                  options.lora_adapter.empty() ? "" : (" from " + options.lora_adapter).c_str(), static_cast<long long>(trainable),
                  static_cast<long long>(all), 100.0 * static_cast<double>(trainable) / static_cast<double>(all));
    }
    const dtensor::DeviceMesh& whole = dims.global_mesh();  // every rank of every stage, for the memory line
    const dtensor::DeviceMesh world_mesh = whole.ndim() == 1 ? whole : whole.flatten();
    if (options.plan_auto) check_same_choice(world_mesh, auto_choice);
    train::TrainHooks hooks;
    hooks.after_step = [&](const train::StepRecord& r) {
      if ((r.step + 1) % options.log_every != 0 && r.step != 0 && r.step + 1 != options.steps && std::isnan(r.eval_loss)) return;
      const std::string rss = peak_rss_per_rank(world_mesh);
      if (rank != 0) return;
      std::printf("step %5lld  loss %.6f  grad_norm %.3f  lr %.2e  %.1f ms/step (comm %.1f)  %.0f tokens/s  peak_rss_mb %s\n",
                  static_cast<long long>(r.step + 1), r.loss, r.grad_norm, r.lr, r.ms, r.comm_ms,
                  static_cast<double>(tokens_per_step) / (r.ms / 1000.0), rss.c_str());
      if (!std::isnan(r.eval_loss)) {
        std::printf("eval step %5lld  loss %.6f  perplexity %.3f  (%lld tokens of %s)\n", static_cast<long long>(r.step + 1),
                    r.eval_loss, std::exp(r.eval_loss), static_cast<long long>(r.eval_tokens), eval_corpus.source.c_str());
      }
      if (options.comm_detail) {
        auto part = [](const std::map<std::string, int64_t>& counts, const std::map<std::string, int64_t>& bytes) {
          std::string s;
          for (const auto& [c, n] : counts) s += " " + c + "=" + std::to_string(n) + ":" + std::to_string(bytes.at(c));
          return s;
        };
        std::printf("comm step %lld fwd_bwd%s | update%s\n", static_cast<long long>(r.step + 1),
                    part(r.fwd_bwd_counts, r.fwd_bwd_bytes).c_str(), part(r.update_counts, r.update_bytes).c_str());
      }
      std::fflush(stdout);
    };
    // Every rank stops at the same step: a rank's SIGTERM flag is all-reduced (MAX) at each step boundary, one tiny
    // collective outside the step's accounting.
    install_preemption_handler();
    hooks.stop_requested = [&](int64_t) {
      if (world_mesh.size() == 1) return preempt_requested != 0;
      const at::Tensor flag = at::full({1}, preempt_requested ? 1.0 : 0.0, at::kDouble);
      return dtensor::all_reduce(flag, dtensor::ReduceOp::MAX, world_mesh, 0).item<double>() > 0;
    };
    if (rank == 0 && options.resume) {
      const auto latest = dtensor::checkpoint::latest_step_checkpoint(options.checkpoint_dir);
      std::printf("%s\n", latest ? ("resuming from " + latest->path).c_str() : "no checkpoint to resume from: starting at step 0");
      std::fflush(stdout);
    }
    if (rank == 0 && !train::keeps_weights(options)) {
      std::fprintf(stderr, "llama_train: note: this run keeps no weights (no --checkpoint-dir with --checkpoint-every, no "
                           "--save-hf DIR): the trained model is lost when it ends\n");
      std::fflush(stderr);
    }
    const auto result = train::run(model, options, corpus, dims, hooks, options.eval_data.empty() ? nullptr : &eval_corpus);
    if (!options.save_hf.empty() && !result.stopped_early) {
      train::save_hf(options, model, options.save_hf);
      if (rank == 0 && options.lora() && !options.merge_lora) {
        std::printf("saved the LoRA adapter to %s (PEFT's PeftModel.from_pretrained loads it)\n", options.save_hf.c_str());
      } else if (rank == 0) {
        std::printf("saved the model%s to %s (transformers' from_pretrained loads it)\n",
                    options.merge_lora ? " with the adapters merged" : "", options.save_hf.c_str());
      }
    } else if (!options.save_hf.empty() && rank == 0) {
      std::printf("--save-hf: not saved: the run stopped early (--resume finishes it, then saves)\n");
    }
    if (rank == 0 && result.stopped_early) {
      const int64_t at = result.steps.empty() ? result.start_step : result.steps.back().step + 1;
      if (result.saved_step > 0) {
        std::printf("preempted (SIGTERM) after step %lld: checkpoint %s saved; --resume continues from it\n",
                    static_cast<long long>(at), dtensor::checkpoint::step_checkpoint_path(options.checkpoint_dir, result.saved_step).c_str());
      } else {
        std::printf("preempted (SIGTERM) after step %lld: no --checkpoint-dir, nothing saved\n", static_cast<long long>(at));
      }
    }
    if (rank == 0 && result.steps.empty()) {
      std::printf("summary final_loss=nan steps_run=0 resumed_from=%lld\n", static_cast<long long>(result.start_step));
    } else if (rank == 0) {
      std::vector<double> ms, comm_ms, pp_wait_ms;
      for (size_t i = std::min<size_t>(3, result.steps.size() - 1); i < result.steps.size(); ++i) {
        ms.push_back(result.steps[i].ms);
        comm_ms.push_back(result.steps[i].comm_ms);
        pp_wait_ms.push_back(result.steps[i].pp_wait_ms);
      }
      const double med = median(ms);
      const auto& last = result.steps.back();
      double eval_loss = NAN;  // the last evaluation's
      for (const auto& r : result.steps) {
        if (!std::isnan(r.eval_loss)) eval_loss = r.eval_loss;
      }
      std::printf("summary final_loss=%.6f median_step_ms=%.3f median_comm_ms=%.3f tokens_per_s=%.1f collectives_per_step=%lld "
                  "comm_bytes_per_step=%lld param_bytes_per_rank=%lld steps_run=%zu resumed_from=%lld preempted=%d eval_loss=%.6f "
                  "pp=%lld median_pp_wait_ms=%.3f\n",
                  last.loss, med, median(comm_ms), static_cast<double>(tokens_per_step) / (med / 1000.0),
                  static_cast<long long>(last.total_counts()), static_cast<long long>(last.total_bytes()),
                  static_cast<long long>(result.param_bytes_per_rank), result.steps.size(),
                  static_cast<long long>(result.start_step), result.stopped_early ? 1 : 0, eval_loss,
                  static_cast<long long>(options.pp), median(pp_wait_ms));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
