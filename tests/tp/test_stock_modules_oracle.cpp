// Stock modules under our TP against PyTorch's own DTensor TP: tests/oracle/stock_tp_oracle.py runs the same
// torch.nn modules (Sequential MLPs, the ToyModel, MultiheadAttention, Transformer layers, nn.Transformer) under
// torch.distributed.tensor.parallel at world sizes 2 and 4 and writes their parameters, inputs, outputs,
// gradients and 5 AdamW steps. Here the LibTorch modules get those parameters, PairwiseParallel at the same
// world size, and must give the same numbers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/tp/parallelize.h"
#include "harness/multi_rank.h"
#include "stock_toy_model.h"
#include "harness/oracle_json.h"

using namespace dtensor;
using dtensor::testing::tensor_of;

namespace {


// The oracle's modules as LibTorch builds them, and their forward on the oracle's inputs.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const std::vector<at::Tensor>&)> forward;  // plain tensors in and out
};

template <typename Holder, typename Call>
Model parallel_model(Holder holder, Call call) {
  auto parallel = std::make_shared<Parallelized<Holder>>(holder);
  return {holder.ptr(), [parallel, call](const std::vector<at::Tensor>& in) { return call(*parallel, in); }};
}

Model build(const std::string& name, const DeviceMesh& mesh, const nlohmann::json& params) {
  using namespace torch::nn;
  auto load = [&](Module& m) {
    torch::NoGradGuard no_grad;
    auto named = m.named_parameters();
    ASSERT_EQ(named.size(), params.size()) << name;
    for (auto& p : named) p.value().copy_(tensor_of(params.at(p.key())));
  };
  auto prepare = [&](Module& m) {
    load(m);
    parallelize_module(m, mesh, PairwiseParallel());
  };
  auto one = [](auto& m, const std::vector<at::Tensor>& in) { return m(in[0]); };
  auto two = [](auto& m, const std::vector<at::Tensor>& in) { return m(in[0], in[1]); };
  if (name == "mlp" || name == "mlp4") {
    Sequential s = name == "mlp" ? Sequential(Linear(8, 16), ReLU(), Linear(16, 8))
                                 : Sequential(Linear(8, 16), ReLU(), Linear(16, 8), GELU(), Linear(8, 12), ReLU(), Linear(12, 8));
    prepare(*s);
    return parallel_model(s, one);
  }
  if (name == "toy") {
    StockToyModel t;
    prepare(*t);
    return parallel_model(t, one);
  }
  if (name == "mha") {
    MultiheadAttention a(16, 4);
    prepare(*a);
    return parallel_model(a, [](auto& m, const std::vector<at::Tensor>& in) { return std::get<0>(m(in[0], in[0], in[0])); });
  }
  if (name == "encoder_layer") {
    TransformerEncoderLayer l(TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0));
    prepare(*l);
    return parallel_model(l, one);
  }
  if (name == "decoder_layer") {
    TransformerDecoderLayer l(TransformerDecoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0));
    prepare(*l);
    return parallel_model(l, two);
  }
  Transformer t(TransformerOptions(16, 4, 2, 2).dim_feedforward(32).dropout(0.0));
  EXPECT_EQ(name, "transformer");
  prepare(*t);
  return parallel_model(t, two);
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / (1.0 + b.abs().max().item<double>());
}
at::Tensor whole(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t).detach() : t.detach(); }

// The elements of `t` (flattened) outside the oracle's noisy range for `name`, if any.
at::Tensor comparable(const at::Tensor& t, const std::string& name, const nlohmann::json& noisy) {
  if (!noisy.contains(name)) return t.flatten();
  const int64_t b = noisy[name][0], e = noisy[name][1];
  return at::cat({t.flatten().slice(0, 0, b), t.flatten().slice(0, e)});
}

}  // namespace

TEST(Oracle, StockModulesMatchPyTorch) {
  const std::string path = dtensor::testing::oracle_file("DTENSOR_STOCK_TP_JSON", "stock_tp.json");
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "no oracle file " << path << " (ctest's oracle_stock_generate writes it)";
  const auto doc = nlohmann::json::parse(in);
  int replayed = 0;
  for (const auto& c : doc["cases"]) {
    if (c.contains("skipped")) continue;
    const std::string id = c["id"];
    const std::string model = c["model"];
    const int world = c["world_size"];
    SCOPED_TRACE(id);
    dtensor::testing::run_ranks(world, [&](int, int) {
      auto mesh = init_device_mesh("cpu", {world});
      Model m = build(model, mesh, c["params"]);
      torch::optim::AdamW opt(m.module->parameters(), torch::optim::AdamWOptions(0.01));
      const at::Tensor g = tensor_of(c["grad_weight"]);
      for (int step = 0; step < 5; ++step) {
        std::vector<at::Tensor> inputs;
        for (const auto& x : c["inputs"]) inputs.push_back(tensor_of(x).requires_grad_(true));
        opt.zero_grad();
        at::Tensor out = m.forward(inputs);
        at::Tensor loss = (out * g).sum();
        EXPECT_NEAR(loss.item<double>(), c["losses"][step].get<double>(), 2e-5 * (1 + std::abs(loss.item<double>())))
            << "loss, step " << step;
        loss.backward();
        if (step == 0) {
          EXPECT_LE(rel_diff(out.detach(), tensor_of(c["output"])), 2e-6) << "output";
          for (size_t k = 0; k < inputs.size(); ++k) {
            if (c["input_grads"][k].is_null()) continue;
            EXPECT_LE(rel_diff(inputs[k].grad(), tensor_of(c["input_grads"][k])), 2e-6) << "grad of input " << k;
          }
          for (const auto& p : m.module->named_parameters()) {
            EXPECT_LE(rel_diff(whole(p.value().grad()), tensor_of(c["param_grads"][p.key()])), 2e-6) << "grad of " << p.key();
          }
        }
        opt.step();
        for (const auto& p : m.module->named_parameters()) {
          const at::Tensor want = tensor_of(c["params_after"][step][p.key()]);
          EXPECT_LE(rel_diff(comparable(whole(p.value()), p.key(), c["noisy_params"]),
                             comparable(want, p.key(), c["noisy_params"])), 1e-5)
              << p.key() << " after AdamW step " << step + 1;
        }
      }
    });
    ++replayed;
  }
  EXPECT_EQ(replayed, 14);
  std::cout << "stock modules oracle (PyTorch " << doc["torch_version"].get<std::string>() << "): " << replayed
            << " cases replayed\n";
}
