#include "dtensor/tp/style.h"
#include "dtensor/core/error.h"

#include <torch/nn/modules/linear.h>

#include "dtensor/tp/distribute_module.h"
#include "dtensor/api/dtensor_api.h"
#include "tp/distribute_params.h"
#include "tp/style_support.h"

namespace dtensor {
namespace {

using namespace detail;
using ParamPlacements = std::vector<std::pair<std::string, Placements>>;  // parameter name -> placements

// Colwise and Rowwise split a Linear's or an Embedding's weight: dtensor::nn's (hooked), or LibTorch's own
// with the layouts propagation gives by itself.
void require_linear_or_embedding(const torch::nn::Module& m, const std::string& style, const std::string& path,
                                 const Placement& input_layouts, const Placement& output_layouts) {
  DTENSOR_CHECK(is_linear(m) || is_embedding(m), not_applicable(style, "Linear and Embedding", path, m));
  require_stock_layouts(m, style, path, input_layouts, output_layouts);  // after the type check, whose error comes first
}

// partition_fn: the parameters registered on each (sub)module get these placements (absent ones skipped).
PartitionFn partition_params(ParamPlacements placements, std::optional<int> src) {
  return [placements = std::move(placements), src](const std::string&, torch::nn::Module& m, const DeviceMesh& mesh) {
    distribute_params(m, mesh, placements, src);
  };
}

// Colwise / Rowwise on a stock layer: its parameters become DTensors and that is all. Its forward runs no hooks;
// its ops propagate from the parameters' placements and the DTensors that reach it (the root's inputs made
// DTensors by Parallelized, parallelized.h). Returns whether `m` was one.
bool place_stock_params(torch::nn::Module& m, const DeviceMesh& mesh, ParamPlacements placements,
                        std::optional<int> src) {
  if (!is_stock_layer(m)) return false;
  distribute_module(m, mesh, partition_params(std::move(placements), src), nullptr, nullptr, src);
  return true;
}

// input_fn: the first positional input arrives as `layout` and is moved to `desired`; the rest pass through.
// With `in_features_of` (a Rowwise Linear, `path`), an input sharded on its last dim has the weight's
// in_features there globally, so Colwise -> Rowwise works for uneven features (10 over 4 ranks: 3, 3, 3, 1),
// where assuming even shards would give each rank a different global shape.
InputFn first_input_to(const std::string& style, Placement layout, Placement desired, const std::string& path = "",
                       bool in_features_of = false) {
  const std::string what = style + " on '" + path + "'";
  return [=](torch::nn::Module& m, nn::Args args, nn::KwArgs kwargs, const DeviceMesh& mesh) {
    at::Tensor& x = first_tensor_input(args, style);
    std::optional<int64_t> sharded_size;
    if (in_features_of && !is_dtensor(x) && x.dim() > 0 && layout.is_shard() &&
        layout.normalized(x.dim()).dim() == x.dim() - 1) {
      // A Linear (apply checked): its options, not its weight, which a quantized layer stores packed (int4: K / 2).
      sharded_size = static_cast<torch::nn::LinearImpl&>(m).options.in_features();
    }
    x = prepare_input(x, mesh, layout, desired, sharded_size, what);
    return std::make_pair(std::move(args), std::move(kwargs));
  };
}

// output_fn: the output moved to `desired` (none: left as it is) and made local when asked.
OutputFn output_to(std::optional<Placement> desired, bool use_local) {
  return [=](torch::nn::Module&, c10::IValue out, const DeviceMesh& mesh) -> c10::IValue {
    const at::Tensor& y = out.toTensor();
    if (desired) return prepare_output(y, mesh, *desired, use_local);
    return use_local && is_dtensor(y) ? to_local(y) : y;
  };
}

// PrepareModuleInput's checks (PyTorch's asserts, with the path).
void check_input_layouts(const std::string& style, const std::string& path, const PrepareModuleInputOptions& o) {
  DTENSOR_CHECK(o.input_layouts.size() == o.desired_input_layouts.size(), "dtensor: ", style, " for '", path,
                "': input_layouts has ", o.input_layouts.size(), " entries but desired_input_layouts has ",
                o.desired_input_layouts.size(), "; they must have the same length");
  for (size_t k = 0; k < o.input_layouts.size(); ++k) {
    DTENSOR_CHECK(o.input_layouts[k] || !o.desired_input_layouts[k], "dtensor: ", style, " for '", path, "': input ",
                  k, " has a desired layout ", o.desired_input_layouts[k]->to_string(), " but no input layout");
  }
  for (const auto& [name, p] : o.desired_input_kwarg_layouts) {
    DTENSOR_CHECK(o.input_kwarg_layouts.contains(name), "dtensor: ", style, " for '", path, "': keyword input '",
                  name, "' has a desired layout ", p.to_string(), " but no input_kwarg_layouts entry");
  }
}

void check_output_layouts(const std::string& style, const std::string& path, const PrepareModuleOutputOptions& o) {
  DTENSOR_CHECK(o.output_layouts.size() == o.desired_output_layouts.size(), "dtensor: ", style, " for '", path,
                "': output_layouts has ", o.output_layouts.size(), " entries but desired_output_layouts has ",
                o.desired_output_layouts.size(), "; they must have the same length");
}

// PrepareModuleInput's input_fn: each input with a layout (positional by index, keyword by name) is moved to
// its desired layout; every other input passes through.
InputFn prepare_inputs(const std::string& style, const std::string& path, PrepareModuleInputOptions o) {
  return [=](torch::nn::Module&, nn::Args args, nn::KwArgs kwargs, const DeviceMesh& mesh) {
    const std::string where = style + " for '" + path + "': ";
    if (!o.input_layouts.empty()) {
      DTENSOR_CHECK(args.size() == o.input_layouts.size(), "dtensor: ", where, "the module got ", args.size(),
                    " positional inputs but input_layouts has ", o.input_layouts.size(),
                    " (module inputs and input_layouts should have same length)");
      for (size_t k = 0; k < args.size(); ++k) {
        if (!o.input_layouts[k]) continue;
        const Placement& layout = *o.input_layouts[k];
        args[k] = prepare_input_value(args[k], mesh, layout, o.desired_input_layouts[k].value_or(layout),
                                      o.use_local_output, where + "input " + std::to_string(k));
      }
    }
    for (auto& [name, value] : kwargs) {
      auto layout = o.input_kwarg_layouts.find(name);
      if (layout == o.input_kwarg_layouts.end()) continue;
      auto want = o.desired_input_kwarg_layouts.find(name);
      value = prepare_input_value(value, mesh, layout->second,
                                  want == o.desired_input_kwarg_layouts.end() ? layout->second : want->second,
                                  o.use_local_output, where + "keyword input '" + name + "'");
    }
    return std::make_pair(std::move(args), std::move(kwargs));
  };
}

// PrepareModuleOutput's output_fn: one output, or each element of a tuple or list, with its own layouts.
OutputFn prepare_outputs(const std::string& style, const std::string& path, PrepareModuleOutputOptions o) {
  return [=](torch::nn::Module&, c10::IValue out, const DeviceMesh& mesh) -> c10::IValue {
    auto prepare = [&](const c10::IValue& value, size_t k) -> c10::IValue {
      if (!o.output_layouts[k]) return value;
      DTENSOR_CHECK(value.isTensor(), "dtensor: ", style, " for '", path, "': output ", k, " has a layout but is a ",
                    value.tagKind(), ", not a tensor");
      const at::Tensor& y = value.toTensor();
      at::Tensor dt = is_dtensor(y) ? y : DTensor::from_local(y, mesh, {*o.output_layouts[k]});
      return prepare_output(dt, mesh, o.desired_output_layouts[k].value_or(*o.output_layouts[k]), o.use_local_output);
    };
    const bool is_tuple = out.isTuple();
    std::vector<c10::IValue> outputs = is_tuple ? out.toTupleRef().elements().vec()
                                       : out.isList() ? out.toListRef().vec()
                                                      : std::vector<c10::IValue>{out};
    DTENSOR_CHECK(outputs.size() == o.output_layouts.size(), "dtensor: ", style, " for '", path, "': the module gave ",
                  outputs.size(), " outputs but output_layouts has ", o.output_layouts.size(),
                  " (module outputs and output_layouts should have same length)");
    for (size_t k = 0; k < outputs.size(); ++k) outputs[k] = prepare(outputs[k], k);
    if (is_tuple) return c10::ivalue::Tuple::create(std::move(outputs));
    if (out.isList()) {
      c10::List<c10::IValue> list(out.toList().elementType());
      for (auto& v : outputs) list.push_back(std::move(v));
      return list;
    }
    return outputs[0];
  };
}

}  // namespace

void ColwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  require_linear_or_embedding(m, name(), path, input_layouts, output_layouts);
}

void ColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                            std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  // Linear y = x W^T + b, W [out, in]: W Shard(0) and b Shard(0) give each rank its output features.
  // Embedding W [vocab, dim]: Shard(1) gives each rank its slice of every embedding.
  auto placements = is_linear(m) ? ParamPlacements{{"weight", {Shard(0)}}, {"bias", {Shard(0)}}}
                                 : ParamPlacements{{"weight", {Shard(1)}}};
  if (place_stock_params(m, mesh, placements, src)) return;
  // Input: input_layouts -> Replicate (an all-gather if it arrives sharded). Output: Shard(-1), no
  // communication, -> output_layouts.
  distribute_module(m, mesh, partition_params(std::move(placements), src), first_input_to(name(), input_layouts, Replicate()),
                    output_to(output_layouts, use_local_output), src);
}

void RowwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  require_linear_or_embedding(m, name(), path, input_layouts, output_layouts);
}

void RowwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                            std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  // Linear W [out, in]: Shard(1) gives each rank its input features; the input must be Shard(-1) to match,
  // and b is Replicate (added once, to the reduced sum). Embedding W [vocab, dim]: Shard(0), each rank
  // looks up the ids it owns (zeros elsewhere) from the whole input.
  const bool linear = is_linear(m);
  auto placements = linear ? ParamPlacements{{"weight", {Shard(1)}}, {"bias", {Replicate()}}} : ParamPlacements{{"weight", {Shard(0)}}};
  if (place_stock_params(m, mesh, placements, src)) return;
  // The output is Partial: to Replicate = all-reduce, to Shard(d) = reduce-scatter.
  distribute_module(m, mesh, partition_params(std::move(placements), src),
                    first_input_to(name(), input_layouts, linear ? Shard(-1) : Replicate(), path, linear),
                    output_to(output_layouts, use_local_output), src);
}

void SequenceParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
}

void SequenceParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                             std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  // Parameters Replicate (distribute_module's default); input -> Shard(sequence_dim), where a norm or a
  // dropout computes each position on its own; the output stays Shard(sequence_dim).
  const Placement seq = Shard(sequence_dim);
  distribute_module(m, mesh, nullptr, first_input_to(name(), seq, seq), output_to(std::nullopt, use_local_output), src);
}

void ReplicateParallel::apply(torch::nn::Module& m, const std::string&, const DeviceMesh& mesh,
                              std::optional<int> src) const {
  require_1d(mesh, name());
  distribute_module(m, mesh, nullptr, nullptr, nullptr, src);  // everything Replicate, no hooks
}

void PrepareModuleInput::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
  check_input_layouts(name(), path, *this);
}

void PrepareModuleInput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                               std::optional<int>) const {
  require_1d(mesh, name());
  validate(m, path);
  if (input_layouts.empty() && input_kwarg_layouts.empty()) return;
  register_module_io(m, mesh, prepare_inputs(name(), path, *this), nullptr);
}

void PrepareModuleOutput::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
  check_output_layouts(name(), path, *this);
}

void PrepareModuleOutput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                std::optional<int>) const {
  require_1d(mesh, name());
  validate(m, path);
  register_module_io(m, mesh, nullptr, prepare_outputs(name(), path, *this));
}

void PrepareModuleInputOutput::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
  check_input_layouts(name(), path, input_style());
  check_output_layouts(name(), path, output_style());
}

PrepareModuleInput PrepareModuleInputOutput::input_style() const {
  return PrepareModuleInput({.input_layouts = input_layouts,
                             .desired_input_layouts = desired_input_layouts,
                             .input_kwarg_layouts = input_kwarg_layouts,
                             .desired_input_kwarg_layouts = desired_input_kwarg_layouts,
                             .use_local_output = use_local_input});
}

PrepareModuleOutput PrepareModuleInputOutput::output_style() const {
  return PrepareModuleOutput({.output_layouts = output_layouts,
                              .desired_output_layouts = desired_output_layouts,
                              .use_local_output = use_local_output});
}

void PrepareModuleInputOutput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                     std::optional<int> src) const {
  validate(m, path);  // with this style's name in the errors
  input_style().apply(m, path, mesh, src);
  output_style().apply(m, path, mesh, src);
}

}  // namespace dtensor
