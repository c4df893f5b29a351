// Everything a user of dtensor-cpp needs, in one include:
//
//   #include "dtensor/dtensor.h"
//   auto tp = dtensor::init_device_mesh("cpu", {world}, {"tp"});
//   dtensor::parallelize_module(*model, tp, plan);
//
// The layers, from the bottom up: mesh/ (process groups, DeviceMesh, collectives), tensor/ (placements,
// DTensor), redistribute/, ops/ (dispatch controls, custom sharding rules), parallel/ (module hooks, layers,
// styles, parallelize_module, loss parallel, CommDebugMode).
#pragma once

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/error.h"
#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/mesh/comm_clock.h"
#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/cuda.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/mesh/launch_env.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/ops/loss_parallel.h"
#include "dtensor/ops/sharding_strategy.h"
#include "dtensor/parallel/async_tp.h"
#include "dtensor/parallel/clip_grad.h"
#include "dtensor/parallel/fully_shard.h"
#include "dtensor/parallel/gradient_sync.h"
#include "dtensor/parallel/comm_debug_mode.h"
#include "dtensor/parallel/distribute_module.h"
#include "dtensor/parallel/enable_async_tp.h"
#include "dtensor/parallel/dry_run.h"
#include "dtensor/parallel/layers.h"
#include "dtensor/parallel/local_styles.h"
#include "dtensor/parallel/module_hooks.h"
#include "dtensor/parallel/parallelize.h"
#include "dtensor/parallel/parameter_replacement.h"
#include "dtensor/parallel/replicate.h"
#include "dtensor/parallel/style.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/placement.h"
#include "dtensor/tensor/shard_layout.h"
