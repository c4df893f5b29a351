#include "op_checker.h"

#include <random>
#include <sstream>

#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

namespace dtensor::testing {
namespace {

std::vector<Placement> choices(const OpSample& s, size_t k) {
  std::vector<Placement> out{Replicate()};
  if (s.may_shard[k]) {
    for (int64_t d = 0; d < s.inputs[k].dim(); ++d) out.push_back(Shard(d));
  }
  if (s.may_partial[k] && s.inputs[k].is_floating_point()) out.push_back(Partial());
  return out;
}

std::string describe(const std::vector<Placements>& combo) {
  std::string s;
  for (size_t k = 0; k < combo.size(); ++k) s += (k ? " x " : "") + to_string(combo[k]);
  return s;
}

}  // namespace

CheckResult check_op(const OpSample& sample, const DeviceMesh& mesh, int max_combinations, uint64_t seed) {
  CheckResult result;
  result.sample = sample.name;
  result.mesh = mesh.ndim() == 1 ? "1-D (" + std::to_string(mesh.size()) + ")" : "2-D (2, 2)";
  const size_t n = sample.inputs.size();
  // Every (input, mesh dim) picks one choice: enumerate the product, or sample it.
  std::vector<std::vector<Placement>> per_input;
  for (size_t k = 0; k < n; ++k) per_input.push_back(choices(sample, k));
  std::vector<size_t> radix;
  for (size_t k = 0; k < n; ++k) {
    for (int64_t i = 0; i < mesh.ndim(); ++i) radix.push_back(per_input[k].size());
  }
  uint64_t total = 1;
  for (size_t x : radix) total *= x;
  std::vector<uint64_t> codes;
  if (total <= static_cast<uint64_t>(max_combinations)) {
    for (uint64_t c = 0; c < total; ++c) codes.push_back(c);
  } else {
    std::mt19937_64 rng(seed);
    codes.push_back(0);  // all Replicate
    while (codes.size() < static_cast<size_t>(max_combinations)) codes.push_back(rng() % total);
  }

  // Reference: the op on plain tensors, and the gradients of sum(out * W).
  std::vector<at::Tensor> ref_in;
  for (size_t k = 0; k < n; ++k) {
    at::Tensor t = sample.inputs[k].clone();
    if (sample.differentiable[k]) t.set_requires_grad(true);
    ref_in.push_back(t);
  }
  at::Tensor ref_out = sample.fn(ref_in);
  at::Tensor weight = seeded_randn(777, ref_out.sizes());
  bool any_grad = false;
  for (bool d : sample.differentiable) any_grad = any_grad || d;
  if (any_grad) (ref_out * weight).sum().backward();

  for (uint64_t code : codes) {
    std::vector<Placements> combo(n);
    uint64_t rest = code;
    size_t r = 0;
    for (size_t k = 0; k < n; ++k) {
      for (int64_t i = 0; i < mesh.ndim(); ++i, ++r) {
        combo[k].push_back(per_input[k][rest % radix[r]]);
        rest /= radix[r];
      }
    }
    ++result.combinations;
    std::string where = describe(combo);
    try {
      std::vector<at::Tensor> dts;
      for (size_t k = 0; k < n; ++k) {
        at::Tensor dt = distribute_tensor(sample.inputs[k], mesh, combo[k]);
        if (sample.differentiable[k]) dt.set_requires_grad(true);
        dts.push_back(dt);
      }
      at::Tensor out = sample.fn(dts);
      if (!is_dtensor(out)) {
        result.failures.push_back(where + ": the result is a plain tensor");
        continue;
      }
      at::Tensor full = full_tensor(out);
      const at::Tensor full_host = full.cpu();  // the reference ran on the CPU (the mesh may be a CUDA one)
      if (!at::allclose(full_host, ref_out.detach(), sample.tolerance, sample.tolerance)) {
        std::ostringstream os;
        os << where << ": forward differs (result placements " << to_string(placements(out)) << ", max error "
           << (full_host - ref_out.detach()).abs().max().item<double>() << ")";
        result.failures.push_back(os.str());
        continue;
      }
      ++result.forward_ok;
      if (any_grad) {
        (full * weight.to(full.device())).sum().backward();
        bool ok = true;
        for (size_t k = 0; k < n && ok; ++k) {
          if (!sample.differentiable[k]) continue;
          at::Tensor g = dts[k].grad();
          if (!g.defined() || !is_dtensor(g)) {
            result.failures.push_back(where + ": input " + std::to_string(k) + " has no DTensor gradient");
            ok = false;
          } else if (!at::allclose(full_tensor(g).cpu(), ref_in[k].grad(), sample.tolerance, sample.tolerance)) {
            std::ostringstream os;
            os << where << ": gradient of input " << k << " differs (grad placements " << to_string(placements(g))
               << ", max error " << (full_tensor(g).cpu() - ref_in[k].grad()).abs().max().item<double>() << ")";
            result.failures.push_back(os.str());
            ok = false;
          }
        }
        if (ok) ++result.backward_ok;
      }
      result.placements_ok.push_back(where);
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (sample.may_refuse && what.rfind("dtensor:", 0) == 0) {
        ++result.refused;
      } else {
        result.failures.push_back(where + ": " + what.substr(0, 400));
      }
    }
  }
  return result;
}

std::vector<CheckResult> check_all_ops(const std::vector<OpSample>& samples, const std::string& device_type,
                                       int combos_1d, int combos_2d) {
  std::vector<CheckResult> results;
  RunOptions options;
  options.run_timeout = std::chrono::milliseconds(900000);
  // A GPU shared by four rank threads loads each kernel on first use (CUDA's lazy loading): give the first
  // collectives after such a stall room.
  if (device_type == "cuda") options.collective_timeout = std::chrono::milliseconds(120000);
  run_ranks(4, [&](int rank, int) {
    auto mesh_1d = init_device_mesh(device_type, {4});
    auto mesh_2d = init_device_mesh(device_type, {2, 2});
    for (size_t k = 0; k < samples.size(); ++k) {
      auto r1 = check_op(samples[k], mesh_1d, combos_1d, 1000 + k);
      auto r2 = check_op(samples[k], mesh_2d, combos_2d, 2000 + k);
      if (rank == 0) {
        results.push_back(std::move(r1));
        results.push_back(std::move(r2));
      }
    }
  }, options);
  return results;
}

}  // namespace dtensor::testing
