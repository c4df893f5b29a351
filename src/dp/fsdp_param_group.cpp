// The flat all-gather and reduce-scatter of one fully_shard call's parameters (fsdp_param_group.h).
#include "dp/fsdp_param_group.h"

#include <algorithm>

#include <ATen/native/Resize.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/tensor/shard_layout.h"

namespace dtensor::detail {
namespace {

// A tensor of `shape` at `offset` elements into `base`'s storage: shares it (and its reallocations) without
// being an autograd view.
at::Tensor alias_of(const at::Tensor& base, int64_t offset, const std::vector<int64_t>& shape) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  at::Tensor t = at::empty({0}, base.options());
  t.set_(base.storage(), offset, shape, strides);
  return t;
}

void resize_storage(const at::Tensor& t, int64_t bytes) {
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), static_cast<size_t>(bytes));
}

}  // namespace

FsdpParamGroup::FsdpParamGroup(std::vector<FsdpParam> params, DeviceMesh mesh, DeviceMesh dp_mesh, bool is_root,
                               FullyShardOptions options)
    : params_(std::move(params)), mesh_(std::move(mesh)), dp_mesh_(std::move(dp_mesh)), is_root_(is_root),
      options_(options), arrived_(params_.size(), false) {
  dp_ = dp_mesh_.size();
  dp_rank_ = dp_mesh_.get_local_rank(0);
  int64_t gathered_numel = 0;
  for (FsdpParam& p : params_) {
    p.flat_offset = shard_numel_;
    shard_numel_ += p.padded_rows * p.row_numel;
    p.local_offset = gathered_numel;
    gathered_numel += p.local_shape[0] * p.row_numel;
  }
  // Mixed precision: the gathered (compute) parameters in param_dtype, the gradients reduced in reduce_dtype.
  const at::ScalarType master = local_tensor(params_.front().sharded).scalar_type();
  compute_dtype_ = options_.mp_policy.param_dtype.value_or(master);
  reduce_dtype_ = options_.mp_policy.reduce_dtype.value_or(compute_dtype_);
  gathered_ = at::empty({gathered_numel}, local_tensor(params_.front().sharded).options().dtype(compute_dtype_));
  gathered_bytes_ = gathered_numel * static_cast<int64_t>(gathered_.element_size());
  for (FsdpParam& p : params_) {
    p.gathered_local = alias_of(gathered_, p.local_offset, p.local_shape);
    at::Tensor leaf_local = alias_of(gathered_, p.local_offset, p.local_shape);
    const bool grad = p.sharded.requires_grad();
    if (p.tp_spec) {
      DTensorSpec spec = *p.tp_spec;
      spec.meta.dtype = compute_dtype_;
      p.unsharded = make_dtensor(leaf_local, spec, grad);
    } else {
      p.unsharded = leaf_local.requires_grad_(grad);
    }
  }
  resize_storage(gathered_, 0);  // starts sharded
}

std::shared_ptr<FsdpParamGroup> FsdpSchedule::neighbour(const FsdpParamGroup* group, int step) const {
  for (size_t k = 0; k < forward_order.size(); ++k) {
    auto g = forward_order[k].lock();
    if (g.get() != group) continue;
    const int64_t at = static_cast<int64_t>(k) + step;
    if (at < 0 || at >= static_cast<int64_t>(forward_order.size())) return nullptr;
    return forward_order[at].lock();
  }
  return nullptr;
}

void FsdpParamGroup::on_forward_start() {
  if (schedule_ && !schedule_->recorded) {
    if (is_root_) schedule_->forward_order.clear();
    schedule_->forward_order.push_back(weak_from_this());
  }
  unshard();
  if (options_.prefetch && schedule_ && schedule_->recorded) {
    if (auto next = schedule_->neighbour(this, +1)) next->start_unshard(/*async_op=*/true);
  }
}

void FsdpParamGroup::on_backward_start() {
  unshard();
  if (options_.prefetch && schedule_ && schedule_->recorded) {
    // The root keeps its parameters from forward to backward: nothing to gather for it.
    auto previous = schedule_->neighbour(this, -1);
    if (previous && !previous->is_root()) previous->start_unshard(/*async_op=*/true);
  }
}

void FsdpParamGroup::start_unshard(bool async_op) {
  if (is_unsharded_ || gather_started_) return;
  at::NoGradGuard no_grad;
  // Copy-in: this rank's shards, each padded to c_p rows, into one flat buffer; one all-gather over dp.
  gather_in_ = at::zeros({shard_numel_}, gathered_.options());
  for (const FsdpParam& p : params_) {
    const at::Tensor& local = local_tensor(p.sharded);
    gather_in_.narrow(0, p.flat_offset, local.numel()).copy_(local.reshape({-1}));
  }
  if (dp_ > 1) {
    gather_out_ = at::empty({dp_ * shard_numel_}, gathered_.options());  // [dp * S], rank-major
    ProcessGroup& group = dp_mesh_.get_group(0);
    if (async_op) {
      gather_work_ = group.all_gather_into_async(gather_out_, gather_in_);
    } else {
      group.all_gather_into(gather_out_, gather_in_);
    }
  } else {
    gather_out_ = gather_in_;
  }
  gather_started_ = true;
}

void FsdpParamGroup::finish_unshard() {
  gather_work_.wait();
  at::NoGradGuard no_grad;
  resize_storage(gathered_, gathered_bytes_);
  // Copy-out: rank i's piece of p is rows [offset_i, offset_i + rows_i) of p's TP-local tensor.
  for (const FsdpParam& p : params_) {
    for (int64_t i = 0; i < dp_; ++i) {
      const int64_t n = p.rows[i] * p.row_numel;
      if (n == 0) continue;
      gathered_.narrow(0, p.local_offset + chunk_offset(p.rows, i) * p.row_numel, n)
          .copy_(gather_out_.narrow(0, i * shard_numel_ + p.flat_offset, n));
    }
  }
  gather_in_ = gather_out_ = at::Tensor();
  gather_started_ = false;
  is_unsharded_ = true;
}

void FsdpParamGroup::unshard() {
  if (!is_unsharded_) {
    start_unshard(/*async_op=*/false);  // no-op when a prefetch is in flight
    finish_unshard();
  }
  for (const FsdpParam& p : params_) {
    for (const auto& [owner, name] : p.uses) nn::set_forward_parameter(*owner, name, p.unsharded);
  }
}

void FsdpParamGroup::reshard() {
  if (gather_started_) {  // a prefetch nobody used (the module got no backward): let it land, drop it
    gather_started_ = false;
    gather_work_.wait();
    gather_in_ = gather_out_ = at::Tensor();
  }
  if (!is_unsharded_) return;
  resize_storage(gathered_, 0);
  is_unsharded_ = false;
  for (const FsdpParam& p : params_) {
    for (const auto& [owner, name] : p.uses) nn::set_forward_parameter(*owner, name, p.sharded);
  }
}

void FsdpParamGroup::on_forward_end() {
  if (is_root_ && schedule_) schedule_->recorded = true;  // the root's forward ends last
  if (!is_root_ && options_.reshard_after_forward) reshard();
}

void FsdpParamGroup::on_gradient(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (arrived_[index]) return;
  arrived_[index] = true;
  ++num_arrived_;
  if (!callback_queued_) {
    callback_queued_ = true;
    // Parameters that got no gradient in this backward: what arrived is reduced when the backward ends.
    std::weak_ptr<FsdpParamGroup> self = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([self] {
      if (auto g = self.lock()) g->end_of_backward();
    });
  }
  size_t expected = 0;
  for (const FsdpParam& p : params_) expected += p.sharded.requires_grad() ? 1 : 0;
  if (num_arrived_ == expected) {
    finish_gradients();
    reshard();
  }
}

void FsdpParamGroup::end_of_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  callback_queued_ = false;
  // Sync on: also the gradients that earlier micro-batches kept unsharded (a parameter this backward left out).
  const bool pending = std::any_of(params_.begin(), params_.end(), [](const FsdpParam& p) {
    return p.unsharded.grad().defined() || p.accumulated.defined();
  });
  if (num_arrived_ > 0 || (requires_gradient_sync_ && pending)) finish_gradients();
  reshard();
}

void FsdpParamGroup::set_requires_gradient_sync(bool requires_gradient_sync) {
  std::lock_guard<std::mutex> lock(mu_);
  requires_gradient_sync_ = requires_gradient_sync;
}

void FsdpParamGroup::finish_gradients() {
  if (requires_gradient_sync_) {
    reduce_gradients();
  } else {
    keep_gradients();
  }
}

void FsdpParamGroup::keep_gradients() {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) {
    FsdpParam& p = params_[k];
    if (!arrived_[k] || !p.unsharded.grad().defined() || p.unsharded.grad().scalar_type() == reduce_dtype_) continue;
    // Mixed precision: this micro-batch's param_dtype gradient added into the reduce_dtype accumulator.
    const at::Tensor g = p.unsharded.grad().to(reduce_dtype_);
    p.accumulated = p.accumulated.defined() ? p.accumulated.add_(g) : g;
    p.unsharded.mutable_grad() = at::Tensor();
  }
  std::fill(arrived_.begin(), arrived_.end(), false);
  num_arrived_ = 0;
}

void FsdpParamGroup::reduce_gradients() {
  at::NoGradGuard no_grad;
  // Copy-in: each gradient's TP-local rows, chunk i at rank i's slot of the flat buffer [dp, S].
  at::Tensor flat = at::zeros({dp_ * shard_numel_}, gathered_.options().dtype(reduce_dtype_));
  std::vector<size_t> reduced;
  for (size_t k = 0; k < params_.size(); ++k) {
    FsdpParam& p = params_[k];
    // A defined unsharded gradient is always pending (it is cleared once reduced): this backward's, or earlier
    // micro-batches' kept with sync off.
    if (!p.unsharded.grad().defined() && !p.accumulated.defined()) continue;
    at::Tensor g = p.unsharded.grad();
    if (g.defined() && g.scalar_type() != reduce_dtype_) g = g.to(reduce_dtype_);  // mixed precision: reduced in reduce_dtype
    if (p.accumulated.defined()) g = g.defined() ? p.accumulated.add_(g) : p.accumulated;
    p.accumulated = at::Tensor();
    if (p.tp_spec) {
      // Partial -> Replicate (all-reduce over tp) first: a sequence-parallel norm weight's gradient.
      if (placements(g) != p.tp_spec->placements) g = redistribute(g.detach(), p.tp_spec->placements);
      g = local_tensor(g);
    }
    g = g.contiguous().reshape({-1});
    for (int64_t i = 0; i < dp_; ++i) {
      const int64_t n = p.rows[i] * p.row_numel;
      if (n == 0) continue;
      flat.narrow(0, i * shard_numel_ + p.flat_offset, n).copy_(g.narrow(0, chunk_offset(p.rows, i) * p.row_numel, n));
    }
    reduced.push_back(k);
  }
  // One reduce-scatter over dp, averaged: rank i keeps slot i, the mean of every rank's chunk i.
  at::Tensor mine = dp_ > 1 ? reduce_scatter(flat, ReduceOp::SUM, 0, dp_mesh_, 0).div_(static_cast<double>(dp_)) : flat;
  for (size_t k : reduced) {
    FsdpParam& p = params_[k];
    const at::Tensor& local = local_tensor(p.sharded);
    at::Tensor piece = mine.narrow(0, p.flat_offset, local.numel()).view(local.sizes());
    if (piece.scalar_type() != local.scalar_type()) piece = piece.to(local.scalar_type());  // into the masters' dtype
    if (p.sharded.grad().defined()) {
      local_tensor(p.sharded.grad()).add_(piece);  // accumulation across backwards (micro-batches)
    } else {
      p.sharded.mutable_grad() = make_dtensor(piece, dtensor_spec(p.sharded));
    }
    p.unsharded.mutable_grad() = at::Tensor();
  }
  std::fill(arrived_.begin(), arrived_.end(), false);
  num_arrived_ = 0;
}

}  // namespace dtensor::detail
