// Meta kernels for ops LibTorch's C++ build lacks them for (PyTorch registers them in Python, in
// torch/_meta_registrations.py), so that a plan dry run (dtensor/plan/dry_run.h) can run the kernels a
// real CPU run runs on meta tensors. Shapes and layouts are the CPU kernels' outputs:
//   _scaled_dot_product_flash_attention_for_cpu(q [b, h, s, d], k, v [b, h_kv, s_kv, d_v], ...)
//       -> out [b, h, s, d_v] laid out as [b, s, h, d_v]; logsumexp [b, h, s] (float) laid out as [b, s, h]
//   ..._backward(grad_out, q, k, v, out, logsumexp, ...) -> grad_q, grad_k, grad_v shaped as q, k, v, laid
//       out as [b, s, h, d]
// The dispatch's global shape inference (ops/output_meta.h) does not use them: for these ops it keeps
// learning global shapes from the local outputs, as it did before they existed, so real runs are unchanged.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <tuple>

#include "ops/output_meta.h"

namespace dtensor::ops {
namespace {

void refuse_shape_inference(const char* op) {
  TORCH_CHECK(!in_shape_inference(), op, ": no meta kernel for global shape inference (learnt from the locals)");
}

// An uninitialized meta tensor of `shape` [b, h, s, d] whose memory runs in [b, s, h, d] order.
at::Tensor heads_inner(at::IntArrayRef shape, const at::TensorOptions& options) {
  return at::empty({shape[0], shape[2], shape[1], shape[3]}, options).transpose(1, 2);
}

std::tuple<at::Tensor, at::Tensor> flash_attention_cpu_meta(const at::Tensor& q, const at::Tensor&, const at::Tensor& v,
                                                            double, bool, const std::optional<at::Tensor>&,
                                                            std::optional<double>) {
  refuse_shape_inference("_scaled_dot_product_flash_attention_for_cpu");
  at::Tensor out = heads_inner({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat)).transpose(1, 2);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_cpu_backward_meta(
    const at::Tensor&, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor&,
    const at::Tensor&, double, bool, const std::optional<at::Tensor>&, std::optional<double>) {
  refuse_shape_inference("_scaled_dot_product_flash_attention_for_cpu_backward");
  return {heads_inner(q.sizes(), q.options()), heads_inner(k.sizes(), k.options()), heads_inner(v.sizes(), v.options())};
}

// index_select(self, dim, index): self's shape with dim's size index.numel() (the embedding lookup).
at::Tensor index_select_meta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  refuse_shape_inference("index_select");
  auto shape = self.sizes().vec();
  if (!shape.empty()) shape[c10::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return at::empty(shape, self.options());
}

// embedding_dense_backward(grad_output [..., d], indices, num_weights, ...) -> [num_weights, d]
at::Tensor embedding_dense_backward_meta(const at::Tensor& grad, const at::Tensor&, c10::SymInt num_weights, c10::SymInt,
                                         bool) {
  refuse_shape_inference("embedding_dense_backward");
  return at::empty({num_weights.expect_int(), grad.size(-1)}, grad.options());
}

// The one helper for pointwise ops: an uninitialized meta tensor of the inputs' broadcast shape
// (contiguous, as TensorIterator lays out a fresh output of contiguous inputs) of `dtype`.
at::Tensor broadcast_meta(std::initializer_list<at::Tensor> inputs, at::ScalarType dtype) {
  std::vector<int64_t> shape;
  for (const at::Tensor& t : inputs) shape = at::infer_size(shape, t.sizes());
  return at::empty(shape, inputs.begin()->options().dtype(dtype));
}

// An out= variant: `out` resized to the result's shape (as the CPU kernel's resize_output does).
at::Tensor& into(at::Tensor& out, const at::Tensor& result) {
  if (!out.sizes().equals(result.sizes())) out.resize_(result.sizes());
  return out;
}

// where.self(condition, self, other): the broadcast shape, the promoted dtype.
at::Tensor where_meta(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  refuse_shape_inference("where.self");
  return broadcast_meta({condition, self, other}, at::result_type(self, other));
}
at::Tensor& where_out_meta(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  refuse_shape_inference("where.self_out");
  return into(out, broadcast_meta({condition, self, other}, out.scalar_type()));
}

// logical_not.out(self, out): out's shape is self's, its dtype out's own (the functional form allocates a
// bool `out` and calls this).
at::Tensor& logical_not_out_meta(const at::Tensor& self, at::Tensor& out) {
  refuse_shape_inference("logical_not.out");
  return into(out, broadcast_meta({self}, out.scalar_type()));
}

// Float8 training's casts and matmul (dtensor/float8/float8_linear.h): abs.out (the functional abs allocates and calls
// it) keeps self's shape in out's dtype; max() is a 0-d tensor of self's dtype; _scaled_mm(a [m, k], b [k, n], ...) is
// [m, n] in out_dtype (default: a's).
at::Tensor& abs_out_meta(const at::Tensor& self, at::Tensor& out) {
  refuse_shape_inference("abs.out");
  return into(out, broadcast_meta({self}, out.scalar_type()));
}
at::Tensor max_meta(const at::Tensor& self) {
  refuse_shape_inference("max");
  return at::empty({}, self.options());
}
at::Tensor scaled_mm_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor&, const at::Tensor&,
                          const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                          std::optional<at::ScalarType> out_dtype, bool) {
  refuse_shape_inference("_scaled_mm");
  return at::empty({a.size(0), b.size(1)}, a.options().dtype(out_dtype.value_or(a.scalar_type())));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("abs.out", TORCH_FN(abs_out_meta));
  m.impl("max", TORCH_FN(max_meta));
  m.impl("_scaled_mm", TORCH_FN(scaled_mm_meta));
  m.impl("logical_not.out", TORCH_FN(logical_not_out_meta));
  m.impl("where.self", TORCH_FN(where_meta));
  m.impl("where.self_out", TORCH_FN(where_out_meta));
  m.impl("index_select", TORCH_FN(index_select_meta));
  m.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward_meta));
  m.impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(flash_attention_cpu_meta));
  m.impl("_scaled_dot_product_flash_attention_for_cpu_backward", TORCH_FN(flash_attention_cpu_backward_meta));
}

}  // namespace dtensor::ops
