// A step-time estimate from a dry run (dry_run.h), for llama_plan and auto_plan (auto_plan.h): matmul FLOPs over a measured local matmul throughput, plus each
// collective as latency + bytes on the wire / bus bandwidth (an alpha-beta model, per collective type, from
// comm_bench's table), with no overlap of compute and communication. A rough bound to compare plans by,
// not a prediction for other hardware unless its own numbers are given (--mm-gflops, --comm-table).
// Async TP's fused ops (dtensor/tp/async_tp.h) cost what the collective they replace costs; beside the
// no-overlap step, a best case hides them behind the matmuls (step_overlapped_s).
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
  double matmul_gflops = 0;                            // local fp32 mm throughput
  std::map<std::string, CollectiveCost> collectives;   // by collective name
  std::string comm_source;                             // where the collective numbers came from

  // Seconds for one collective whose input on this rank is `input_bytes`, over a group of `n`. The bytes
  // each rank moves, as nccl-tests' bus bandwidth counts them: all_reduce 2(n-1)/n x the tensor,
  // all_gather (n-1) x the input (the output's (n-1)/n), reduce_scatter and all_to_all (n-1)/n x the input.
  double collective_seconds(const std::string& collective, int64_t input_bytes, int64_t n) const;
};

// The collective numbers measured by comm_bench on the development machine (docs/benchmarks.md, shared-memory backend, world 2,
// idle machine, 2026-11-23): 64 MiB bus bandwidth and 1 KiB latency.
CostModel default_cost_model();

// Replaces the collective numbers with those of a comm_bench output file (its first table per collective).
// Throws dtensor::Error when the file cannot be read or has no table.
void load_comm_table(CostModel& model, const std::string& path);

// Times a 1024 x 1024 x 1024 fp32 mm on this machine (best of a few runs); about 0.1 s.
double measure_matmul_gflops();

struct StepEstimate {
  double compute_s = 0, comm_s = 0, step_s = 0;
  double fused_comm_s = 0;       // of comm_s: async TP's fused collectives
  double step_overlapped_s = 0;  // compute + the other comm + what of the fused comm the compute cannot hide
};
// The collective an async TP fused op replaces ("fused_all_gather_matmul" -> "all_gather"); others: itself.
std::string replaced_collective(const std::string& collective);
StepEstimate estimate_step(const dtensor::RankReport& rank, const CostModel& model);
// The estimated seconds of one record (all `count` collectives of it).
double record_seconds(const dtensor::CommRecord& record, const CostModel& model);

}  // namespace dtensor
