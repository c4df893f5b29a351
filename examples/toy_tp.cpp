// The seeds' pytorch_tp.py in C++: ToyModel under tensor parallelism on a (1, world) mesh sliced to "tp",
// plan {in_proj: Colwise, out_proj: Rowwise}, AdamW lr 0.05, 10 steps of (output - target).var().
//
//   tprun --nproc-per-node 2 toy_tp
#include <torch/torch.h>

#include <cstdio>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tp/parallelize.h"
#include "toy_model.h"

void train(ToyModel& model, torch::optim::Optimizer& optimizer, int train_step, int rank) {
  at::Tensor input = torch::randn({20, 10});
  at::Tensor target = torch::randn({20, 5});
  for (int i = 0; i < train_step; ++i) {
    // For TP, input needs to be same across all TP ranks: the shared seed mimics the data loader.
    optimizer.zero_grad();
    at::Tensor output = model(input);
    at::Tensor loss = (output - target).var();
    if (rank == 0) std::printf("loss %d %.7f\n", i, loss.item<double>());
    loss.backward();
    optimizer.step();
  }
}

int main() {
  try {
    torch::manual_seed(45);
    auto world = dtensor::init_process_group();
    auto device_mesh = dtensor::init_device_mesh("cpu", {1, world->size()}, {"dp", "tp"});
    int rank = device_mesh.get_rank();
    std::printf("rank %d: %s\n", rank, device_mesh.to_string().c_str());
    auto tp_mesh = device_mesh["tp"];

    ToyModel tp_model;
    dtensor::parallelize_module(*tp_model, tp_mesh, {
        {"in_proj", dtensor::ColwiseParallel()},
        {"out_proj", dtensor::RowwiseParallel()},
    });
    torch::optim::AdamW optimizer(tp_model->parameters(), torch::optim::AdamWOptions(0.05));
    train(tp_model, optimizer, 10, rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
