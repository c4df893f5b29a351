// The seeds' pytorch_tp.py with the ToyModel written as PyTorch's is (stock_toy_model.h): plain torch::nn::Linear layers, no edits
// for parallelism. parallelize_module makes their parameters DTensors; Parallelized calls the model with plain
// tensors in and out (LibTorch's forwards run no hooks: docs/design/tensor_parallel_api.md).
//
//   tprun --nproc-per-node 2 stock_toy_tp             plan {in_proj: Colwise, out_proj: Rowwise}
//   tprun --nproc-per-node 2 stock_toy_tp --pairwise  PairwiseParallel() on the whole model (the RFC's form)
#include <torch/torch.h>

#include <cstdio>
#include <cstring>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tp/parallelize.h"
#include "stock_toy_model.h"


int main(int argc, char** argv) {
  const bool pairwise = argc > 1 && std::strcmp(argv[1], "--pairwise") == 0;
  if (argc > 2 || (argc == 2 && !pairwise)) {
    std::fprintf(stderr, "usage: stock_toy_tp [--pairwise]\n");
    return 2;
  }
  try {
    torch::manual_seed(45);
    auto world = dtensor::init_process_group();
    auto device_mesh = dtensor::init_device_mesh("cpu", {1, world->size()}, {"dp", "tp"});
    const int rank = device_mesh.get_rank();
    std::printf("rank %d: %s\n", rank, device_mesh.to_string().c_str());

    StockToyModel model;
    if (pairwise) {
      dtensor::parallelize_module(*model, device_mesh, dtensor::PairwiseParallel(), dtensor::TpMeshDim{1});
    } else {
      dtensor::parallelize_module(*model, device_mesh["tp"], {
          {"in_proj", dtensor::ColwiseParallel()},
          {"out_proj", dtensor::RowwiseParallel()},
      });
    }
    dtensor::Parallelized tp_model(model);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.05));

    at::Tensor input = torch::randn({20, 10});  // the same on every TP rank (the shared seed)
    at::Tensor target = torch::randn({20, 5});
    for (int i = 0; i < 10; ++i) {
      optimizer.zero_grad();
      at::Tensor output = tp_model(input);  // a plain tensor
      at::Tensor loss = (output - target).var();
      if (rank == 0) std::printf("loss %d %.7f\n", i, loss.item<double>());
      loss.backward();
      optimizer.step();
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
