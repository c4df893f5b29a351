// PyTorch's import path: torch.distributed.tensor.parallel.loss_parallel. The guard is declared and defined
// with the op rules it switches (dtensor/ops/loss_parallel.h, src/ops/loss_parallel_ops.cpp).
#pragma once

#include "dtensor/ops/loss_parallel.h"
