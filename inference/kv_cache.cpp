#include "inference/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "dtensor/core/error.h"

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

std::vector<std::shared_ptr<models::KVCacheLayer>> make_kv_caches(const llama::LlamaConfig& config, int64_t max_len) {
  std::vector<std::shared_ptr<models::KVCacheLayer>> caches;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    caches.push_back(std::make_shared<KVCache>(max_len, config.layer_slides(l) ? config.attention.sliding_window : 0));
  }
  return caches;
}

}  // namespace inference
