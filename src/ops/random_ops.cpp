// Random ops on DTensors (PyTorch's _random.py): bernoulli_ (dropout's mask), uniform_, normal_.
//
// One stream draws the global tensor: every rank seeds a generator with (seed, call counter), draws the
// values of the whole global shape, and keeps its shard. Replicas therefore hold the same values (the same
// dropout mask where a tensor is replicated) and shards disjoint parts of one draw, so the result does not
// depend on how the tensor is sharded. The cost is generating the global tensor on every rank (a naive but
// obviously-consistent scheme; an offset-based generator that draws only the shard is the fast path to
// come). Partial tensors are refused: a random value is not a term of a sum.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "dtensor/ops/dispatch_options.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/api/dtensor_api.h"
#include "ops/op_call.h"
#include "ops/op_table.h"
#include "tensor/dtensor_impl.h"

namespace dtensor {

namespace {
thread_local uint64_t rng_seed = 20240101;
thread_local uint64_t rng_counter = 0;
}  // namespace

void manual_seed(uint64_t seed) {
  rng_seed = seed;
  rng_counter = 0;
}

namespace ops {
namespace {

void random_in_place(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  c10::IValue self_v = (*stack)[stack->size() - n];
  const at::Tensor& self = self_v.toTensor();
  const DTensorSpec& spec = dtensor_spec(self);
  if (spec.has_partial()) fail(op, *stack, "cannot fill a Partial DTensor with random values");
  for (size_t i = 1; i < n; ++i) {
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    if (v.isTensor() && is_dtensor(v.toTensor())) fail(op, *stack, "with DTensor probabilities is not supported");
  }
  // Draw the global tensor from the shared stream.
  // On the local tensor's device: a CUDA draw runs on the GPU from a CUDA generator seeded the same way (its
  // values differ from the CPU stream's, as PyTorch's do, but agree across the ranks of one device type).
  const uint64_t seed = rng_seed * 1000003ULL + rng_counter++;
  at::Generator gen = self.is_cuda() ? at::detail::getCUDAHooks().getNewGenerator(self.device().index())
                                     : at::make_generator<at::CPUGeneratorImpl>(seed);
  gen.set_current_seed(seed);
  at::Tensor global = at::empty(spec.meta.shape, self.options().device(self.is_cuda() ? self.device() : at::Device(at::kCPU)));
  torch::jit::Stack draw;
  draw.emplace_back(global);
  for (size_t i = 1; i < n; ++i) {
    const auto& arg = op.schema().arguments()[i];
    draw.push_back(arg.name() == "generator" ? c10::IValue(gen) : (*stack)[stack->size() - n + i]);
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(&draw);
  }
  DTensorSpec replicated(spec.mesh, Placements(spec.mesh.ndim(), Replicate()), spec.meta);
  at::Tensor shard = redistribute_local(global, replicated, spec.placements);
  detail::local_tensor(self).copy_(shard);
  torch::jit::drop(*stack, n);
  stack->push_back(self_v);
}

// native_dropout(input, p, train) -> (output, mask): CUDA's fused dropout (CPU decomposes dropout into
// bernoulli_ and mul). On DTensors it is that decomposition: the keep mask is drawn from the one stream above
// in the input's placements, output = input * keep / (1 - p). Partial inputs are refused by bernoulli_.
void native_dropout(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const at::Tensor input = (*stack)[stack->size() - 3].toTensor();
  const double p = (*stack)[stack->size() - 2].toDouble();
  const c10::IValue train = (*stack)[stack->size() - 1];
  torch::jit::drop(*stack, 3);
  at::Tensor output, mask;
  if (!train.isNone() && !train.toBool()) {
    output = input.clone();
    mask = at::ones_like(input, input.options().dtype(at::kBool));
  } else {
    at::Tensor keep = at::empty_like(input).bernoulli_(1.0 - p);
    output = p >= 1.0 ? input * 0.0 : input * keep * (1.0 / (1.0 - p));
    mask = keep.to(at::kBool);
  }
  stack->emplace_back(output);
  stack->emplace_back(mask);
}

// native_dropout_backward(grad_output, mask, scale) = grad_output * mask * scale: pointwise DTensor ops.
void native_dropout_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const at::Tensor grad = (*stack)[stack->size() - 3].toTensor();
  const at::Tensor mask = (*stack)[stack->size() - 2].toTensor();
  const double scale = (*stack)[stack->size() - 1].toDouble();
  torch::jit::drop(*stack, 3);
  stack->emplace_back(grad * mask.to(grad.scalar_type()) * scale);
}

const CustomHandlerRegistration random_op_rules[] = {
    {"aten::native_dropout", &native_dropout},
    {"aten::native_dropout_backward", &native_dropout_backward},
    {"aten::bernoulli_.float", &random_in_place},
    {"aten::uniform_", &random_in_place},
    {"aten::normal_", &random_in_place},
};

}  // namespace
}  // namespace ops
}  // namespace dtensor
