// Float8 Linear layers (include/dtensor/float8/float8_linear.h): the scaled casts, the float8 matmul as one autograd
// function over local tensors, and the forward override a converted layer runs.
#include "dtensor/float8/float8_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/layers.h"
#include "float8/float8_matmul.h"
#include "mesh/autograd_comm_scope.h"
#include "nn/forward_override.h"

namespace dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The process groups (as their addresses: groups live in their World's cache) that shard a local operand's dims.
// An amax over a sharded dim is all-reduced (MAX) over them, so that every shard uses the global scale.
using Groups = std::vector<int64_t>;

struct OperandGroups {
  Groups dim0, dim1;
};

// x [M, K], w [N, K], grad_output g [M, N].
struct MatmulGroups {
  OperandGroups x, w, g;
};

Groups both(const OperandGroups& o) {
  Groups all = o.dim0;
  for (int64_t g : o.dim1) {
    if (std::find(all.begin(), all.end(), g) == all.end()) all.push_back(g);
  }
  return all;
}

at::Tensor global_amax(at::Tensor amax, const Groups& groups) {
  for (int64_t g : groups) amax = all_reduce(amax, ReduceOp::MAX, *reinterpret_cast<ProcessGroup*>(g));
  return amax;
}

struct Scaled {
  at::Tensor data;       // float8
  at::Tensor inv_scale;  // what _scaled_mm multiplies by: 1 / scale
};

// `hp` [R, C] in float8 `dtype`. Tensorwise: one scale from the amax over both dims. Rowwise along `dim` (the
// matmul's reduction dim): one scale per index of the other dim, from the amax over `dim`, a power of two.
Scaled scale_operand(const at::Tensor& hp, at::ScalarType dtype, Float8Recipe recipe, int64_t dim, const OperandGroups& g) {
  const bool rowwise = recipe == Float8Recipe::rowwise;
  at::Tensor amax = float8::abs_max(hp, rowwise ? std::optional<int64_t>(dim) : std::nullopt);
  amax = global_amax(amax.to(at::kFloat), rowwise ? (dim == 0 ? g.dim0 : g.dim1) : both(g));
  const at::Tensor scale = float8::amax_to_scale(amax, dtype, rowwise);
  return {float8::cast(hp, scale, dtype), scale.reciprocal()};
}

void save_groups(AutogradContext* ctx, const MatmulGroups& g) {
  ctx->saved_data["x0"] = g.x.dim0, ctx->saved_data["x1"] = g.x.dim1;
  ctx->saved_data["w0"] = g.w.dim0, ctx->saved_data["w1"] = g.w.dim1;
  ctx->saved_data["g0"] = g.g.dim0, ctx->saved_data["g1"] = g.g.dim1;
}

MatmulGroups load_groups(AutogradContext* ctx) {
  auto list = [&](const char* k) { return ctx->saved_data[k].toIntVector(); };
  return {{list("x0"), list("x1")}, {list("w0"), list("w1")}, {list("g0"), list("g1")}};
}

// y = x @ w^T in float8 over 2-D locals: x [M, K], w [N, K] -> [M, N] in x's dtype. Tensorwise keeps the forward's
// float8 operands for backward (the same scales); rowwise keeps x and w, which backward scales along M and N.
struct Float8Matmul : torch::autograd::Function<Float8Matmul> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t recipe,
                            int64_t matmul, const MatmulGroups& groups) {
    const auto r = static_cast<Float8Recipe>(recipe);
    const auto kind = static_cast<Float8MatmulKind>(matmul);
    const Scaled xs = scale_operand(x, at::kFloat8_e4m3fn, r, 1, groups.x);
    const Scaled ws = scale_operand(w, at::kFloat8_e4m3fn, r, 1, groups.w);
    // rowwise: x's scales [M, 1] are a's rows, w's [N, 1] are b's columns ([1, N]).
    const at::Tensor inv_b = r == Float8Recipe::rowwise ? ws.inv_scale.t() : ws.inv_scale;
    at::Tensor y = float8::matmul(kind, xs.data, ws.data.t(), xs.inv_scale, inv_b, x.scalar_type());
    ctx->saved_data["recipe"] = recipe;
    ctx->saved_data["matmul"] = matmul;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    save_groups(ctx, groups);
    detail::save_comm_scope(ctx);
    if (r == Float8Recipe::tensorwise) {
      ctx->save_for_backward({xs.data, xs.inv_scale, ws.data, ws.inv_scale});
    } else {
      ctx->save_for_backward({x, w});
    }
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto scope = detail::restore_comm_scope(ctx);
    const auto r = static_cast<Float8Recipe>(ctx->saved_data["recipe"].toInt());
    const auto kind = static_cast<Float8MatmulKind>(ctx->saved_data["matmul"].toInt());
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const MatmulGroups groups = load_groups(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    at::Tensor gx, gw;
    if (r == Float8Recipe::tensorwise) {
      // The gradient in e5m2 (wider range, fewer mantissa bits), one scale for both products.
      const Scaled gs = scale_operand(g, at::kFloat8_e5m2, r, 1, groups.g);
      gx = float8::matmul(kind, gs.data, float8::column_major(saved[2]), gs.inv_scale, saved[3], x_dtype);      // g @ w
      gw = float8::matmul(kind, gs.data.t(), float8::column_major(saved[0]), gs.inv_scale, saved[1], w_dtype);  // g^T @ x
    } else {
      const at::Tensor &x = saved[0], &w = saved[1];
      // grad_input = g @ w: reduced over N (g's dim 1, w's dim 0).
      const Scaled g_n = scale_operand(g, at::kFloat8_e4m3fn, r, 1, groups.g);
      const Scaled w_n = scale_operand(w, at::kFloat8_e4m3fn, r, 0, groups.w);
      gx = float8::matmul(kind, g_n.data, float8::column_major(w_n.data), g_n.inv_scale, w_n.inv_scale, x_dtype);
      // grad_weight = g^T @ x: reduced over M (dim 0 of both); g's column scales [1, N] are a's rows ([N, 1]).
      const Scaled g_m = scale_operand(g, at::kFloat8_e4m3fn, r, 0, groups.g);
      const Scaled x_m = scale_operand(x, at::kFloat8_e4m3fn, r, 0, groups.x);
      gw = float8::matmul(kind, g_m.data.t(), float8::column_major(x_m.data), g_m.inv_scale.t(), x_m.inv_scale,
                          w_dtype);
    }
    return {gx, gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// [..., K] x [N, K] on local tensors. `key`: the layer's shape class where the ranks of `agree` (every mesh dim's
// group) must pick one matmul kind (see float8::resolve).
at::Tensor local_float8_linear(const at::Tensor& x, const at::Tensor& w, const Float8LinearConfig& config,
                               const MatmulGroups& groups, const std::string& key = {},
                               const std::vector<ProcessGroup*>& agree = {}) {
  DTENSOR_CHECK(x.size(-1) == w.size(1), "dtensor: float8 linear: input's last dim ", x.size(-1), " != weight's in_features ",
                w.size(1));
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = w.size(0);
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  const Float8MatmulKind kind = float8::resolve(config.matmul, x2.size(0), x2.size(1), w.size(0), x.options(), key, agree);
  const at::Tensor y = Float8Matmul::apply(x2, w, static_cast<int64_t>(config.recipe), static_cast<int64_t>(kind), groups);
  return y.reshape(out_shape);
}

// A converted layer on DTensors: the local float8 matmul on the shards of the layouts the TP styles give (see the
// header), the amaxes of sharded reduced dims all-reduced. Placement algebra per mesh dim (x, w -> y; grads):
//   (Replicate, Shard(0))  -> Shard(-1)   grad_x Partial (a sum over the output shards), grad_w Shard(0)
//   (Shard(-1), Shard(1))  -> Partial     grad_x Shard(-1), grad_w Shard(1)
//   (Replicate, Replicate) -> Replicate   grad_x Replicate, grad_w Replicate
//   (Shard(d), Replicate)  -> Shard(d)    d a batch dim; grad_x Shard(d), grad_w Partial
at::Tensor dtensor_float8_linear(const at::Tensor& x, const at::Tensor& w, const Float8LinearConfig& config) {
  DTENSOR_CHECK(is_dtensor(x) && is_dtensor(w), "dtensor: float8 linear: the input and the weight must both be DTensors ",
                "or both plain tensors (input ", is_dtensor(x) ? "DTensor" : "plain", ", weight ",
                is_dtensor(w) ? "DTensor" : "plain", ")");
  const DeviceMesh mesh = device_mesh(x);
  const Placements px = placements(x), pw = placements(w);
  const int64_t last = x.dim() - 1;
  Placements py, gx, gw;
  MatmulGroups groups;
  std::vector<ProcessGroup*> agree;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    ProcessGroup& pg = mesh.get_group(i);
    agree.push_back(&pg);
    const int64_t group = static_cast<int64_t>(reinterpret_cast<intptr_t>(&pg));
    const Placement &a = px[i], &b = pw[i];
    auto shard_dim = [&](const Placement& p) { return p.is_shard() ? (p.dim() < 0 ? p.dim() + x.dim() : p.dim()) : -1; };
    if (a.is_replicate() && b.is_shard() && b.dim() == 0) {
      groups.w.dim0.push_back(group), groups.g.dim1.push_back(group);
      py.push_back(Shard(last)), gx.push_back(Partial()), gw.push_back(b);
    } else if (a.is_shard() && shard_dim(a) == last && b.is_shard() && b.dim() == 1) {
      groups.x.dim1.push_back(group), groups.w.dim1.push_back(group);
      py.push_back(Partial()), gx.push_back(a), gw.push_back(b);
    } else if (a.is_replicate() && b.is_replicate()) {
      py.push_back(Replicate()), gx.push_back(a), gw.push_back(b);
    } else if (a.is_shard() && shard_dim(a) < last && b.is_replicate()) {
      groups.x.dim0.push_back(group), groups.g.dim0.push_back(group);
      py.push_back(a), gx.push_back(a), gw.push_back(Partial());
    } else {
      throw DTENSOR_ERROR("dtensor: float8 linear: input ", to_string(px), " with weight ", to_string(pw),
                          " is not a layout float8 supports (ColwiseParallel's, RowwiseParallel's, or replicated "
                          "weights)");
    }
  }
  // The shape class every rank of the mesh names alike: the global shapes and the layout.
  const std::string key = std::to_string(x.numel() / std::max<int64_t>(1, x.size(-1))) + "x" + std::to_string(x.size(-1)) +
                          "x" + std::to_string(w.size(0)) + " " + to_string(px) + " " + to_string(pw);
  const at::Tensor y = local_float8_linear(to_local(x, gx), to_local(w, gw), config, groups, key, agree);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return DTensor::from_local(y, mesh, py, /*run_check=*/false, shape);
}

// Converted layers, weakly (a dead model's entries expire).
std::mutex registry_mu;
std::vector<std::weak_ptr<torch::nn::Module>> converted;

}  // namespace

std::string to_string(Float8Recipe recipe) { return recipe == Float8Recipe::rowwise ? "rowwise" : "tensorwise"; }

Float8Recipe float8_recipe_from_string(const std::string& name) {
  if (name == "tensorwise") return Float8Recipe::tensorwise;
  if (name == "rowwise") return Float8Recipe::rowwise;
  throw DTENSOR_ERROR("dtensor: float8 recipe '", name, "' is not tensorwise or rowwise");
}

namespace float8 {
namespace detail {
// src/float8/cast_avx2.cpp: the first values of `in` (fp32, or bf16 bits) cast with one scale, 8 a step, up to the
// first step that holds a NaN; returns how many.
int64_t cast_avx2(const void* in, bool bf16_in, int64_t n, float scale, bool e4m3, uint8_t* out);
}  // namespace detail

namespace {

// The reference's arithmetic for one value: fp32 product, clamp (a NaN stays NaN), c10's conversion.
template <typename Float8>
uint8_t cast_one(float v, float scale, float max) {
  v *= scale;
  if (!std::isnan(v)) v = std::min(std::max(v, -max), max);
  return Float8(v).x;
}

// One scale, a dense fp32 or bf16 tensor on the CPU: one pass (cast_avx2.cpp), the reference for what it leaves.
at::Tensor cast_fused(const at::Tensor& hp, float scale, float max, at::ScalarType dtype) {
  at::Tensor out = at::empty_strided(hp.sizes(), hp.strides(), hp.options().dtype(dtype));
  const bool bf16 = hp.scalar_type() == at::kBFloat16, e4m3 = dtype == at::kFloat8_e4m3fn;
  const auto* in = static_cast<const char*>(hp.data_ptr());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  const int64_t elem = bf16 ? 2 : 4;
  at::parallel_for(0, hp.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e;) {
      i += detail::cast_avx2(in + i * elem, bf16, e - i, scale, e4m3, o + i);
      if (i == e) break;
      // A NaN in the next step (or the last few values): one value by the reference, then the kernel again.
      const float v = bf16 ? static_cast<float>(reinterpret_cast<const at::BFloat16*>(in)[i])
                           : reinterpret_cast<const float*>(in)[i];
      o[i] = e4m3 ? cast_one<c10::Float8_e4m3fn>(v, scale, max) : cast_one<c10::Float8_e5m2>(v, scale, max);
      ++i;
    }
  });
  return out;
}

}  // namespace

at::Tensor cast(const at::Tensor& hp, const at::Tensor& scale, at::ScalarType dtype) {
  const double max = dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
  if (has_vector_casts() && fast_kernels_enabled() && hp.device().is_cpu() && scale.numel() == 1 &&
      (hp.scalar_type() == at::kFloat || hp.scalar_type() == at::kBFloat16) && hp.is_non_overlapping_and_dense()) {
    return cast_fused(hp, scale.item<float>(), static_cast<float>(max), dtype);
  }
  // One fp32 buffer scaled and clamped in place, then the float8 one: fresh buffers cost page faults on a CPU (a
  // product, a clamp and a cast each allocating made the cast 5x slower than its arithmetic).
  at::Tensor f = hp.scalar_type() == at::kFloat ? hp.clone() : hp.to(at::kFloat);
  return f.mul_(scale).clamp_(-max, max).to(dtype);
}

at::Tensor abs_max(const at::Tensor& hp, std::optional<int64_t> dim) {
  // max(|min|, |max|) from one pass that allocates nothing of hp's size (abs() would copy it first).
  if (!dim) {
    const auto [lo, hi] = at::aminmax(hp);
    return at::maximum(lo.neg(), hi);
  }
  const auto [lo, hi] = at::aminmax(hp, *dim, /*keepdim=*/true);
  return at::maximum(lo.neg(), hi);
}

at::Tensor amax_to_scale(const at::Tensor& amax, at::ScalarType dtype, bool power_of_two) {
  const double max = dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
  // In float64, then fp32, as torchao's amax_to_scale.
  at::Tensor scale = (max / amax.to(at::kDouble).clamp_min(1e-12)).to(at::kFloat);
  return power_of_two ? at::exp2(at::floor(at::log2(scale))) : scale;
}

}  // namespace float8

at::Tensor float8_linear(const at::Tensor& input, const at::Tensor& weight, const Float8LinearConfig& config) {
  if (is_dtensor(input) || is_dtensor(weight)) return dtensor_float8_linear(input, weight, config);
  return local_float8_linear(input, weight, config, {});
}

bool default_float8_filter(const std::string& fqn, torch::nn::Module&) {
  const std::string leaf = fqn.substr(fqn.rfind('.') + 1);
  return leaf != "lm_head" && leaf != "output" && leaf != "gate";
}

bool is_float8_linear(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mu);
  return std::any_of(converted.begin(), converted.end(), [&](const auto& w) { return w.lock().get() == &module; });
}

std::vector<std::string> convert_to_float8_training(torch::nn::Module& module, const Float8LinearConfig& config,
                                                    const Float8ModuleFilter& filter) {
  std::vector<std::pair<std::string, nn::LinearImpl*>> chosen;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    auto* linear = dynamic_cast<nn::LinearImpl*>(item.value().get());
    if (linear == nullptr || is_float8_linear(*linear) || (filter && !filter(item.key(), *linear))) continue;
    const auto& o = linear->options;
    DTENSOR_CHECK(o.in_features() % 16 == 0 && o.out_features() % 16 == 0, "dtensor: convert_to_float8_training: '",
                  item.key(), "' is ", o.in_features(), " -> ", o.out_features(),
                  ": float8 matmuls need in_features and out_features divisible by 16 (leave it out with the filter)");
    DTENSOR_CHECK(!nn::detail::has_forward_override(*linear), "dtensor: convert_to_float8_training: '", item.key(),
                  "' already computes through another override (async TP's fused matmuls); float8 does not compose "
                  "with it");
    chosen.emplace_back(item.key(), linear);
  }
  std::vector<std::string> names;
  for (auto& [name, linear] : chosen) {
    nn::detail::register_forward_override(*linear, [config](torch::nn::Module& m, const nn::Args& args,
                                                            const nn::KwArgs&) -> std::optional<c10::IValue> {
      auto& l = static_cast<nn::LinearImpl&>(m);
      at::Tensor y = float8_linear(args.at(0).toTensor(), l.weight, config);
      if (l.bias.defined()) y = y + l.bias;
      return c10::IValue(y);
    });
    std::lock_guard<std::mutex> lock(registry_mu);
    std::erase_if(converted, [](const auto& w) { return w.expired(); });
    converted.push_back(linear->shared_from_this());
    names.push_back(name);
  }
  return names;
}

}  // namespace dtensor
