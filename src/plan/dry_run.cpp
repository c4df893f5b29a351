// The plan dry run (dtensor/plan/dry_run.h): one step of the user's code per simulated rank, on a fake
// world and meta tensors, with the collectives, bytes and FLOPs recorded.
#include "dtensor/plan/dry_run.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <tuple>

#include "dtensor/core/error.h"
#include "dtensor/plan/fake_world.h"
#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/nn/default_device.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/ops/dispatch_options.h"
#include "plan/matmul_flops.h"
#include "plan/meta_memory.h"

namespace dtensor {

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::FORWARD: return "forward";
    case StepPhase::BACKWARD: return "backward";
    case StepPhase::OPTIMIZER: return "optimizer";
  }
  return "?";
}

namespace {

std::map<std::string, int64_t> sum_by_collective(const std::vector<CommRecord>& records, std::optional<StepPhase> phase,
                                                 int64_t CommRecord::*field) {
  std::map<std::string, int64_t> out;
  for (const auto& r : records) {
    if (!phase || r.phase == *phase) out[r.collective] += r.*field;
  }
  return out;
}

int64_t local_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  const at::Tensor& local = is_dtensor(t) ? to_local(t) : t;
  return local.numel() * static_cast<int64_t>(local.element_size());
}

// The records of one simulated rank: each CommEvent, keyed by (phase, module, collective, mesh dim).
class CommRecorder {
 public:
  CommRecorder(const DeviceMesh& mesh, const std::vector<std::string>& names, std::vector<CommRecord>& out)
      : out_(out), guard_([this, &mesh, &names](const CommEvent& e) { record(mesh, names, e); }) {}
  void set_phase(StepPhase phase) { phase_ = phase; }

 private:
  void record(const DeviceMesh& mesh, const std::vector<std::string>& names, const CommEvent& e) {
    std::string dim = "(other group)";
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      if (e.group_ranks && mesh.get_group(d).ranks() == *e.group_ranks) {
        dim = names.empty() ? std::to_string(d) : names[d];
      }
    }
    auto key = std::make_tuple(static_cast<int>(phase_), current_comm_scope(), std::string(e.collective), dim);
    auto it = index_.find(key);
    if (it == index_.end()) {
      it = index_.emplace(key, out_.size()).first;
      out_.push_back(CommRecord{phase_, current_comm_scope(), e.collective, dim, e.group_size, 0, 0});
    }
    ++out_[it->second].count;
    out_[it->second].bytes += e.bytes;
  }

  std::vector<CommRecord>& out_;
  std::map<std::tuple<int, std::string, std::string, std::string>, size_t> index_;
  StepPhase phase_ = StepPhase::FORWARD;
  CommObserverGuard guard_;
};

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [_, state] : optimizer.state()) {
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      bytes += local_bytes(adamw->exp_avg()) + local_bytes(adamw->exp_avg_sq()) + local_bytes(adamw->max_exp_avg_sq());
    }
  }
  return bytes;
}

RankReport simulate_rank(int rank, const std::function<std::shared_ptr<torch::nn::Module>()>& build,
                         const std::vector<int64_t>& shape, const std::function<void(const DeviceMesh&)>& plan,
                         const std::function<at::Tensor(const DeviceMesh&)>& step, const DryRunOptions& options) {
  const int size = static_cast<int>(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()));
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  DeviceMesh mesh("cpu", shape, ranks, options.mesh_dim_names, fake_world(size, rank));

  RankReport report;
  report.rank = rank;
  report.coordinate = *mesh.get_coordinate();
  detail::MetaMemoryCounter memory;
  std::shared_ptr<torch::nn::Module> module;
  {
    nn::DefaultDeviceGuard meta(at::kMeta);
    module = build();
  }
  plan(mesh);
  const std::vector<at::Tensor> params = nn::unique_parameters(*module);
  for (const auto& p : params) {
    report.param_bytes += local_bytes(p);
    report.num_params += is_dtensor(p) ? to_local(p).numel() : p.numel();
  }

  CommRecorder recorder(mesh, options.mesh_dim_names, report.comms);
  int64_t allocated_before = 0;
  const int64_t ops_before = dispatch_stats().calls();
  {
    detail::MatmulFlopCounter flops;
    memory.reset_peak();
    const int64_t before_forward = memory.live_bytes();
    allocated_before = memory.allocated_bytes();
    std::shared_ptr<void> guard = options.step_guard ? options.step_guard() : nullptr;
    at::Tensor loss = step(mesh);
    report.activation_bytes = memory.live_bytes() - before_forward;
    recorder.set_phase(StepPhase::BACKWARD);
    loss.backward();
    loss = at::Tensor();
    guard.reset();
    if (options.after_backward) options.after_backward(mesh, params);
    report.matmul_flops = flops.flops();
  }
  for (const auto& p : params) report.grad_bytes += local_bytes(p.grad());
  if (options.optimizer) {
    recorder.set_phase(StepPhase::OPTIMIZER);
    auto optimizer = options.optimizer(params);
    optimizer->step();
    report.optimizer_state_bytes = optimizer_state_bytes(*optimizer);
  }
  report.peak_bytes = memory.peak_bytes();
  report.allocated_bytes = memory.allocated_bytes() - allocated_before;
  report.dtensor_ops = dispatch_stats().calls() - ops_before;
  return report;
}

bool same_numbers(const RankReport& a, const RankReport& b) {
  auto key = [](const RankReport& r) {
    return std::make_tuple(r.param_bytes, r.grad_bytes, r.optimizer_state_bytes, r.activation_bytes, r.peak_bytes,
                           r.matmul_flops, r.counts(), r.bytes());
  };
  return key(a) == key(b);
}

}  // namespace

std::map<std::string, int64_t> RankReport::counts(std::optional<StepPhase> phase) const {
  return sum_by_collective(comms, phase, &CommRecord::count);
}
std::map<std::string, int64_t> RankReport::bytes(std::optional<StepPhase> phase) const {
  return sum_by_collective(comms, phase, &CommRecord::bytes);
}

OptimizerFactory adamw_factory() {
  return [](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(std::move(params));
  };
}

namespace detail {

DryRunReport dry_run_modules(const std::function<std::shared_ptr<torch::nn::Module>()>& build,
                             const std::vector<int64_t>& mesh_shape, const std::function<void(const DeviceMesh&)>& plan,
                             const std::function<at::Tensor(const DeviceMesh&)>& step, const DryRunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  DTENSOR_CHECK(!mesh_shape.empty(), "dtensor: dry_run needs a mesh shape");
  int64_t size = 1;
  for (int64_t s : mesh_shape) {
    DTENSOR_CHECK(s >= 1, "dtensor: dry_run mesh dims must be >= 1");
    size *= s;
  }
  std::vector<int> ranks = options.ranks;
  if (ranks.empty()) ranks = size == 1 ? std::vector<int>{0} : std::vector<int>{0, static_cast<int>(size - 1)};
  DryRunReport report;
  report.mesh_shape = mesh_shape;
  report.mesh_dim_names = options.mesh_dim_names;
  for (int r : ranks) {
    DTENSOR_CHECK(r >= 0 && r < size, "dtensor: dry_run rank ", r, " is outside the mesh of ", size, " ranks");
    report.ranks.push_back(simulate_rank(r, build, mesh_shape, plan, step, options));
    if (!same_numbers(report.ranks.front(), report.ranks.back())) report.differing_ranks.push_back(r);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace detail
}  // namespace dtensor
