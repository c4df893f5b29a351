#include "plan/matmul_flops.h"

#include <ATen/record_function.h>

#include <cstring>

#include "dtensor/api/dtensor_api.h"
#include "ops/output_meta.h"

namespace dtensor::detail {
namespace {

thread_local double* counting = nullptr;

const at::Tensor* tensor_arg(const c10::ArrayRef<const c10::IValue>& in, size_t i) {
  return i < in.size() && in[i].isTensor() ? &in[i].toTensor() : nullptr;
}

// FLOPs of one call by its schema name; 0 for anything else.
double flops_of(const char* name, const c10::ArrayRef<const c10::IValue>& in) {
  auto is = [&](const char* n) { return std::strcmp(name, n) == 0; };
  if (is("aten::mm") || is("aten::addmm") || is("aten::bmm") || is("aten::baddbmm") || is("aten::_scaled_mm")) {
    // mm(a, b) / bmm(a, b) / _scaled_mm(a, b, scales...): a [.., m, k] x b [.., k, n]; addmm(c, a, b) / baddbmm(c, a, b)
    const size_t first = is("aten::addmm") || is("aten::baddbmm") ? 1 : 0;
    const at::Tensor* a = tensor_arg(in, first);
    const at::Tensor* b = tensor_arg(in, first + 1);
    if (!a || !b || a->dim() < 2 || b->dim() < 2) return 0;
    const double batch = a->dim() == 3 ? static_cast<double>(a->size(0)) : 1.0;
    return 2.0 * batch * static_cast<double>(a->size(-2)) * static_cast<double>(a->size(-1)) *
           static_cast<double>(b->size(-1));
  }
  const bool forward = is("aten::_scaled_dot_product_flash_attention_for_cpu");
  const bool backward = is("aten::_scaled_dot_product_flash_attention_for_cpu_backward");
  if (forward || backward) {
    // forward(q, k, v, dropout_p, is_causal, ...); backward(grad_out, q, k, v, out, lse, dropout_p, is_causal, ...)
    const at::Tensor* q = tensor_arg(in, backward ? 1 : 0);
    const at::Tensor* k = tensor_arg(in, backward ? 2 : 1);
    const size_t causal_at = backward ? 7 : 4;
    if (!q || !k || q->dim() != 4) return 0;
    const bool causal = causal_at < in.size() && in[causal_at].isBool() && in[causal_at].toBool();
    // q k^T and (softmax) v: two products of [b, h, s_q, d] x [d, s_kv]
    double f = 4.0 * static_cast<double>(q->size(0) * q->size(1)) * static_cast<double>(q->size(2)) *
               static_cast<double>(k->size(2)) * static_cast<double>(q->size(3));
    if (causal) f /= 2;
    return backward ? 2 * f : f;
  }
  return 0;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!counting || ops::in_shape_inference()) return nullptr;
  const auto in = fn.inputs();
  for (const auto& v : in) {
    if (v.isTensor() && is_dtensor(v.toTensor())) return nullptr;  // the DTensor call; its local call counts
  }
  *counting += flops_of(fn.name(), in);
  return nullptr;
}

}  // namespace

MatmulFlopCounter::MatmulFlopCounter() : previous_(counting) {
  counting = &flops_;
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&on_enter).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

MatmulFlopCounter::~MatmulFlopCounter() {
  at::removeCallback(handle_);
  counting = previous_;
}

double MatmulFlopCounter::flops() const { return flops_; }

}  // namespace dtensor::detail
