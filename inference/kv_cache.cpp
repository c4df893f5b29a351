#include "inference/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/forward_context.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/nn/attention.h"
#include "dtensor/tensor/dtensor.h"
#include "inference/paged_attention.h"

namespace inference {

KVCache::KVCache(int64_t max_len, int64_t window) : max_len_(max_len), window_(window) {
  DTENSOR_CHECK(max_len > 0, "inference: KVCache max_len must be positive, got ", max_len);
  DTENSOR_CHECK(window >= 0, "inference: KVCache window must be >= 0, got ", window);
}

std::pair<at::Tensor, at::Tensor> KVCache::update(const at::Tensor& k, const at::Tensor& v) {
  const int64_t s = k.size(2);
  DTENSOR_CHECK(length_ + s <= max_len_, "inference: KVCache holds ", max_len_, " positions; ", length_,
                " are filled and ", s, " more were given");
  if (k_.defined() && (k.size(0) != k_.size(0) || k.size(1) != k_.size(1))) {
    throw DTENSOR_ERROR("inference: KVCache was filled for batch ", k_.size(0), " and ", k_.size(1), " heads; got batch ",
                        k.size(0), " and ", k.size(1), " heads (clear the cache between generations)");
  }
  if (window_ > 0) {
    // The kept W - 1 positions, then the new ones: what this step's queries may see.
    at::Tensor keys = k_.defined() ? at::cat({k_, k}, 2) : k;
    at::Tensor values = v_.defined() ? at::cat({v_, v}, 2) : v;
    first_ = length_ - (k_.defined() ? k_.size(2) : 0);
    length_ += s;
    const int64_t kept_from = models::sliding_first_kept(length_, window_);  // keys holds [first_, length_)
    k_ = keys.narrow(2, kept_from - first_, length_ - kept_from);
    v_ = values.narrow(2, kept_from - first_, length_ - kept_from);
    return {keys, values};
  }
  if (!k_.defined()) {
    // [b, kv_heads, max_len, head_dim]; under TP the heads dim keeps k's shard: only this rank's heads.
    k_ = k.new_zeros({k.size(0), k.size(1), max_len_, k.size(3)});
    v_ = v.new_zeros({v.size(0), v.size(1), max_len_, v.size(3)});
  }
  k_.narrow(2, length_, s).copy_(k);
  v_.narrow(2, length_, s).copy_(v);
  length_ += s;
  return {k_.narrow(2, 0, length_), v_.narrow(2, 0, length_)};
}

at::Tensor KVCache::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale,
                           const dtensor::nn::AttentionKwargs& kwargs) {
  const models::ForwardContext* ctx = models::forward_context();
  const int64_t b = q.size(0), s = q.size(2), past = length_;
  if (window_ > 0 || !ctx || static_cast<int64_t>(ctx->left_padding.size()) != b || s > kKernelRows ||
      past + s > max_len_ || dtensor::nn::attention_overridden()) {
    return {};
  }
  // A query in a row's padding (a prefill of short prompts) sees no key: the model's mask decides what it gets.
  for (int64_t pad : ctx->left_padding) if (pad > past) return {};
  const bool distributed = dtensor::is_dtensor(q);
  // Under TP q and the cache are sharded by heads alike: each rank attends over its own heads.
  if (distributed && !sharded_by_heads_alike(q, k)) return {};
  const at::Tensor q_local = distributed ? dtensor::to_local(q) : q;
  if (std::strcmp(paged_attention_route(q_local, distributed ? dtensor::to_local(k) : k, s), "kernel") != 0) return {};
  update(k, v);
  const at::Tensor cache_k = distributed ? dtensor::to_local(k_) : k_, cache_v = distributed ? dtensor::to_local(v_) : v_;
  DTENSOR_CHECK(cache_k.is_contiguous() && cache_v.is_contiguous(), "inference: KVCache's buffers are not contiguous");
  // The cache [b, kv_heads, max_len, d] as one pool [1, kv_heads, slots, d] (paged_attention.h): head g of row r,
  // position p lies at (r * kv_heads + g) * max_len + p rows of d, so with a head stride of max_len * d the slot of
  // (r, p) is r * kv_heads * max_len + p for every head. The view reaches exactly the buffer's last element.
  const int64_t kv_heads = cache_k.size(1), d = cache_k.size(3), row_slots = kv_heads * max_len_;
  const std::vector<int64_t> pool_size{1, kv_heads, (b - 1) * row_slots + max_len_, d};
  const std::vector<int64_t> pool_stride{b * row_slots * d, max_len_ * d, d, 1};
  const at::Tensor pool_k = cache_k.as_strided(pool_size, pool_stride), pool_v = cache_v.as_strided(pool_size, pool_stride);
  // Row r is sequence r of the step: its s new tokens at positions past - pad .. past - pad + s - 1 of its own, its
  // keys the cache's positions [pad, past + s).
  models::PagedStep step;
  step.positions = at::empty({b * s}, at::kLong);
  int64_t keys = 0;
  for (int64_t pad : ctx->left_padding) keys += past + s - pad;
  step.key_slots = at::empty({keys}, at::kLong);
  int64_t* pos = step.positions.data_ptr<int64_t>();
  int64_t* slot = step.key_slots.data_ptr<int64_t>();
  step.query_start.push_back(0), step.key_start.push_back(0);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t pad = ctx->left_padding[static_cast<size_t>(r)];
    for (int64_t i = 0; i < s; ++i) *pos++ = past - pad + i;
    for (int64_t p = pad; p < past + s; ++p) *slot++ = r * row_slots + p;
    step.query_start.push_back((r + 1) * s);
    step.key_start.push_back(step.key_start.back() + past + s - pad);
  }
  // q [b, heads, s, d] as [1, heads, b * s, d]: row r * s + i is row r's token i.
  const int64_t heads = q_local.size(1);
  const at::Tensor packed_q = q_local.transpose(1, 2).contiguous().view({1, b * s, heads, d}).transpose(1, 2);
  const at::Tensor out = paged_attention(packed_q, pool_k, pool_v, step, scale, kwargs)
                             .transpose(1, 2).view({b, s, heads, d}).transpose(1, 2);
  if (!distributed) return out;
  return dtensor::DTensor::from_local(out, dtensor::device_mesh(q), dtensor::placements(q), /*run_check=*/false,
                                      q.sizes().vec());
}

std::vector<std::shared_ptr<models::KVCacheLayer>> make_kv_caches(const llama::LlamaConfig& config, int64_t max_len) {
  std::vector<std::shared_ptr<models::KVCacheLayer>> caches;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    caches.push_back(std::make_shared<KVCache>(max_len, config.layer_slides(l) ? config.attention.sliding_window : 0));
  }
  return caches;
}

}  // namespace inference
