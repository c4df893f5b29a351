#include "dtensor/tp/distribute_module.h"

#include "tp/distribute_params.h"

namespace dtensor {

void distribute_module(torch::nn::Module& module, const DeviceMesh& mesh, PartitionFn partition_fn, InputFn input_fn,
                       OutputFn output_fn, std::optional<int> src_data_rank) {
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (partition_fn) partition_fn(item.key(), *item.value(), mesh);
    detail::replicate_params(*item.value(), mesh, src_data_rank, /*buffers=*/true);  // whatever is still plain
  }
  register_module_io(module, mesh, std::move(input_fn), std::move(output_fn));
  nn::link_enclosing_hooks(module);
}

void register_module_io(torch::nn::Module& module, const DeviceMesh& mesh, InputFn input_fn, OutputFn output_fn) {
  if (input_fn) {
    nn::register_forward_pre_hook(module, nn::ForwardPreHook([mesh, input_fn = std::move(input_fn)](
                                                                 torch::nn::Module& m, nn::Args args, nn::KwArgs kwargs) {
      return input_fn(m, std::move(args), std::move(kwargs), mesh);
    }));
  }
  if (output_fn) {
    nn::register_forward_hook(module, nn::ForwardHook([mesh, output_fn = std::move(output_fn)](
                                                          torch::nn::Module& m, const nn::Args&, c10::IValue out) {
      return output_fn(m, std::move(out), mesh);
    }));
  }
}

}  // namespace dtensor
