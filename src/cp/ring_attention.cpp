// Ring attention (context_parallel.h states the algebra): block attention with log-sum-exp merging, the keys and
// values travelling by all-gather or by a ring of rotations, and the backward from the merged output.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#include "dtensor/core/error.h"
#include "dtensor/cp/context_parallel.h"
#include "dtensor/mesh/functional_collectives.h"
#include "cp/layout.h"
#include "mesh/autograd_comm_scope.h"

namespace dtensor::cp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using internal::chunks_of;
using nn::repeat_kv;

// How query chunk i sees key chunk j: 0 not at all, 1 causally (the diagonal), 2 whole.
int visibility(int64_t i, int64_t j, bool causal) {
  if (!causal) return 2;
  return j < i ? 2 : j == i ? 1 : 0;
}

// The gradient of repeat_kv: each key/value head's copies summed.
at::Tensor sum_kv(const at::Tensor& g, int64_t n_rep) {
  if (n_rep == 1) return g;
  const int64_t b = g.size(0), h = g.size(1), t = g.size(2), d = g.size(3);
  return g.view({b, h / n_rep, n_rep, t, d}).sum(2);
}

at::Tensor causal_fill(const at::Tensor& scores) {
  const int64_t s = scores.size(-2), t = scores.size(-1);
  const at::Tensor above = at::ones({s, t}, scores.options().dtype(at::kBool)).triu(1);
  return scores.masked_fill(above, -std::numeric_limits<float>::infinity());
}

// One block: (out [b, h, s, d] in q's dtype, lse [b, h, s] fp32). The CPU's flash kernel, else the math.
std::pair<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                                double scale) {
  if (q.device().is_cpu()) {
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, std::nullopt, scale);
    return {o, l};
  }
  at::Tensor s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-1, -2)) * scale;
  if (causal) s = causal_fill(s);
  const at::Tensor lse = s.logsumexp(-1);
  return {at::matmul(at::exp(s - lse.unsqueeze(-1)), v.to(at::kFloat)).to(q.scalar_type()), lse};
}

// A block's (dq, dk, dv) given the merged output and log-sum-exp of its queries (flash attention's backward).
std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                              bool causal, double scale) {
  if (q.device().is_cpu()) {
    return at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal, std::nullopt, scale);
  }
  const at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat), dof = dout.to(at::kFloat);
  at::Tensor s = at::matmul(qf, kf.transpose(-1, -2)) * scale;
  if (causal) s = causal_fill(s);
  const at::Tensor p = at::exp(s - lse.unsqueeze(-1));
  const at::Tensor dv = at::matmul(p.transpose(-1, -2), dof);
  const at::Tensor dp = at::matmul(dof, vf.transpose(-1, -2));
  const at::Tensor ds = p * (dp - (dof * out.to(at::kFloat)).sum(-1, true));
  return {(at::matmul(ds, kf) * scale).to(q.scalar_type()), (at::matmul(ds.transpose(-1, -2), qf) * scale).to(k.scalar_type()),
          dv.to(v.scalar_type())};
}

struct Ring {
  ProcessGroup* group;
  int64_t cp, rank;
  bool causal, load_balance;
  double scale;
  RotateMethod method;

  int64_t per_rank() const { return load_balance ? 2 : 1; }
  // The rank whose block this rank holds at step t of the ring (its own at t = 0).
  int64_t source(int64_t t) const { return ((rank - t) % cp + cp) % cp; }

  // Every rank's shard has x's length: known, so no size agreement travels with the all-gather.
  std::vector<int64_t> sizes(const at::Tensor& x) const { return std::vector<int64_t>(static_cast<size_t>(cp), x.size(2)); }
  at::Tensor gather(const at::Tensor& x) const { return all_gather(x, 2, *group, sizes(x)); }

  // [k; v] of one rank, flat, and back.
  static at::Tensor pack(const at::Tensor& k, const at::Tensor& v) { return at::cat({k.reshape({-1}), v.reshape({-1})}); }
  static std::pair<at::Tensor, at::Tensor> unpack(const at::Tensor& kv, const at::Tensor& like) {
    const int64_t n = like.numel();
    return {kv.narrow(0, 0, n).view(like.sizes()), kv.narrow(0, n, n).view(like.sizes())};
  }
  // Starts sending `buf` to the next rank and receiving the previous rank's into `into`.
  Work rotate(at::Tensor& into, at::Tensor& buf) const {
    std::vector<int64_t> in_splits(static_cast<size_t>(cp), 0), out_splits(static_cast<size_t>(cp), 0);
    in_splits[static_cast<size_t>((rank + 1) % cp)] = buf.numel();
    out_splits[static_cast<size_t>((rank + cp - 1) % cp)] = buf.numel();
    return group->all_to_all_single_async(into, buf, out_splits, in_splits);
  }

  // Visits every visible (local query chunk a, source rank's key chunk b) block with `f(a, b, visibility)`, for the
  // block of source rank `src` whose keys and values are k_src, v_src.
  template <typename F>
  void blocks_of(int64_t src, F&& f) const {
    const auto mine = chunks_of(rank, cp, load_balance), theirs = chunks_of(src, cp, load_balance);
    for (size_t a = 0; a < mine.size(); ++a) {
      for (size_t b = 0; b < theirs.size(); ++b) {
        const int vis = visibility(mine[a], theirs[b], causal);
        if (vis) f(static_cast<int64_t>(a), static_cast<int64_t>(b), vis == 1);
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
    const at::Tensor merged = at::logaddexp(acc_lse, l);
    acc = acc * at::exp(acc_lse - merged).unsqueeze(-1) + o.to(at::kFloat) * at::exp(l - merged).unsqueeze(-1);
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
      ring.blocks_of(src, [&](int64_t a, int64_t b, bool diagonal) {
        auto [o, l] = block_forward(chunk(q, a), repeat_kv(chunk(ks, b), n_rep), repeat_kv(chunk(vs, b), n_rep), diagonal,
                                    ring.scale);
        merged.add(a, o, l);
      });
    };
    if (ring.cp == 1) {
      attend(0, k, v);
    } else if (ring.method == RotateMethod::allgather) {
      const at::Tensor ks = ring.gather(k), vs = ring.gather(v);
      const int64_t s = k.size(2);
      for (int64_t src = 0; src < ring.cp; ++src) attend(src, ks.narrow(2, src * s, s), vs.narrow(2, src * s, s));
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
    ctx->saved_data["causal"] = ring.causal;
    ctx->saved_data["load_balance"] = ring.load_balance;
    ctx->saved_data["scale"] = ring.scale;
    ctx->saved_data["method"] = static_cast<int64_t>(ring.method);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Ring ring{&detail::load_group(ctx), ctx->saved_data["cp"].toInt(), ctx->saved_data["rank"].toInt(),
                    ctx->saved_data["causal"].toBool(), ctx->saved_data["load_balance"].toBool(),
                    ctx->saved_data["scale"].toDouble(), static_cast<RotateMethod>(ctx->saved_data["method"].toInt())};
    const at::Tensor dout = grads[0].contiguous();
    const int64_t n_rep = q.size(1) / k.size(1);
    const int64_t m = q.size(2) / ring.per_rank();
    auto chunk = [m](const at::Tensor& x, int64_t i) { return x.narrow(2, i * m, m); };
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    // The gradients of one source rank's block, accumulated into dk, dv (fp32, its shape).
    auto back = [&](int64_t src, const at::Tensor& ks, const at::Tensor& vs, at::Tensor& dk, at::Tensor& dv) {
      ring.blocks_of(src, [&](int64_t a, int64_t b, bool diagonal) {
        auto [gq, gk, gv] = block_backward(chunk(dout, a), chunk(q, a), repeat_kv(chunk(ks, b), n_rep),
                                           repeat_kv(chunk(vs, b), n_rep), chunk(out, a), chunk(lse, a), diagonal, ring.scale);
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
      const at::Tensor ks = ring.gather(k), vs = ring.gather(v);
      at::Tensor dks = zeros(ks), dvs = zeros(vs);
      const int64_t s = k.size(2);
      for (int64_t src = 0; src < ring.cp; ++src) {
        at::Tensor dk_src = dks.narrow(2, src * s, s), dv_src = dvs.narrow(2, src * s, s);
        back(src, ks.narrow(2, src * s, s), vs.narrow(2, src * s, s), dk_src, dv_src);
      }
      dk = reduce_scatter(dks, ReduceOp::SUM, 2, *ring.group, ring.sizes(k));  // each block's gradient to its owner
      dv = reduce_scatter(dvs, ReduceOp::SUM, 2, *ring.group, ring.sizes(v));
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
                          std::optional<double> scale, const DeviceMesh& cp_mesh, const RingAttentionOptions& options) {
  DTENSOR_CHECK(cp_mesh.ndim() == 1, "dtensor: ring attention needs a 1-D mesh, got ", cp_mesh.to_string());
  DTENSOR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                    q.size(2) == k.size(2) && q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
                "dtensor: ring attention takes q [b, heads, s, d] and k, v [b, kv_heads, s, d] (kv_heads dividing heads), "
                "got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  const int64_t per_rank = options.load_balance ? 2 : 1;
  DTENSOR_CHECK(q.size(2) % per_rank == 0, "dtensor: ring attention: a load-balanced shard holds two chunks, but its "
                "length ", q.size(2), " is odd");
  Ring ring{&cp_mesh.get_group(0), cp_mesh.size(), cp_mesh.get_local_rank(0), is_causal, options.load_balance,
            scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))), options.rotate_method};
  return RingAttentionFn::apply(q, k, v, ring);
}

}  // namespace dtensor::cp
