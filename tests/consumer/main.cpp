// The smallest program a user writes against the installed package: a mesh over the launcher's world,
// a tensor distributed over it, one value checked. Run as `tprun --nproc-per-node N consumer`.
#include <ATen/ATen.h>

#include <iostream>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"

int main() {
  try {
    auto world = dtensor::init_process_group();
    auto mesh = dtensor::init_device_mesh("cpu", {world->size()});
    at::Tensor full = at::arange(8, at::kFloat).view({4, 2});
    at::Tensor x = dtensor::distribute_tensor(full, mesh, {dtensor::Shard(0)});
    // (x * 2).sum() over the whole tensor: 2 * (0 + ... + 7) = 56 on every rank.
    double total = dtensor::full_tensor((x * 2).sum()).item<double>();
    if (total != 56.0 || x.size(0) != 4) {
      std::cerr << "consumer: wrong result " << total << std::endl;
      return 1;
    }
    std::cout << "consumer ok: world " << world->size() << ", sum " << total << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "consumer: error: " << e.what() << std::endl;
    return 1;
  }
}
