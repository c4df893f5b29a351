#include "inference/paged_kv_cache.h"

#include <ATen/ATen.h>

#include "common/forward_context.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/tensor/dtensor.h"
#include "inference/paged_attention.h"

namespace inference {

PagedStep pack_step(const std::vector<PagedChunk>& chunks, int64_t block_size) {
  DTENSOR_CHECK(block_size > 0, "inference: pack_step needs a positive block size, got ", block_size);
  std::vector<int64_t> tokens, positions, query_seq, write_slots, key_slots, key_pos, key_seq, logit_rows;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const PagedChunk& c = chunks[i];
    const int64_t end = c.start + static_cast<int64_t>(c.tokens.size());
    DTENSOR_CHECK(!c.tokens.empty() && c.start >= 0, "inference: pack_step: chunk ", i, " has no new tokens");
    DTENSOR_CHECK(static_cast<int64_t>(c.block_table.size()) * block_size >= end, "inference: pack_step: chunk ", i,
                  " reaches position ", end - 1, " but its ", c.block_table.size(), " blocks of ", block_size,
                  " hold fewer");
    auto slot = [&](int64_t p) { return c.block_table[p / block_size] * block_size + p % block_size; };
    for (int64_t p = c.start; p < end; ++p) {
      tokens.push_back(c.tokens[p - c.start]);
      positions.push_back(p);
      query_seq.push_back(static_cast<int64_t>(i));
      write_slots.push_back(slot(p));
    }
    for (int64_t p = 0; p < end; ++p) {
      key_slots.push_back(slot(p));
      key_pos.push_back(p);
      key_seq.push_back(static_cast<int64_t>(i));
    }
    DTENSOR_CHECK(c.logits >= 0 && c.logits <= static_cast<int64_t>(c.tokens.size()), "inference: pack_step: chunk ", i,
                  " asks for the logits of ", c.logits, " of its ", c.tokens.size(), " tokens");
    for (int64_t j = c.logits; j > 0; --j) logit_rows.push_back(static_cast<int64_t>(tokens.size()) - j);
  }
  auto t = [](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); };
  PagedStep step{t(tokens), t(positions), t(query_seq), t(write_slots), t(key_slots), t(key_pos), t(key_seq), t(logit_rows), {}, {}, false};
  index_sequences(step);
  return step;
}

PagedKVCache::PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size), k_(num_layers), v_(num_layers) {
  DTENSOR_CHECK(num_layers > 0 && num_blocks > 0 && block_size > 0,
                "inference: PagedKVCache needs positive layers, blocks and block size; got ", num_layers, ", ", num_blocks,
                ", ", block_size);
}

void PagedKVCache::write(int64_t layer, const at::Tensor& k, const at::Tensor& v, const PagedStep& step) {
  DTENSOR_CHECK(layer >= 0 && layer < static_cast<int64_t>(k_.size()), "inference: PagedKVCache has no layer ", layer);
  const at::Tensor &write_slots = step.write_slots, &key_slots = step.key_slots;
  if (layer == 0) {  // a step's slots, checked once (its first layer)
    auto check = [&](const at::Tensor& slots, const char* what) {
      DTENSOR_CHECK(slots.dim() == 1, "inference: PagedKVCache ", what, " slots must be 1-d");
      if (slots.numel() == 0) return;
      DTENSOR_CHECK(slots.min().item<int64_t>() >= 0 && slots.max().item<int64_t>() < num_slots(), "inference: "
                    "PagedKVCache ", what, " slot outside [0, ", num_slots(), ")");
    };
    check(write_slots, "write");
    check(key_slots, "key");
  }
  DTENSOR_CHECK(k.dim() == 4 && k.size(0) == 1 && k.size(2) == write_slots.numel(),
                "inference: PagedKVCache takes keys [1, kv_heads, T, head_dim] with T = the step's ", write_slots.numel(),
                " tokens, got ", k.sizes());
  at::Tensor& pool_k = k_[layer];
  at::Tensor& pool_v = v_[layer];
  if (!pool_k.defined()) {
    // [1, kv_heads, slots, head_dim]; under TP the heads dim keeps k's shard: only this rank's heads.
    pool_k = k.new_zeros({1, k.size(1), num_slots(), k.size(3)});
    pool_v = v.new_zeros({1, v.size(1), num_slots(), v.size(3)});
  }
  // Slots are dim 2, never sharded: both are local on every rank.
  pool_k.index_copy_(2, write_slots, k);
  pool_v.index_copy_(2, write_slots, v);
}

std::pair<at::Tensor, at::Tensor> PagedKVCache::update(int64_t layer, const at::Tensor& k, const at::Tensor& v,
                                                     const PagedStep& step) {
  DTENSOR_CHECK(!step.attention_from_pool, "inference: a step packed for attention from the pool (attend) was read "
                "through update(): its model built no mask");
  write(layer, k, v, step);
  return {k_[layer].index_select(2, step.key_slots), v_[layer].index_select(2, step.key_slots)};
}

at::Tensor PagedKVCache::attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const PagedStep& step, std::optional<double> scale,
                                const dtensor::nn::AttentionKwargs& kwargs) {
  DTENSOR_CHECK(!dtensor::nn::attention_overridden(), "inference: a paged step's attention cannot run under an "
                "attention override (context parallelism)");
  write(layer, k, v, step);
  const at::Tensor &pool_k = k_[layer], &pool_v = v_[layer];
  if (!dtensor::is_dtensor(q)) return paged_attention(q, pool_k, pool_v, step, scale, kwargs);
  // Under TP q and the pools are sharded by heads (Shard(1)) alike: each rank attends over its own heads.
  const dtensor::Placements& p = dtensor::placements(q);
  DTENSOR_CHECK(sharded_by_heads_alike(q, pool_k), "inference: paged attention takes q and the KV pool sharded by "
                "heads alike (Shard(1) or Replicate); got q ", dtensor::dtensor_spec(q).to_string());
  const at::Tensor out = paged_attention(dtensor::to_local(q), dtensor::to_local(pool_k),
                                         dtensor::to_local(pool_v), step, scale, kwargs);
  return dtensor::DTensor::from_local(out, dtensor::device_mesh(q), p, /*run_check=*/false, q.sizes().vec());
}

namespace {

// Layer `layer` of a shared pool, as the model's attention sees its cache.
class PagedLayer : public models::KVCacheLayer {
 public:
  PagedLayer(std::shared_ptr<PagedKVCache> cache, int64_t layer) : cache_(std::move(cache)), layer_(layer) {}
  // The step's slots come with the forward's context (common/forward_context.h), as the model's mask does.
  std::pair<at::Tensor, at::Tensor> update(const at::Tensor& k, const at::Tensor& v) override {
    const models::ForwardContext* ctx = models::forward_context();
    DTENSOR_CHECK(ctx && ctx->paged_step, "inference: a paged KV cache is updated within a forward whose context has "
                  "the PagedStep");
    return cache_->update(layer_, k, v, *ctx->paged_step);
  }
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale,
                    const dtensor::nn::AttentionKwargs& kwargs) override {
    const models::ForwardContext* ctx = models::forward_context();
    DTENSOR_CHECK(ctx && ctx->paged_step, "inference: a paged KV cache attends within a forward whose context has "
                  "the PagedStep");
    if (!ctx->paged_step->attention_from_pool) return {};
    return cache_->attend(layer_, q, k, v, *ctx->paged_step, scale, kwargs);
  }
  int64_t length() const override { return 0; }
  bool paged() const override { return true; }

 private:
  std::shared_ptr<PagedKVCache> cache_;
  int64_t layer_;
};

}  // namespace

std::vector<std::shared_ptr<models::KVCacheLayer>> PagedKVCache::layers() {
  std::vector<std::shared_ptr<models::KVCacheLayer>> out;
  for (int64_t l = 0; l < static_cast<int64_t>(k_.size()); ++l) out.push_back(std::make_shared<PagedLayer>(shared_from_this(), l));
  return out;
}

}  // namespace inference
