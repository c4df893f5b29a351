// fake_world (dtensor/plan/fake_world.h) and its groups' backend: a c10d::Backend with no peers. Each collective
// completes at once and leaves its output shaped as the real one, filled from this rank's own input (the
// values are meaningless; on meta tensors nothing is computed at all):
//   all_reduce, broadcast   the tensor as it is
//   all_gather              the input copied into every rank's slot
//   reduce_scatter          this rank's chunk of the input
//   all_to_all              the input, when the output has its size; else the output as it is
// (c10d's own FakeProcessGroup does the same, but its header needs Python's.)
#include "dtensor/plan/fake_world.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"

namespace dtensor {
namespace {

class DoneWork final : public c10d::Work {
 public:
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
};

c10::intrusive_ptr<c10d::Work> done() { return c10::make_intrusive<DoneWork>(); }

class FakeBackend final : public c10d::Backend {
 public:
  FakeBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "fake"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions&) override {
    at::NoGradGuard no_grad;
    for (auto& slot : out.reshape({size_, -1}).unbind(0)) slot.copy_(in.reshape({-1}));
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions&) override {
    at::NoGradGuard no_grad;
    out.copy_(in.reshape({size_, -1})[rank_].view(out.sizes()));
    return done();
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>&,
                                               std::vector<int64_t>&, const c10d::AllToAllOptions&) override {
    at::NoGradGuard no_grad;
    if (out.numel() == in.numel()) out.copy_(in.view(out.sizes()));
    return done();
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return done(); }
};

}  // namespace

std::shared_ptr<World> fake_world(int size, int rank) {
  DTENSOR_CHECK(size >= 1 && rank >= 0 && rank < size, "dtensor: fake_world: rank ", rank,
                " is outside [0, world size ", size, ")");
  InitOptions options;
  options.make_backend = [](int group_rank, int group_size) -> c10::intrusive_ptr<c10d::Backend> {
    return c10::make_intrusive<FakeBackend>(group_rank, group_size);
  };
  // The store is never used for a rendezvous: a fake group talks to no one.
  return std::make_shared<World>(c10::make_intrusive<c10d::HashStore>(), rank, size, options);
}

}  // namespace dtensor
