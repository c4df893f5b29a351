// The CPUs each local rank runs on (tprun --cpu-bind): vLLM CPU's VLLM_CPU_OMP_THREADS_BIND, as a launcher flag.
//
// Each rank bound to cores of its own runs one OpenMP thread per bound CPU, where torchrun's default gives every rank
// of a multi-rank job one thread (TP 2 on a 16-core host used 2 cores). On 2 cores binding measured no change
// (docs/benchmarks.md, "Ranks bound to their cores"): the scheduler already kept the two ranks apart.
#pragma once

#include <string>
#include <vector>

namespace tprun {

// "auto": the CPUs tprun may run on (its own affinity mask), ordered by socket and core so that a core's hardware
// threads stay together, split into nproc contiguous groups of whole cores; no binding when there is one rank or
// fewer cores than ranks (ranks would then share a core: the scheduler does better). "none": no binding.
// A list, "0-3|4-7" (vLLM's form): one CPU list per local rank, '|' between ranks, each a comma-separated list of
// CPUs and ranges; every CPU must be in tprun's mask.
// Returns one list per local rank (all empty: no binding); a bad spec returns an empty vector and sets *error.
std::vector<std::vector<int>> rank_cpus(const std::string& spec, long nproc, std::string* error);

// "0-3,8" for {0, 1, 2, 3, 8}.
std::string cpu_list_string(const std::vector<int>& cpus);

// Binds the calling process (a forked rank, before exec) to cpus; returns false with errno set if the kernel refused.
bool bind_to_cpus(const std::vector<int>& cpus);

}  // namespace tprun
