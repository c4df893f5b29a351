// LoRA adapters (include/dtensor/peft/lora.h): A and B as submodules of the base Linear, and a forward wrapper
// (nn/forward_override.h) that adds the branch to the body's output, between the style's input and output hooks.
#include "dtensor/peft/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/nn/default_device.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/parameter_replacement.h"
#include "nn/forward_override.h"

namespace dtensor::peft {
namespace {

// One adapted layer.
struct Adapter {
  LoraConfig config;
  torch::nn::Module* base = nullptr;  // the Linear
  std::weak_ptr<torch::nn::Module> alive;  // expires with it (another module may later live at its address)
  nn::Linear lora_A{nullptr}, lora_B{nullptr};
  bool merged = false, enabled = true;
  bool active() const { return enabled && !merged; }
};

// The adapters by their base layer. The forward wrapper owns each (it lives as long as the layer's hooks); the table
// only finds them.
std::mutex table_mutex;
std::unordered_map<const torch::nn::Module*, std::weak_ptr<Adapter>>& table() {
  static std::unordered_map<const torch::nn::Module*, std::weak_ptr<Adapter>> t;
  return t;
}

std::shared_ptr<Adapter> find(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = table().find(&module);
  if (it == table().end()) return nullptr;
  std::shared_ptr<Adapter> a = it->second.lock();
  if (!a || a->base != &module || a->alive.expired()) return nullptr;
  return a;
}

// The adapters of `model`, in module order.
std::vector<std::shared_ptr<Adapter>> adapters_of(torch::nn::Module& model) {
  std::vector<std::shared_ptr<Adapter>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    if (auto a = find(*item.value())) out.push_back(std::move(a));
  }
  return out;
}

bool matches(const std::string& name, const std::vector<std::string>& targets) {
  if (name.find(".lora_A") != std::string::npos || name.find(".lora_B") != std::string::npos) return false;
  for (const auto& t : targets) {
    if (t == "all-linear") {
      if (name != "lm_head" && !name.ends_with(".lm_head")) return true;
      continue;
    }
    if (name == t || name.ends_with("." + t)) return true;
  }
  return false;
}

// How A and B lie, from the base weight's placement (see lora.h): {A's, B's}. Plain weights: none.
struct Layout {
  std::optional<DeviceMesh> mesh;
  Placement a = Replicate(), b = Replicate();
};
Layout layout_for(const std::string& name, const at::Tensor& weight, double dropout) {
  if (!is_dtensor(weight)) return {};
  const DeviceMesh& mesh = device_mesh(weight);
  const Placements& p = placements(weight);
  DTENSOR_CHECK(p.size() == 1, "dtensor: LoRA: '", name, "' has its weight on a ", p.size(),
                "-d mesh ", to_string(p), "; adapters follow a TP layout on one mesh dim (inject them before data parallel)");
  DTENSOR_CHECK(dropout == 0.0, "dtensor: LoRA: lora_dropout ", dropout, " on '", name,
                "' under TP: the ranks of a replicated input would draw different masks; use lora_dropout 0");
  const Placement w = p[0].normalized(2);
  if (w.is_replicate()) return {mesh, Replicate(), Replicate()};
  if (w == Shard(0)) return {mesh, Replicate(), Shard(0)};  // Colwise
  if (w == Shard(1)) return {mesh, Shard(1), Replicate()};  // Rowwise
  throw DTENSOR_ERROR("dtensor: LoRA: '", name, "' has its weight laid out as ", to_string(p),
                      "; adapters follow Shard(0) (Colwise), Shard(1) (Rowwise) or Replicate weights only");
}

// A parameter of `full`'s value laid out as `layout` says for A (a) or B, on the weight's device.
at::Tensor adapter_parameter(const at::Tensor& full, const Layout& layout, const Placement& placement) {
  at::Tensor p = layout.mesh ? distribute_tensor(full, *layout.mesh, {placement}, /*src_data_rank=*/std::nullopt) : full;
  return p.detach().requires_grad_(true);
}

uint64_t name_hash(const std::string& name) {  // FNV-1a: the same on every rank and build
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// y + scaling * B(A(dropout(x))), as PEFT's Linear.forward: x cast to the adapters' dtype, the sum cast back to y's.
c10::IValue lora_forward(const std::shared_ptr<Adapter>& a, torch::nn::Module& module, const nn::Args& args,
                         const nn::KwArgs& kwargs, const nn::detail::ForwardBody& body) {
  c10::IValue out = body(args, kwargs);
  if (!a->active()) return out;
  const at::Tensor y = out.toTensor();
  at::Tensor h = args.at(0).toTensor();
  const at::ScalarType dtype = a->lora_A->weight.scalar_type();
  if (h.scalar_type() != dtype) h = h.to(dtype);
  if (a->config.lora_dropout > 0 && module.is_training()) h = at::dropout(h, a->config.lora_dropout, /*train=*/true);
  const at::Tensor branch = a->lora_B(a->lora_A(h)) * a->config.scaling();
  at::Tensor sum = y + branch;
  if (sum.scalar_type() != y.scalar_type()) sum = sum.to(y.scalar_type());
  return c10::IValue(sum);
}

}  // namespace

double LoraConfig::scaling() const { return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / r; }

void validate(const LoraConfig& c) {
  DTENSOR_CHECK(c.r >= 1, "dtensor: LoRA: r (the rank) must be >= 1, got ", c.r);
  DTENSOR_CHECK(c.lora_alpha > 0, "dtensor: LoRA: lora_alpha must be > 0, got ", c.lora_alpha);
  DTENSOR_CHECK(c.lora_dropout >= 0 && c.lora_dropout < 1, "dtensor: LoRA: lora_dropout must be in [0, 1), got ", c.lora_dropout);
  DTENSOR_CHECK(!c.target_modules.empty(), "dtensor: LoRA: target_modules is empty");
}

namespace {

struct Target {
  std::string name;
  nn::LinearImpl* linear;
};

std::vector<Target> targets_of(torch::nn::Module& model, const LoraConfig& config) {
  validate(config);
  std::vector<Target> targets;
  std::vector<bool> used(config.target_modules.size(), false);
  std::vector<std::string> named;  // the targets but "all-linear"
  for (const auto& t : config.target_modules) {
    if (t != "all-linear") named.push_back(t);
  }
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (!matches(name, config.target_modules)) continue;
    for (size_t i = 0; i < config.target_modules.size(); ++i) {
      if (matches(name, {config.target_modules[i]})) used[i] = true;
    }
    auto* linear = dynamic_cast<nn::LinearImpl*>(item.value().get());
    if (!linear && !matches(name, named)) continue;  // "all-linear" passes over what is no Linear
    DTENSOR_CHECK(linear != nullptr, "dtensor: LoRA: target '", name, "' is a ", item.value()->name(),
                  ", not a Linear (dtensor::nn::Linear): adapters go on Linear layers only");
    DTENSOR_CHECK(!nn::detail::has_forward_override(*linear) && !nn::detail::has_forward_wrapper(*linear),
                  "dtensor: LoRA: '", name, "' already has its forward replaced or wrapped (async TP's fused matmul, "
                  "float8, an adapter): an adapter would not run");
    targets.push_back({name, linear});
  }
  for (size_t i = 0; i < used.size(); ++i) {
    DTENSOR_CHECK(used[i], "dtensor: LoRA: target module '", config.target_modules[i],
                  "' not found in the base model (PEFT's target_modules: a module name or the end of one, e.g. q_proj)");
  }
  return targets;
}

}  // namespace

std::vector<std::string> find_targets(torch::nn::Module& model, const LoraConfig& config) {
  std::vector<std::string> names;
  for (const Target& t : targets_of(model, config)) names.push_back(t.name);
  return names;
}

std::vector<std::string> inject_adapter(torch::nn::Module& model, const LoraConfig& config, uint64_t seed, at::ScalarType dtype) {
  // Every target found and its layout checked before any layer changes.
  const std::vector<Target> targets = targets_of(model, config);
  std::vector<Layout> layouts;
  for (const Target& t : targets) layouts.push_back(layout_for(t.name, t.linear->weight, config.lora_dropout));
  std::vector<std::string> names;
  for (size_t k = 0; k < targets.size(); ++k) {
    const Target& t = targets[k];
    const Layout& layout = layouts[k];
    auto a = std::make_shared<Adapter>();
    a->config = config;
    a->base = t.linear;
    a->alive = t.linear->shared_from_this();
    const int64_t in = t.linear->weight.size(1), out = t.linear->weight.size(0);
    const at::Device device = t.linear->weight.device();
    // PEFT's init_lora_weights=True: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ name_hash(t.name));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    const at::Tensor a_full = at::empty({config.r, in}, at::kFloat).uniform_(-bound, bound, gen).to(device, dtype);
    const at::Tensor b_full = at::zeros({out, config.r}, at::TensorOptions(dtype).device(device));
    {
      nn::DefaultDeviceGuard meta(at::kMeta);  // built on meta: their own init draws nothing from the global generator
      a->lora_A = nn::Linear(torch::nn::LinearOptions(in, config.r).bias(false));
      a->lora_B = nn::Linear(torch::nn::LinearOptions(config.r, out).bias(false));
    }
    nn::replace_parameter(*a->lora_A, "weight", adapter_parameter(a_full, layout, layout.a));
    nn::replace_parameter(*a->lora_B, "weight", adapter_parameter(b_full, layout, layout.b));
    t.linear->register_module("lora_A", a->lora_A);
    t.linear->register_module("lora_B", a->lora_B);
    nn::detail::register_forward_wrapper(*t.linear, [a](torch::nn::Module& m, const nn::Args& args, const nn::KwArgs& kwargs,
                                                        const nn::detail::ForwardBody& body) {
      return lora_forward(a, m, args, kwargs, body);
    });
    {
      std::lock_guard<std::mutex> lock(table_mutex);
      std::erase_if(table(), [](const auto& entry) {  // the entries of layers that have died
        const std::shared_ptr<Adapter> old = entry.second.lock();
        return !old || old->alive.expired();
      });
      table()[t.linear] = a;
    }
    names.push_back(t.name);
  }
  return names;
}

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos ||
         name.starts_with("lora_A.") || name.starts_with("lora_B.");
}

int64_t mark_only_lora_as_trainable(torch::nn::Module& model) {
  int64_t trainable = 0;
  for (const auto& p : model.named_parameters()) {
    const bool lora = is_lora_parameter(p.key());
    p.value().requires_grad_(lora);
    if (lora) trainable += p.value().numel();
  }
  return trainable;
}

bool has_adapter(const torch::nn::Module& module) { return find(module) != nullptr; }

LoraConfig adapter_config(torch::nn::Module& model) {
  const auto all = adapters_of(model);
  DTENSOR_CHECK(!all.empty(), "dtensor: LoRA: the model has no adapters");
  return all.front()->config;
}

void merge_adapter(torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  for (const auto& a : adapters_of(model)) {
    if (a->merged) continue;
    auto* linear = static_cast<nn::LinearImpl*>(a->base);
    auto local = [](const at::Tensor& t) { return is_dtensor(t) ? detail::local_tensor(t) : t; };
    at::Tensor w = local(linear->weight);
    // PEFT's get_delta_weight on CPU: B @ A in fp32, times scaling, cast to the weight's dtype, then added.
    const at::Tensor delta = (at::matmul(local(a->lora_B->weight).to(at::kFloat), local(a->lora_A->weight).to(at::kFloat)) *
                              a->config.scaling()).to(w.scalar_type());
    w.add_(delta);
    a->merged = true;
  }
}

void set_adapter_enabled(torch::nn::Module& model, bool enabled) {
  for (const auto& a : adapters_of(model)) a->enabled = enabled;
}

}  // namespace dtensor::peft
