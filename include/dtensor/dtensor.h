// Everything a user of dtensor-cpp needs, in one include:
//
//   #include "dtensor/dtensor.h"
//   auto tp = dtensor::init_device_mesh("cpu", {world}, {"tp"});
//   dtensor::parallelize_module(*model, tp, plan);
//
// The layers, from the bottom up (docs/design/layout.md): core/ (errors, chunk arithmetic), mesh/ (process
// groups, DeviceMesh, collectives), tensor/ (placements, the DTensor type), redistribute/, api/ (distribute_tensor,
// from_local, ...), ops/ (dispatch controls, custom sharding rules), checkpoint/, nn/ (module hooks, layers),
// dp/ (DDP, FSDP, clipping), tp/ (styles, parallelize_module, async TP, loss parallel), debug/ (CommDebugMode),
// plan/ (the dry run).
#pragma once

#include "dtensor/core/error.h"
#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/mesh/comm_clock.h"
#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/cuda.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/mesh/launch_env.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/mesh/watchdog.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/placement.h"
#include "dtensor/tensor/shard_layout.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/ops/loss_parallel.h"
#include "dtensor/ops/sharding_strategy.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/materialize.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/dp/clip_grad.h"
#include "dtensor/dp/fully_shard.h"
#include "dtensor/dp/mixed_precision.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/dp/replicate.h"
#include "dtensor/tp/async_tp.h"
#include "dtensor/tp/distribute_module.h"
#include "dtensor/tp/enable_async_tp.h"
#include "dtensor/tp/float8_styles.h"
#include "dtensor/tp/local_styles.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/plan/dry_run.h"
#include "dtensor/plan/fake_world.h"
