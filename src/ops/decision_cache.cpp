#include "ops/decision_cache.h"

#include <cstring>
#include <string>

#include "dtensor/ops/dispatch_options.h"
#include "ops/op_table.h"
#include "tensor/dtensor_impl.h"

namespace dtensor {

DispatchStats& dispatch_stats() {
  thread_local DispatchStats stats;
  return stats;
}

namespace ops {
namespace {

void put_tensor(std::vector<int64_t>& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(-7);
    return;
  }
  auto* impl = detail::get_impl(t);
  key.push_back(impl ? 1 : 2);
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  for (int64_t s : t.sizes()) key.push_back(s);
  if (impl) {
    const DTensorSpec& spec = impl->spec();
    // The mesh's serial, never its address: the cache holds no mesh, and a later mesh may take a dead one's address.
    // An entry is not only a decision (which depends on the mesh's shape alone): a from_locals entry holds the
    // output sizes exchange_sizes learnt with a collective on that mesh's group, skipped on a hit. Hit on a new mesh
    // at a reused address (the plan search's dry runs on a fake world, then training), it would let one rank skip a
    // collective the other makes, and the ranks fall out of step.
    key.push_back(static_cast<int64_t>(spec.mesh.serial()));
    for (int64_t s : spec.mesh.shape()) key.push_back(s);
    for (const auto& p : spec.placements) key.push_back(static_cast<int64_t>(p.hash()));
    for (int64_t s : spec.meta.stride) key.push_back(s);
  }
}

// The cache key: op, tensors' specs, non-tensor args. Returns false for args it cannot key (no caching).
bool build_key(const OpCall& call, std::vector<int64_t>& key) {
  key.push_back(reinterpret_cast<intptr_t>(&call.op.schema()));
  for (size_t i = 0; i < call.num_args(); ++i) {
    const c10::IValue& v = call.arg(i);
    if (v.isTensor()) {
      put_tensor(key, v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      key.push_back(-1000 - static_cast<int64_t>(list.size()));
      for (size_t k = 0; k < list.size(); ++k) put_tensor(key, list.get(k));
    } else if (v.isNone()) {
      key.push_back(-3);
    } else if (v.isInt()) {
      key.push_back(-4);
      key.push_back(v.toInt());
    } else if (v.isBool()) {
      key.push_back(v.toBool() ? -5 : -6);
    } else if (v.isDouble()) {
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(-8);
      key.push_back(bits);
    } else if (v.isIntList()) {
      auto list = v.toIntList();
      key.push_back(-2000 - static_cast<int64_t>(list.size()));
      for (int64_t x : list) key.push_back(x);
    } else if (v.isScalar()) {
      // Scalars that are not Int/Double/Bool (complex, symbolic): not keyed.
      return false;
    } else if (v.isDevice()) {
      key.push_back(-9);
      key.push_back(static_cast<int64_t>(v.toDevice().type()));
    } else if (v.isString()) {
      key.push_back(-10);
      key.push_back(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef())));
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

size_t DecisionCache::KeyHash::operator()(const std::vector<int64_t>& k) const {
  size_t h = 1469598103934665603ull;
  for (int64_t w : k) h = (h ^ static_cast<size_t>(w)) * 1099511628211ull;
  return h;
}

DecisionCache& DecisionCache::local() {
  thread_local DecisionCache cache;
  return cache;
}

bool DecisionCache::key(const OpCall& call) {
  key_.clear();
  return build_key(call, key_);
}

CachedDecision* DecisionCache::find() {
  const uint64_t generation = rules_generation();
  if (generation != generation_) {  // a rule was replaced: what we learnt may be stale
    entries_.clear();
    generation_ = generation;
  }
  auto it = entries_.find(key_);
  return it == entries_.end() ? nullptr : &it->second;
}

CachedDecision* DecisionCache::insert(CachedDecision entry) {
  if (entries_.size() >= kMaxEntries) entries_.clear();
  return &entries_.insert_or_assign(key_, std::move(entry)).first->second;
}

}  // namespace ops
}  // namespace dtensor
