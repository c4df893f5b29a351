#include "llama_test_util.h"

#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "llama/hf_weights.h"

namespace llama_test {

train::TrainOptions small_options() {
  train::TrainOptions o;
  o.model.vocab_size = 256;
  o.model.hidden_size = 64;
  o.model.num_hidden_layers = 2;
  o.model.num_attention_heads = 4;
  o.model.num_key_value_heads = 2;
  o.model.intermediate_size = 128;
  o.seq_len = 16;
  o.batch = 4;
  o.steps = 20;
  o.lr = 3e-3;
  o.warmup = 5;
  o.max_norm = 1.0;
  o.seed = 7;
  // The fp32 reference: TP / DP results equal to one device's to fp32 rounding. Mixed precision has its own tests
  // (tests/train/test_mixed_precision_training.cpp).
  o.mixed_precision = train::MixedPrecision::off;
  return o;
}

const train::Corpus& test_corpus() {
  static const train::Corpus corpus = train::load_corpus(DTENSOR_SOURCE_DIR "/README.md");
  return corpus;
}

namespace {

// Ranks as threads on `make_mesh(world)` (or the dims `make_dims(world)` built, when given); rank 0's results.
RunResult run_ranks_on(const train::TrainOptions& options, int world, bool capture_grads, Build build,
                       const std::function<dtensor::DeviceMesh(int world)>& make_mesh,
                       const std::function<models::ParallelDims(int world)>& make_dims = {});

}  // namespace

RunResult run_tp(const train::TrainOptions& options, int tp, bool capture_grads, Build build) {
  return run_ranks_on(options, tp, capture_grads, build, [&](int world) { return dtensor::init_device_mesh(options.device, {world}); }, {});
}

RunResult run_dp_tp(train::TrainOptions options, int dp, int tp, bool capture_grads, Build build) {
  options.dp = dp;
  options.tp = tp;
  return run_ranks_on(options, dp * tp, capture_grads, build,
                      [&](int world) { return train::parallel_dims(options, world).build_mesh(); }, {});
}

RunResult run_dp_cp_tp(train::TrainOptions options, int dp, int cp, int tp, bool capture_grads) {
  options.dp = dp;
  options.cp = cp;
  options.tp = tp;
  return run_ranks_on(options, dp * cp * tp, capture_grads, Build::meta_first, {}, [&](int world) {
    models::ParallelDims dims = train::parallel_dims(options, world);
    dims.build_mesh();
    return dims;
  });
}

RunResult run_pp(train::TrainOptions options, int pp, int dp, int tp, bool capture_grads) {
  options.pp = pp;
  options.dp = dp;
  options.tp = tp;
  return run_ranks_on(options, pp * dp * tp, capture_grads, Build::meta_first, {}, [&](int world) {
    train::check_options(options, world);
    models::ParallelDims dims = train::parallel_dims(options, world);
    dims.build_mesh();
    return dims;
  });
}

namespace {

RunResult run_ranks_on(const train::TrainOptions& options, int world_size, bool capture_grads, Build build,
                       const std::function<dtensor::DeviceMesh(int world)>& make_mesh,
                       const std::function<models::ParallelDims(int world)>& make_dims) {
  RunResult out;
  std::mutex mu;
  dtensor::testing::RunOptions run_options;
  run_options.run_timeout = std::chrono::milliseconds(300000);
  run_options.expect_all_succeed = false;  // rank errors are thrown below (the tests skip known library gaps)
  const auto errors = dtensor::testing::run_ranks(world_size, [&](int rank, int world) {
    llama::LlamaForCausalLM model{nullptr};
    models::ParallelDims dims;
    if (make_dims) {  // dims that a mesh alone does not say (context parallel)
      dims = make_dims(world);
      model = train::build_model(options, dims);
    } else if (build == Build::meta_first) {
      dims = models::ParallelDims::from_mesh(make_mesh(world), options.data_parallel);
      model = train::build_model(options, dims);
    } else {
      const dtensor::DeviceMesh mesh = make_mesh(world);
      model = train::make_model(options);
      model->to(mesh.device());
      dims = train::parallelize(model, options, mesh);
    }
    train::TrainHooks hooks;
    std::map<std::string, at::Tensor> grads;
    if (capture_grads) {
      hooks.after_backward = [&](int64_t step, llama::LlamaForCausalLM& m) {
        if (step != 0) return;
        for (const auto& item : m->named_parameters()) {
          const at::Tensor& g = item.value().grad();
          grads[item.key()] = (dtensor::is_dtensor(g) ? dtensor::full_tensor(g) : g).cpu().clone();
        }
      };
    }
    // options.eval_data: a file of the repo as the held-out split (eval.h).
    const train::Corpus eval = options.eval_data.empty() ? train::Corpus{} : train::load_corpus(options.eval_data);
    const auto result = train::run(model, options, test_corpus(), dims, hooks, options.eval_data.empty() ? nullptr : &eval);
    // Rank 0's record; the gradients from the first rank of every pipeline stage (each holds its own layers').
    const bool leads_stage = dims.has_mesh() ? dims.world_mesh().ranks().front() == rank : rank == 0;
    if (!leads_stage) return;
    std::lock_guard<std::mutex> lock(mu);
    out.step1_grads.insert(grads.begin(), grads.end());
    if (rank != 0) return;
    for (const auto& s : result.steps) out.losses.push_back(s.loss);
    out.steps = result.steps;
    out.param_bytes_per_rank = result.param_bytes_per_rank;
    out.grad_bytes_per_rank = result.grad_bytes_per_rank;
    out.optimizer_bytes_per_rank = result.optimizer_bytes_per_rank;
  }, run_options);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
  }
  return out;
}

}  // namespace

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(a[i]));
  return worst;
}

at::Tensor pretrained_logits(const std::string& dir, int tp, const std::string& plan, const at::Tensor& tokens,
                             const at::Tensor& attention_mask, const std::string& dtype) {
  at::Tensor out;
  std::mutex mu;
  dtensor::testing::run_ranks(tp, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model = llama::from_pretrained(dir, &mesh, plan, dtype);
    at::NoGradGuard no_grad;
    at::Tensor logits = model(tokens, attention_mask);
    if (dtensor::is_dtensor(logits)) logits = dtensor::full_tensor(logits);
    logits = logits.to(at::kFloat);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = logits.clone();
    }
  });
  return out;
}

}  // namespace llama_test
