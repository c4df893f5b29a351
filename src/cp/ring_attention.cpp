// Ring attention (context_parallel.h states the algebra): block attention with log-sum-exp merging, the keys and
// values travelling by all-gather or by a ring of rotations, and the backward from the merged output.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "dtensor/core/error.h"
#include "dtensor/cp/context_parallel.h"
#include "dtensor/mesh/process_group.h"
#include "cp/block_attention.h"
#include "cp/layout.h"
#include "mesh/autograd_comm_scope.h"

namespace dtensor::cp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using internal::BlockMask;
using internal::BlockSpec;
using internal::chunks_of;
using nn::repeat_kv;

// The gradient of repeat_kv: each key/value head's copies summed.
at::Tensor sum_kv(const at::Tensor& g, int64_t n_rep) {
  if (n_rep == 1) return g;
  const int64_t b = g.size(0), h = g.size(1), t = g.size(2), d = g.size(3);
  return g.view({b, h / n_rep, n_rep, t, d}).sum(2);
}

struct Ring {
  ProcessGroup* group;
  int64_t cp, rank;
  bool load_balance;
  BlockSpec spec;  // causal, sliding window, soft-capping, scale
  RotateMethod method;

  int64_t per_rank() const { return load_balance ? 2 : 1; }
  // The rank whose block this rank holds at step t of the ring (its own at t = 0).
  int64_t source(int64_t t) const { return ((rank - t) % cp + cp) % cp; }

  // [k; v] of one rank, flat, and back.
  static at::Tensor pack(const at::Tensor& k, const at::Tensor& v) { return at::cat({k.reshape({-1}), v.reshape({-1})}); }
  static std::pair<at::Tensor, at::Tensor> unpack(const at::Tensor& kv, const at::Tensor& like) {
    const int64_t n = like.numel();
    return {kv.narrow(0, 0, n).view(like.sizes()), kv.narrow(0, n, n).view(like.sizes())};
  }
  // Starts the all-gather of every rank's packed [k; v] into `all` (rank r's at [r n, (r + 1) n)).
  Work gather(at::Tensor& all, at::Tensor& mine) const { return group->all_gather_into_async(all, mine); }
  // Starts sending `buf` to the next rank and receiving the previous rank's into `into`.
  Work rotate(at::Tensor& into, at::Tensor& buf) const {
    std::vector<int64_t> in_splits(static_cast<size_t>(cp), 0), out_splits(static_cast<size_t>(cp), 0);
    in_splits[static_cast<size_t>((rank + 1) % cp)] = buf.numel();
    out_splits[static_cast<size_t>((rank + cp - 1) % cp)] = buf.numel();
    return group->all_to_all_single_async(into, buf, out_splits, in_splits);
  }

  // Visits every visible (local query chunk a, source rank's key chunk b) block with `f(a, b, mask)`, chunks m long;
  // `like` gives the masks' dtype and device.
  template <typename F>
  void blocks_of(int64_t src, int64_t m, const at::Tensor& like, F&& f) const {
    const auto mine = chunks_of(rank, cp, load_balance), theirs = chunks_of(src, cp, load_balance);
    for (size_t a = 0; a < mine.size(); ++a) {
      for (size_t b = 0; b < theirs.size(); ++b) {
        if (auto mask = internal::block_mask(mine[a], theirs[b], m, spec, like)) f(static_cast<int64_t>(a), static_cast<int64_t>(b), *mask);
      }
    }
  }
};

struct Merged {
  std::vector<at::Tensor> out, lse;  // per local query chunk, fp32; undefined until its first block
  void add(int64_t a, const at::Tensor& o, const at::Tensor& l) {
    at::Tensor& acc = out[static_cast<size_t>(a)];
    at::Tensor& acc_lse = lse[static_cast<size_t>(a)];
    if (!acc.defined()) {
      acc = o.to(at::kFloat);
      acc_lse = l;
      return;
    }
    // A row no block has shown yet keeps lse -inf: weights exp(-inf - 0) = 0, not exp(-inf + inf).
    const at::Tensor merged = at::logaddexp(acc_lse, l);
    const at::Tensor finite = merged.masked_fill(merged.isinf(), 0);
    acc = acc * at::exp(acc_lse - finite).unsqueeze(-1) + o.to(at::kFloat) * at::exp(l - finite).unsqueeze(-1);
    acc_lse = merged;
  }
};

struct RingAttentionFn : torch::autograd::Function<RingAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            Ring ring) {
    detail::save_comm_scope(ctx);
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const int64_t n_rep = q.size(1) / k.size(1);
    const int64_t m = q.size(2) / ring.per_rank();
    auto chunk = [m](const at::Tensor& x, int64_t i) { return x.narrow(2, i * m, m); };
    Merged merged{std::vector<at::Tensor>(static_cast<size_t>(ring.per_rank())),
                  std::vector<at::Tensor>(static_cast<size_t>(ring.per_rank()))};
    auto attend = [&](int64_t src, const at::Tensor& ks, const at::Tensor& vs) {
      ring.blocks_of(src, m, q, [&](int64_t a, int64_t b, const BlockMask& mask) {
        auto [o, l] = internal::block_forward(chunk(q, a), repeat_kv(chunk(ks, b), n_rep), repeat_kv(chunk(vs, b), n_rep),
                                              mask, ring.spec);
        merged.add(a, o, l);
      });
    };
    if (ring.cp == 1) {
      attend(0, k, v);
    } else if (ring.method == RotateMethod::allgather) {
      // One all-gather of [k; v], in flight while this rank's own blocks are computed.
      at::Tensor mine = Ring::pack(k, v);
      const int64_t n = mine.numel();
      at::Tensor all = at::empty({ring.cp * n}, mine.options());
      Work w = ring.gather(all, mine);
      attend(ring.rank, k, v);
      w.wait();
      for (int64_t src = 0; src < ring.cp; ++src) {
        if (src == ring.rank) continue;
        auto [ks, vs] = Ring::unpack(all.narrow(0, src * n, n), k);
        attend(src, ks, vs);
      }
    } else {
      at::Tensor held = Ring::pack(k, v);
      for (int64_t t = 0; t < ring.cp; ++t) {
        at::Tensor next = at::empty_like(held);
        Work w;
        if (t + 1 < ring.cp) w = ring.rotate(next, held);  // in flight while this block is computed
        auto [ks, vs] = Ring::unpack(held, k);
        attend(ring.source(t), ks, vs);
        w.wait();
        held = next;
      }
    }
    const at::Tensor out = at::cat(merged.out, 2).to(q.scalar_type());
    const at::Tensor lse = at::cat(merged.lse, 2);
    ctx->save_for_backward({q, k, v, out, lse});
    detail::save_group(ctx, *ring.group);
    ctx->saved_data["cp"] = ring.cp;
    ctx->saved_data["rank"] = ring.rank;
    ctx->saved_data["load_balance"] = ring.load_balance;
    ctx->saved_data["causal"] = ring.spec.causal;
    ctx->saved_data["sliding_window"] = ring.spec.sliding_window;
    ctx->saved_data["softcap"] = ring.spec.softcap;
    ctx->saved_data["scale"] = ring.spec.scale;
    ctx->saved_data["method"] = static_cast<int64_t>(ring.method);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const BlockSpec spec{ctx->saved_data["causal"].toBool(), ctx->saved_data["sliding_window"].toInt(),
                         ctx->saved_data["softcap"].toDouble(), ctx->saved_data["scale"].toDouble()};
    const Ring ring{&detail::load_group(ctx), ctx->saved_data["cp"].toInt(), ctx->saved_data["rank"].toInt(),
                    ctx->saved_data["load_balance"].toBool(), spec, static_cast<RotateMethod>(ctx->saved_data["method"].toInt())};
    const at::Tensor dout = grads[0].contiguous();
    const int64_t n_rep = q.size(1) / k.size(1);
    const int64_t m = q.size(2) / ring.per_rank();
    auto chunk = [m](const at::Tensor& x, int64_t i) { return x.narrow(2, i * m, m); };
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    // The gradients of one source rank's block, accumulated into dk, dv (fp32, its shape).
    auto back = [&](int64_t src, const at::Tensor& ks, const at::Tensor& vs, at::Tensor& dk, at::Tensor& dv) {
      ring.blocks_of(src, m, q, [&](int64_t a, int64_t b, const BlockMask& mask) {
        auto [gq, gk, gv] = internal::block_backward(chunk(dout, a), chunk(q, a), repeat_kv(chunk(ks, b), n_rep),
                                                     repeat_kv(chunk(vs, b), n_rep), chunk(out, a), chunk(lse, a), mask, ring.spec);
        chunk(dq, a).add_(gq.to(at::kFloat));
        chunk(dk, b).add_(sum_kv(gk.to(at::kFloat), n_rep));
        chunk(dv, b).add_(sum_kv(gv.to(at::kFloat), n_rep));
      });
    };
    auto zeros = [&](const at::Tensor& like) { return at::zeros(like.sizes(), like.options().dtype(at::kFloat)); };
    at::Tensor dk, dv;
    if (ring.cp == 1) {
      dk = zeros(k), dv = zeros(v);
      back(0, k, v, dk, dv);
    } else if (ring.method == RotateMethod::allgather) {
      // The forward's all-gather again, in flight while this rank's own blocks' gradients are computed; then one
      // reduce-scatter takes every block's [dk; dv] (fp32, rank r's at [r n, (r + 1) n)) to the rank that owns it.
      at::Tensor mine = Ring::pack(k, v);
      const int64_t n = mine.numel();
      at::Tensor all = at::empty({ring.cp * n}, mine.options());
      Work w = ring.gather(all, mine);
      at::Tensor grads = at::zeros({ring.cp * n}, k.options().dtype(at::kFloat));
      auto slot = [&](int64_t src) { return Ring::unpack(grads.narrow(0, src * n, n), k); };
      {
        auto [dk_own, dv_own] = slot(ring.rank);
        back(ring.rank, k, v, dk_own, dv_own);
      }
      w.wait();
      for (int64_t src = 0; src < ring.cp; ++src) {
        if (src == ring.rank) continue;
        auto [ks, vs] = Ring::unpack(all.narrow(0, src * n, n), k);
        auto [dk_src, dv_src] = slot(src);
        back(src, ks, vs, dk_src, dv_src);
      }
      at::Tensor home = at::empty({n}, grads.options());
      ring.group->reduce_scatter_into(home, grads, ReduceOp::SUM);
      std::tie(dk, dv) = Ring::unpack(home, k);
    } else {
      // The block and its gradients' accumulator travel together; after cp rotations the accumulator is home.
      at::Tensor held = Ring::pack(k, v);
      at::Tensor acc = at::zeros({2 * k.numel()}, k.options().dtype(at::kFloat));
      for (int64_t t = 0; t < ring.cp; ++t) {
        at::Tensor next = at::empty_like(held);
        Work w;
        if (t + 1 < ring.cp) w = ring.rotate(next, held);
        auto [ks, vs] = Ring::unpack(held, k);
        auto [dk_held, dv_held] = Ring::unpack(acc, k);
        back(ring.source(t), ks, vs, dk_held, dv_held);
        w.wait();
        at::Tensor acc_next = at::empty_like(acc);
        ring.rotate(acc_next, acc).wait();
        acc = acc_next;
        held = next;
      }
      std::tie(dk, dv) = Ring::unpack(acc, k);
    }
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), {}};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                          std::optional<double> scale, const DeviceMesh& cp_mesh, const RingAttentionOptions& options,
                          const nn::AttentionKwargs& kwargs) {
  DTENSOR_CHECK(cp_mesh.ndim() == 1, "dtensor: ring attention needs a 1-D mesh, got ", cp_mesh.to_string());
  DTENSOR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                    q.size(2) == k.size(2) && q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
                "dtensor: ring attention takes q [b, heads, s, d] and k, v [b, kv_heads, s, d] (kv_heads dividing heads), "
                "got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  const int64_t per_rank = options.load_balance ? 2 : 1;
  DTENSOR_CHECK(q.size(2) % per_rank == 0, "dtensor: ring attention: a load-balanced shard holds two chunks, but its "
                "length ", q.size(2), " is odd");
  DTENSOR_CHECK(kwargs.sliding_window >= 0 && kwargs.softcap >= 0 && (kwargs.sliding_window == 0 || is_causal),
                "dtensor: ring attention: a sliding window (", kwargs.sliding_window, ") needs causal attention, and "
                "neither it nor softcap (", kwargs.softcap, ") may be negative");
  const BlockSpec spec{is_causal, kwargs.sliding_window, kwargs.softcap,
                       scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)))};
  Ring ring{&cp_mesh.get_group(0), cp_mesh.size(), cp_mesh.get_local_rank(0), options.load_balance, spec,
            options.rotate_method};
  return RingAttentionFn::apply(q, k, v, ring);
}

}  // namespace dtensor::cp
