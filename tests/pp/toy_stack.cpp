#include "pp/toy_stack.h"

#include <ATen/core/grad_mode.h>

#include <memory>
#include <mutex>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/pp/stage.h"
#include "harness/multi_rank.h"

namespace pp_test {

namespace {

std::vector<Layer> copies(const std::vector<Layer>& layers) {
  std::vector<Layer> out;
  for (const auto& l : layers) out.push_back({l.w.detach().clone().requires_grad_(), l.b.detach().clone().requires_grad_()});
  return out;
}

// SGD on layers [first, last), recording the first step's gradients and (after the last step) the values.
void sgd(std::vector<Layer>& layers, int first, int last, double lr, bool first_step, bool last_step, Result& out) {
  at::NoGradGuard g;
  for (int i = first; i < last; ++i) {
    auto& l = layers[static_cast<size_t>(i)];
    const std::string name = "layers." + std::to_string(i);
    if (first_step) {
      out.grads[name + ".weight"] = l.w.grad().clone();
      out.grads[name + ".bias"] = l.b.grad().clone();
    }
    l.w.sub_(l.w.grad() * lr);
    l.b.sub_(l.b.grad() * lr);
    l.w.mutable_grad().zero_();
    l.b.mutable_grad().zero_();
    if (last_step) {
      out.final_params[name + ".weight"] = l.w.detach().clone();
      out.final_params[name + ".bias"] = l.b.detach().clone();
    }
  }
}

}  // namespace

at::Tensor run_layers(const std::vector<Layer>& layers, int first, int last, at::Tensor x) {
  const int n = static_cast<int>(layers.size());
  for (int i = first; i < last; ++i) {
    x = at::linear(x, layers[static_cast<size_t>(i)].w, layers[static_cast<size_t>(i)].b);
    if (i + 1 < n) x = at::tanh(x);
  }
  return x;
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return at::mse_loss(out, target); }

Result train_reference(std::vector<Layer> layers, const at::Tensor& xs, const at::Tensor& ys, int m, double lr) {
  layers = copies(layers);
  Result r;
  const int n = static_cast<int>(layers.size()), steps = static_cast<int>(xs.size(0));
  for (int step = 0; step < steps; ++step) {
    const auto x = xs[step].chunk(m), y = ys[step].chunk(m);
    double sum = 0;
    for (int i = 0; i < m; ++i) {
      at::Tensor loss = mse(run_layers(layers, 0, n, x[static_cast<size_t>(i)]), y[static_cast<size_t>(i)]);
      sum += loss.item<double>();
      (loss / static_cast<double>(m)).backward();
    }
    r.losses.push_back(sum / m);
    sgd(layers, 0, n, lr, step == 0, step + 1 == steps, r);
  }
  return r;
}

Result train_pipelined(const std::vector<Layer>& initial, const at::Tensor& xs, const at::Tensor& ys,
                       const dtensor::pp::ScheduleSpec& spec, double lr) {
  Result out;
  std::mutex mu;
  dtensor::testing::run_ranks(spec.pp, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"pp"});
    dtensor::ProcessGroup* group = world > 1 ? &mesh.get_group(0) : nullptr;
    std::vector<Layer> layers;
    {
      std::lock_guard<std::mutex> lock(mu);
      layers = copies(initial);
    }
    const int per_stage = static_cast<int>(layers.size()) / spec.num_stages();
    std::vector<std::unique_ptr<dtensor::pp::PipelineStage>> stages;
    std::vector<dtensor::pp::PipelineStage*> mine;
    for (int s : spec.stages_of(rank)) {
      const int first = s * per_stage, last = first + per_stage;
      std::vector<at::Tensor> params;
      for (int i = first; i < last; ++i) {
        params.push_back(layers[static_cast<size_t>(i)].w);
        params.push_back(layers[static_cast<size_t>(i)].b);
      }
      stages.push_back(std::make_unique<dtensor::pp::PipelineStage>(
          [&layers, first, last](const at::Tensor& x) { return run_layers(layers, first, last, x); }, params, s,
          spec.num_stages(), group));
      mine.push_back(stages.back().get());
    }
    dtensor::pp::PipelineSchedule schedule(mine, spec, mse);
    const bool first_rank = spec.stage_rank(0) == rank, last_rank = spec.stage_rank(spec.num_stages() - 1) == rank;
    const int steps = static_cast<int>(xs.size(0));
    for (int step = 0; step < steps; ++step) {
      const auto losses = schedule.step_batch(first_rank ? xs[step] : at::Tensor(), last_rank ? ys[step] : at::Tensor());
      std::lock_guard<std::mutex> lock(mu);
      if (last_rank) {
        double sum = 0;
        for (const auto& l : losses) sum += l.item<double>();
        out.losses.push_back(sum / spec.microbatches);
      }
      for (auto* st : mine) {
        sgd(layers, st->stage_index() * per_stage, (st->stage_index() + 1) * per_stage, lr, step == 0,
            step + 1 == steps, out);
      }
    }
  });
  return out;
}

}  // namespace pp_test
