// A step-time estimate from a dry run (dry_run.h), for llama_plan and auto_plan (auto_plan.h), with no overlap of
// compute and communication:
//   - matmuls: the step's matmul FLOPs over a measured local matmul throughput;
//   - the rest (elementwise ops, norms, softmax, copies, the optimizer): memory-bound, the bytes the step allocates
//     times a traffic factor over a measured memory bandwidth;
//   - each collective: latency + bytes on the wire / bus bandwidth (an alpha-beta model, per collective type, from
//     comm_bench's table);
//   - async TP's fused ops (dtensor/tp/async_tp.h): the collective they replace, plus a measured hand-off per op;
//     beside the no-overlap step, a best case hides their collectives behind the matmuls (step_overlapped_s).
// A model to rank plans by on the machine whose numbers it holds (--mm-gflops, --memory-gbps, --comm-table give
// another's).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "dtensor/plan/dry_run.h"

namespace dtensor {

struct CollectiveCost {
  double latency_us = 0;  // time of comm_bench's smallest message
  double busbw_gbps = 0;  // comm_bench's bus bandwidth at its largest message (GB/s)
};

struct CostModel {
  double matmul_gflops = 0;                            // local mm throughput in the compute dtype
  // The rest of the step's work (elementwise ops, norms, softmax, copies, the optimizer): memory-bound, so costed as
  // RankReport::allocated_bytes x traffic_per_allocated_byte over this bandwidth. 0: not costed.
  double memory_gbps = 0;
  double traffic_per_allocated_byte = 3.0;  // an op writes its output and reads about two inputs of its size
  // Per DTensor operator call (RankReport::dtensor_ops): the sharding decision, the wrapping and the autograd
  // bookkeeping on top of the local kernel. What separates plans that keep more of the layer on DTensors (sequence
  // parallel's norms, loss parallel) from plans that drop to local tensors early. 0: not costed.
  double dtensor_op_us = 0;
  double fused_op_overhead_us = 0;  // per async TP fused op: handing its pieces to the communication thread
  std::map<std::string, CollectiveCost> collectives;   // by collective name
  std::string comm_source;                             // where the collective numbers came from
  int comm_world = 2;          // the world comm_source measured: latency is priced per ring step beyond it
  std::string machine_source;  // where matmul_gflops, memory_gbps and dtensor_op_us came from

  // Seconds for one collective whose input on this rank is `input_bytes`, over a group of `n`. The bytes
  // each rank moves, as nccl-tests' bus bandwidth counts them: all_reduce 2(n-1)/n x the tensor,
  // all_gather (n-1) x the input (the output's (n-1)/n), reduce_scatter and all_to_all (n-1)/n x the input.
  // Latency: a ring's n - 1 steps, each the measured latency over the measured world's comm_world - 1 steps (the
  // alpha-beta model of a ring; a table measured at the job's world gives its own numbers).
  double collective_seconds(const std::string& collective, int64_t input_bytes, int64_t n) const;
};

// The numbers measured on the development machine: comm_bench's collectives (shared-memory backend, world 2, idle,
// 2026-11-26: 64 MiB bus bandwidth and 1 KiB latency) and async TP's per-fused-op hand-off.
CostModel default_cost_model();

// Replaces the collective numbers with those of a comm_bench output file (its first table per collective).
// Throws dtensor::Error when the file cannot be read or has no table.
void load_comm_table(CostModel& model, const std::string& path);

// Times a 1024 x 1024 x 1024 mm in `dtype` (the step's compute dtype) on this machine (best of a few runs); about 0.1 s.
double measure_matmul_gflops(at::ScalarType dtype = at::kFloat);
// Times an fp32 add of 4M elements (best of a few runs): GB/s of its reads and writes.
double measure_memory_gbps();
// Times a small forward and backward on plain tensors and on replicated DTensors (a fake world: no communication):
// microseconds each DTensor operator call adds. About 0.2 s.
double measure_dtensor_op_us();

struct StepEstimate {
  double compute_s = 0, comm_s = 0, step_s = 0;
  double other_s = 0;            // of step_s: the memory-bound rest (CostModel::memory_gbps)
  double dispatch_s = 0;         // of step_s: DTensor operator calls (CostModel::dtensor_op_us)
  double fused_comm_s = 0;       // of comm_s: async TP's fused collectives
  double fused_overhead_s = 0;   // of step_s: their hand-offs (CostModel::fused_op_overhead_us)
  double step_overlapped_s = 0;  // compute + the other comm + what of the fused comm the compute cannot hide
};
// The collective an async TP fused op replaces ("fused_all_gather_matmul" -> "all_gather"); others: itself.
std::string replaced_collective(const std::string& collective);
StepEstimate estimate_step(const dtensor::RankReport& rank, const CostModel& model);
// The estimated seconds of one record (all `count` collectives of it).
double record_seconds(const dtensor::CommRecord& record, const CostModel& model);

}  // namespace dtensor
