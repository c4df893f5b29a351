// Loss-parallel kernels (loss_parallel_ops.cpp), called by the log_softmax and nll_loss handlers when a
// LossParallelGuard is alive and the class dim is sharded. Internal header.
#pragma once

#include "ops/op_call.h"
#include "ops/op_table.h"
#include "ops/run_strategy.h"

namespace dtensor::ops {

bool loss_parallel_applies(const OpCall& call, int64_t class_dim_of_first);
void loss_parallel_log_softmax(OpCall& call);
void loss_parallel_log_softmax_backward(OpCall& call);
void loss_parallel_nll_forward(OpCall& call);
void loss_parallel_nll_backward(OpCall& call);

}  // namespace dtensor::ops
