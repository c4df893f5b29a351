#include "op_samples.h"

#include "harness/multi_rank.h"

namespace dtensor::testing {
namespace {

at::Tensor r(uint64_t seed, at::IntArrayRef shape) { return seeded_randn(seed, shape); }

OpSample unary(const std::string& name, std::function<at::Tensor(const at::Tensor&)> f, at::Tensor x, bool partial = true) {
  return {name, {x}, [f](const std::vector<at::Tensor>& a) { return f(a[0]); }, {true}, {true}, {partial}};
}

OpSample binary(const std::string& name, std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> f, at::Tensor a,
                at::Tensor b, std::vector<bool> grads = {true, true}) {
  return {name, {a, b}, [f](const std::vector<at::Tensor>& x) { return f(x[0], x[1]); }, grads, {true, true}, {true, true}};
}

}  // namespace

std::vector<OpSample> op_samples() {
  std::vector<OpSample> s;
  at::Tensor a = r(1, {6, 4}), b = r(2, {6, 4}), row = r(3, {4}), pos = r(4, {6, 4}).abs() + 0.5;
  // --- pointwise
  s.push_back(binary("add", [](auto& x, auto& y) { return at::add(x, y, 0.5); }, a, b));
  s.push_back(binary("add (broadcast)", [](auto& x, auto& y) { return x + y; }, a, row));
  s.push_back(binary("sub", [](auto& x, auto& y) { return x - y; }, a, b));
  s.push_back(binary("mul", [](auto& x, auto& y) { return x * y; }, a, b));
  s.push_back(binary("div", [](auto& x, auto& y) { return x / y; }, a, pos));
  s.push_back(binary("maximum", [](auto& x, auto& y) { return at::maximum(x, y); }, a, b));
  s.push_back(binary("minimum", [](auto& x, auto& y) { return at::minimum(x, y); }, a, b));
  s.push_back(unary("neg", [](auto& x) { return -x; }, a));
  s.push_back(unary("mul scalar", [](auto& x) { return x * 3.0; }, a));
  s.push_back(unary("add scalar", [](auto& x) { return x + 3.0; }, a));
  s.push_back(unary("exp", [](auto& x) { return at::exp(x); }, a));
  s.push_back(unary("log", [](auto& x) { return at::log(x); }, pos));
  s.push_back(unary("sqrt", [](auto& x) { return at::sqrt(x); }, pos));
  s.push_back(unary("rsqrt", [](auto& x) { return at::rsqrt(x); }, pos));
  s.push_back(unary("pow", [](auto& x) { return at::pow(x, 2.0); }, a));
  s.push_back(unary("abs", [](auto& x) { return at::abs(x); }, a));
  s.push_back(unary("silu", [](auto& x) { return at::silu(x); }, a));
  s.push_back(unary("gelu", [](auto& x) { return at::gelu(x); }, a));
  s.push_back(unary("relu", [](auto& x) { return at::relu(x); }, a));
  s.push_back(unary("sigmoid", [](auto& x) { return at::sigmoid(x); }, a));
  s.push_back(unary("tanh", [](auto& x) { return at::tanh(x); }, a));
  s.push_back(unary("clamp", [](auto& x) { return at::clamp(x, -0.5, 0.5); }, a));
  s.push_back(binary("where", [](auto& x, auto& y) { return at::where(x > 0, x, y); }, a, b));
  s.push_back(unary("masked_fill", [](auto& x) { return x.masked_fill(x > 0.3, 0.0); }, a));
  s.push_back(binary("lerp", [](auto& x, auto& y) { return at::lerp(x, y, 0.3); }, a, b));
  s.push_back({"addcmul", {a, b, pos}, [](auto& x) { return at::addcmul(x[0], x[1], x[2], 0.5); }, {true, true, true},
               {true, true, true}, {true, true, true}});
  s.push_back({"addcdiv", {a, b, pos}, [](auto& x) { return at::addcdiv(x[0], x[1], x[2], 0.5); }, {true, true, true},
               {true, true, true}, {true, true, true}});
  // --- matrix
  at::Tensor m = r(5, {6, 8}), w = r(6, {8, 4}), bias = r(7, {4});
  s.push_back(binary("mm", [](auto& x, auto& y) { return at::mm(x, y); }, m, w));
  s.push_back({"addmm", {bias, m, w}, [](auto& x) { return at::addmm(x[0], x[1], x[2]); }, {true, true, true},
               {true, true, true}, {true, true, true}});
  s.push_back(binary("bmm", [](auto& x, auto& y) { return at::bmm(x, y); }, r(8, {2, 6, 8}), r(9, {2, 8, 4})));
  s.push_back({"baddbmm", {r(10, {2, 6, 4}), r(8, {2, 6, 8}), r(9, {2, 8, 4})},
               [](auto& x) { return at::baddbmm(x[0], x[1], x[2]); }, {true, true, true}, {true, true, true},
               {true, true, true}});
  s.push_back({"linear (2-d)", {m, r(11, {4, 8}), bias}, [](auto& x) { return at::linear(x[0], x[1], x[2]); },
               {true, true, true}, {true, true, true}, {true, true, true}, true});
  s.push_back({"matmul (3-d x 2-d)", {r(12, {2, 6, 8}), w}, [](auto& x) { return at::matmul(x[0], x[1]); }, {true, true},
               {true, true}, {true, true}, true});
  s.push_back(unary("t", [](auto& x) { return x.t(); }, a));
  s.push_back(unary("transpose", [](auto& x) { return x.transpose(0, 1); }, r(13, {2, 6, 4})));
  // --- views and shape
  at::Tensor c = r(14, {4, 6, 2});
  s.push_back({"view (flatten)", {c}, [](auto& x) { return x[0].view({4, 12}); }, {true}, {true}, {true}, true});
  s.push_back({"reshape (split dim)", {c}, [](auto& x) { return x[0].reshape({2, 2, 6, 2}); }, {true}, {true}, {true}, true});
  s.push_back({"flatten", {c}, [](auto& x) { return x[0].flatten(0, 1); }, {true}, {true}, {true}, true});
  s.push_back({"unflatten", {c}, [](auto& x) { return x[0].unflatten(1, {2, 3}); }, {true}, {true}, {true}, true});
  s.push_back(unary("permute", [](auto& x) { return x.permute({2, 0, 1}); }, c));
  s.push_back(unary("unsqueeze", [](auto& x) { return x.unsqueeze(1); }, c));
  s.push_back(unary("squeeze", [](auto& x) { return x.squeeze(1); }, r(15, {4, 1, 6})));
  s.push_back(unary("expand", [](auto& x) { return x.expand({3, 6, 4}); }, r(16, {1, 6, 4})));
  s.push_back(unary("split", [](auto& x) { return at::split(x, 2, 1)[1]; }, c));
  s.push_back(unary("chunk", [](auto& x) { return at::chunk(x, 3, 1)[2]; }, c));
  s.push_back(binary("cat", [](auto& x, auto& y) { return at::cat({x, y}, 1); }, a, b));
  s.push_back(binary("stack", [](auto& x, auto& y) { return at::stack({x, y}, 1); }, a, b));
  s.push_back(unary("slice", [](auto& x) { return x.slice(1, 1, 5); }, c));
  s.push_back(unary("select", [](auto& x) { return x.select(1, 2); }, c));
  s.push_back(unary("narrow", [](auto& x) { return x.narrow(0, 1, 2); }, c));
  s.push_back(unary("contiguous", [](auto& x) { return x.transpose(0, 2).contiguous(); }, c));
  // --- reductions
  s.push_back(unary("sum", [](auto& x) { return x.sum(); }, a));
  s.push_back(unary("sum dim", [](auto& x) { return x.sum(1); }, c));
  s.push_back(unary("mean", [](auto& x) { return x.mean(); }, a));
  s.push_back(unary("mean dim", [](auto& x) { return x.mean({0}, true); }, c));
  s.push_back(unary("amax", [](auto& x) { return x.amax(1); }, c, false));
  s.push_back(unary("amin", [](auto& x) { return x.amin(0); }, c, false));
  s.push_back(unary("max dim", [](auto& x) { return std::get<0>(x.max(1)); }, c, false));
  s.push_back({"argmax", {c}, [](auto& x) { return x[0].argmax(1).to(at::kFloat); }, {false}, {true}, {false}});
  s.push_back(unary("vector norm", [](auto& x) { return at::linalg_vector_norm(x, 2, {1}); }, c));
  s.push_back(unary("norm", [](auto& x) { return x.norm(); }, a));
  s.push_back(unary("var", [](auto& x) { return x.var(1); }, c));
  // --- softmax, norms, attention, embedding, losses
  s.push_back(unary("softmax", [](auto& x) { return at::softmax(x, -1); }, c, false));
  s.push_back(unary("log_softmax", [](auto& x) { return at::log_softmax(x, 1); }, c, false));
  s.push_back({"layer_norm", {c, r(17, {2}), r(18, {2})},
               [](auto& x) { return at::layer_norm(x[0], {2}, x[1], x[2]); }, {true, true, true}, {true, false, false},
               {false, false, false}});
  s.push_back({"rms_norm", {c, r(19, {2})}, [](auto& x) { return at::rms_norm(x[0], {2}, x[1], 1e-6); }, {true, true},
               {true, false}, {false, false}});
  at::Tensor q = r(20, {2, 4, 6, 8}), k = r(21, {2, 4, 6, 8}), v = r(22, {2, 4, 6, 8});
  s.push_back({"scaled_dot_product_attention", {q, k, v},
               [](auto& x) { return at::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true); },
               {true, true, true}, {true, true, true}, {false, false, false}, false, 1e-4});
  at::Tensor ids = at::tensor({1, 7, 3, 0, 7, 9}, at::kLong).reshape({2, 3});
  s.push_back({"embedding", {r(23, {10, 4}), ids}, [](auto& x) { return at::embedding(x[0], x[1]); }, {true, false},
               {true, true}, {false, false}});
  // A paged KV cache's write: rows of the source at slots of dim 1 (that dim whole; the others pass).
  at::Tensor slots = at::tensor({5, 0, 2}, at::kLong);
  s.push_back({"index_copy", {r(25, {4, 6, 2}), r(26, {4, 3, 2})},
               [slots](auto& x) { return x[0].index_copy(1, slots, x[1]); }, {true, true}, {true, true}, {false, false}});
  s.push_back({"index_copy_", {r(25, {4, 6, 2}), r(26, {4, 3, 2})},
               [slots](auto& x) { return x[0].clone().index_copy_(1, slots, x[1]); }, {false, false}, {true, true},
               {false, false}, /*may_refuse=*/true});  // in place: self sharded on the slots dim cannot stay so
  at::Tensor logits = r(24, {8, 5});
  at::Tensor labels = at::tensor({0, 4, 2, 2, 1, 3, 0, 4}, at::kLong);
  s.push_back({"cross_entropy", {logits, labels},
               [](auto& x) { return at::cross_entropy_loss(x[0], x[1]); }, {true, false}, {true, true}, {false, false}});
  s.push_back({"nll_loss (sum)", {logits, labels},
               [](auto& x) { return at::nll_loss(at::log_softmax(x[0], 1), x[1], {}, at::Reduction::Sum); },
               {true, false}, {true, true}, {false, false}});
  s.push_back(unary("mse via mean", [](auto& x) { return (x - 1.0).pow(2).mean(); }, a));
  // --- factory-likes
  s.push_back({"zeros_like + add", {a}, [](auto& x) { return at::zeros_like(x[0]) + x[0]; }, {true}, {true}, {true}});
  s.push_back({"full_like", {a}, [](auto& x) { return at::full_like(x[0], 2.0) * x[0]; }, {true}, {true}, {true}});
  s.push_back({"clone", {a}, [](auto& x) { return x[0].clone(); }, {true}, {true}, {true}});
  s.push_back({"to double", {a}, [](auto& x) { return x[0].to(at::kDouble).to(at::kFloat); }, {true}, {true}, {true}});
  return s;
}

}  // namespace dtensor::testing
