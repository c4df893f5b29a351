// Our parallel styles against PyTorch's: tests/oracle/tp_styles_oracle.py runs torch.distributed.tensor.parallel
// (world 2, Gloo) on small modules with small plans and records each rank's inputs, local outputs, output
// placements, input gradients, every parameter's gradient (value and placements) and the collectives its
// CommDebugMode counts in the forward and in the backward. Each case is replayed here on the same modules,
// parameters and inputs and must agree in all of these.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/oracle_json.h"
#include "harness/small_models.h"

using namespace dtensor;
using dtensor::testing::placements_of;
using dtensor::testing::tensor_of;
using json = nlohmann::json;

namespace {

Placement placement_of(const json& j) { return Placement::parse(j.get<std::string>()); }

std::vector<std::optional<Placement>> optional_layouts(const json& j) {
  std::vector<std::optional<Placement>> out;
  if (j.is_null()) return out;
  for (const auto& e : j) out.push_back(e.is_null() ? std::nullopt : std::optional<Placement>(placement_of(e)));
  return out;
}

std::map<std::string, Placement> kwarg_layouts(const json& j) {
  std::map<std::string, Placement> out;
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) out.emplace(k, placement_of(v));
  }
  return out;
}

// PrepareModuleInput's fields, also PrepareModuleInputOutput's.
template <typename Style>
void set_input_layouts(Style& s, const json& j) {
  s.input_layouts = optional_layouts(j["input_layouts"]);
  s.desired_input_layouts = optional_layouts(j["desired_input_layouts"]);
  s.input_kwarg_layouts = kwarg_layouts(j["input_kwarg_layouts"]);
  s.desired_input_kwarg_layouts = kwarg_layouts(j["desired_input_kwarg_layouts"]);
}

// The oracle writes every keyword of a style with its effective value.
ParallelStylePtr style_of(const json& j) {
  const std::string name = j["style"];
  if (name == "ColwiseParallel" || name == "RowwiseParallel") {
    auto set = [&](auto s) {
      s.input_layouts = placement_of(j["input_layouts"]);
      s.output_layouts = placement_of(j["output_layouts"]);
      s.use_local_output = j["use_local_output"];
      return make_style(s);
    };
    return name == "ColwiseParallel" ? set(ColwiseParallel{}) : set(RowwiseParallel{});
  }
  if (name == "SequenceParallel") {
    SequenceParallel s;
    s.sequence_dim = j["sequence_dim"];
    s.use_local_output = j["use_local_output"];
    return make_style(s);
  }
  if (name == "PrepareModuleInput") {
    PrepareModuleInput s;
    set_input_layouts(s, j);
    s.use_local_output = j["use_local_output"];
    return make_style(s);
  }
  if (name == "PrepareModuleOutput") {
    PrepareModuleOutput s;
    s.output_layouts = placement_of(j["output_layouts"]);
    s.desired_output_layouts = placement_of(j["desired_output_layouts"]);
    s.use_local_output = j["use_local_output"];
    return make_style(s);
  }
  if (name == "PrepareModuleInputOutput") {
    PrepareModuleInputOutput s;
    set_input_layouts(s, j);
    s.use_local_input = j["use_local_input"];
    s.output_layouts = placement_of(j["output_layouts"]);
    s.desired_output_layouts = placement_of(j["desired_output_layouts"]);
    s.use_local_output = j["use_local_output"];
    return make_style(s);
  }
  throw std::invalid_argument("oracle style '" + name + "' is not known to this test");
}

std::map<std::string, int64_t> counts_of(const json& j) {
  std::map<std::string, int64_t> out;
  for (const auto& [k, v] : j.items()) out[k] = v.get<int64_t>();
  return out;
}

at::Tensor input_of(const json& j) {
  if (j.is_null()) return {};
  at::Tensor t = tensor_of(j);
  if (t.is_floating_point()) t.set_requires_grad(true);
  return t;
}

// Values: PyTorch and we run the same local kernels and collectives, so the tolerance is float round-off.
void expect_close(const at::Tensor& ours, const json& theirs, const std::string& what) {
  at::Tensor ref = tensor_of(theirs);
  ASSERT_EQ(ours.sizes(), ref.sizes()) << what;
  const double err = (ours.detach().to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
  EXPECT_TRUE(at::allclose(ours.detach().to(ref.scalar_type()), ref, 1e-5, 1e-6)) << what << ": max |ours - PyTorch's| = " << err;
}

void replay(const json& c, int rank, std::mutex& build_mutex) {
  const std::string id = c["id"];
  const json& mine = c["ranks"][rank];
  dtensor::testing::SmallModel model;
  {
    std::lock_guard<std::mutex> lock(build_mutex);  // LibTorch's generator is global to the thread-ranks
    model = dtensor::testing::make_small_model(c["model"]);
  }
  auto params = model.module->named_parameters();
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, value] : c["params"].items()) {
      ASSERT_TRUE(params.contains(name)) << id << ": no parameter " << name;
      params[name].copy_(tensor_of(value));
    }
  }

  auto mesh = init_device_mesh("cpu", {static_cast<int64_t>(c["ranks"].size())});
  ParallelizePlan plan;
  for (const auto& entry : c["plan"]) plan.emplace_back(entry[0].get<std::string>(), style_of(entry[1]));
  if (plan.size() == 1 && plan[0].first.empty()) {
    parallelize_module(*model.module, mesh, plan[0].second);
  } else {
    parallelize_module(*model.module, mesh, plan);
  }
  // The styles against PyTorch's: gradients as backward leaves them (Partial where PyTorch's are), so the
  // gradient placements and backward collectives compare one to one. Reducing them once is
  // dp/test_gradient_sync.cpp's subject.
  disable_gradient_sync(*model.module);
  params = model.module->named_parameters();
  for (const auto& p : params) {
    const json& expected = c["param_placements"];
    if (expected.contains(p.key())) {
      ASSERT_TRUE(is_dtensor(p.value())) << id << ": " << p.key() << " should be a DTensor";
      EXPECT_EQ(placements(p.value()), placements_of(expected[p.key()])) << id << ": " << p.key();
    } else {
      EXPECT_FALSE(is_dtensor(p.value())) << id << ": " << p.key() << " should stay plain";
    }
  }

  nn::Tensors args;
  for (const auto& a : mine["args"]) args.push_back(input_of(a));
  nn::Kwargs kwargs;
  for (const auto& [k, v] : mine["kwargs"].items()) kwargs[k] = input_of(v);
  at::Tensor out;
  {
    CommDebugMode comm;
    out = model.forward(args, kwargs);
    EXPECT_EQ(comm.get_comm_counts(), counts_of(mine["comm_forward"])) << id << ": collectives in the forward";
  }

  if (mine["output_placements"].is_null()) {
    EXPECT_FALSE(is_dtensor(out)) << id << ": PyTorch's output is a plain tensor";
  } else {
    ASSERT_TRUE(is_dtensor(out)) << id << ": PyTorch's output is a DTensor";
    EXPECT_EQ(placements(out), placements_of(mine["output_placements"])) << id << ": output placements";
  }
  at::Tensor local = is_dtensor(out) ? to_local(out) : out;
  expect_close(local, mine["output"], id + ": rank " + std::to_string(rank) + " output");

  {
    CommDebugMode comm;
    local.backward(tensor_of(mine["grad_output"]));
    EXPECT_EQ(comm.get_comm_counts(), counts_of(mine["comm_backward"])) << id << ": collectives in the backward";
  }
  for (size_t k = 0; k < args.size(); ++k) {
    if (mine["arg_grads"][k].is_null()) continue;
    ASSERT_TRUE(args[k].grad().defined()) << id << ": input " << k << " got no gradient";
    expect_close(args[k].grad(), mine["arg_grads"][k], id + ": input " + std::to_string(k) + " gradient");
  }
  for (const auto& [k, g] : mine["kwarg_grads"].items()) {
    if (!g.is_null()) expect_close(kwargs[k].grad(), g, id + ": keyword input " + k + " gradient");
  }
  // Same order on every rank: full_tensor is a collective.
  for (const auto& [name, g] : c["param_grads"].items()) {
    at::Tensor grad = params[name].grad();
    if (g.is_null()) {
      EXPECT_FALSE(grad.defined()) << id << ": " << name << " should get no gradient";
      continue;
    }
    ASSERT_TRUE(grad.defined()) << id << ": " << name << " got no gradient";
    if (g["placements"].is_null()) {
      EXPECT_FALSE(is_dtensor(grad)) << id << ": " << name << ".grad";
    } else {
      ASSERT_TRUE(is_dtensor(grad)) << id << ": " << name << ".grad should be a DTensor";
      EXPECT_EQ(placements(grad), placements_of(g["placements"])) << id << ": " << name << ".grad placements";
    }
    expect_close(is_dtensor(grad) ? full_tensor(grad) : grad, g, id + ": " + name + ".grad");
  }
}

}  // namespace

TEST(Oracle, ParallelStylesMatchPyTorch) {
  const std::string path = dtensor::testing::oracle_file("DTENSOR_TP_STYLES_JSON", "tp_styles.json");
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "no oracle file " << path << " (ctest's oracle_generate writes it)";
  json doc = json::parse(in);
  int replayed = 0;
  for (const auto& c : doc["cases"]) {
    ASSERT_FALSE(c.contains("error")) << c["id"] << ": PyTorch failed: " << c["error"];
    SCOPED_TRACE(c["id"].get<std::string>());
    std::mutex build_mutex;
    dtensor::testing::run_ranks(doc["world_size"], [&](int rank, int) { replay(c, rank, build_mutex); });
    ++replayed;
  }
  std::cout << "tp styles oracle (PyTorch " << doc["torch_version"].get<std::string>() << "): " << replayed
            << " cases replayed\n";
}
