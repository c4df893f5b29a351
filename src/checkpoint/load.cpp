// load(): read and check everything (contents.h), plan the copies (each held box intersected with each saved
// chunk: the resharding), agree across ranks, and only then copy. Nothing is written into `state` until every
// rank knows that every rank can load.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "checkpoint/agreement.h"
#include "checkpoint/chunks.h"
#include "checkpoint/contents.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/mesh/watchdog.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"

namespace dtensor::checkpoint {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 5; ++i) s += (i ? ", " : "") + ("'" + names[i] + "'");
  if (names.size() > 5) s += " and " + std::to_string(names.size() - 5) + " more";
  return s;
}

// A planned copy: `dst` (a view of what this rank holds) gets `src` (a view of a memory-mapped chunk).
struct Copy {
  at::Tensor dst, src;
  const detail::SavedChunk* chunk = nullptr;  // where src lies: its pages are given back after the copy
  bool in_place = false;  // dst is the whole held tensor and src one contiguous range in its dtype: dst takes src
};

// Whether `held` (all of what a rank holds of one tensor) can take `src` (the one saved range covering it) as its
// storage: same dtype, both contiguous, on the CPU, src aligned to its element size.
bool can_map(const at::Tensor& held, const at::Tensor& src) {
  return held.scalar_type() == src.scalar_type() && held.device().is_cpu() && held.is_contiguous() &&
         src.is_contiguous() && reinterpret_cast<uintptr_t>(src.data_ptr()) % src.element_size() == 0;
}

struct Plan {
  detail::Contents contents;
  std::vector<Copy> copies;
  std::vector<at::Tensor> zero_fills;
};

Plan make_plan(const std::string& dir, const StateDict& state, const LoadOptions& options, int rank, int world) {
  Plan plan;
  plan.contents = detail::read_contents(dir, rank, options.verify_checksums ? world : 0);
  const auto& entries = plan.contents.entries;
  const std::string where = "dtensor: checkpoint: load('" + dir + "'): ";

  std::vector<std::string> missing, unused;
  for (const auto& [name, _] : state) {
    if (!entries.count(name)) missing.push_back(name);
  }
  auto allowed = [&](const std::string& name) {
    for (const std::string& a : options.allow_unused_names) {
      if (!a.empty() && a.back() == '*' ? name.compare(0, a.size() - 1, a, 0, a.size() - 1) == 0 : name == a) return true;
    }
    return false;
  };
  for (const auto& [name, _] : entries) {
    if (!state.count(name) && !allowed(name)) unused.push_back(name);
  }
  DTENSOR_CHECK(missing.empty(), where, "not in the checkpoint: ", name_list(missing));
  DTENSOR_CHECK(unused.empty() || options.allow_unused, where, "in the checkpoint but not in the state: ",
                name_list(unused), " (LoadOptions::allow_unused_names ignores the ones it names)");

  for (const auto& [name, t] : state) {
    const detail::SavedEntry& e = entries.at(name);
    DTENSOR_CHECK(t.sizes().vec() == e.shape, where, "'", name, "' has shape ", shape_str(e.shape),
                  " in the checkpoint, ", shape_str(t.sizes().vec()), " in the state");
    DTENSOR_CHECK(t.scalar_type() == e.dtype || options.allow_dtype_cast, where, "'", name, "' is ",
                  c10::toString(e.dtype), " in the checkpoint, ", c10::toString(t.scalar_type()),
                  " in the state (LoadOptions::allow_dtype_cast converts)");
    const auto h = detail::held(t);
    if (!h || h->box.numel() == 0) continue;
    if (h->zero_on_load) {
      plan.zero_fills.push_back(h->data);
      continue;
    }
    // Resharding: the saved chunks that overlap what this rank holds, and only their common parts.
    int64_t covered = 0;
    const size_t first = plan.copies.size();
    for (const detail::SavedChunk& chunk : e.chunks) {
      const auto part = detail::intersect(h->box, chunk.box);
      if (!part) continue;
      plan.copies.push_back({detail::narrow_to(h->data, h->box, *part),
                             detail::narrow_to(chunk.file->view(*chunk.stored), chunk.box, *part), &chunk});
      covered += part->numel();
    }
    if (options.map_in_place && plan.copies.size() == first + 1 && plan.copies.back().dst.numel() == h->data.numel()) {
      Copy& only = plan.copies.back();
      only.dst = h->data;  // the held tensor itself (the same TensorImpl as the parameter's, or the DTensor's local)
      only.in_place = can_map(only.dst, only.src);
    }
    DTENSOR_CHECK(covered == h->box.numel(), where, "the saved chunks of '", name, "' cover ", covered, " of the ",
                  h->box.numel(), " elements of ", h->box.to_string(), " that this rank holds");
  }
  return plan;
}

}  // namespace

void load(const std::string& dir, StateDict& state, const LoadOptions& options) {
  const watchdog::Phase phase("checkpoint load", std::chrono::minutes(30));
  const auto group_ptr = detail::checkpoint_group();
  ProcessGroup* group = group_ptr.get();
  Plan plan;
  std::string err;
  try {
    plan = make_plan(dir, state, options, detail::group_rank(group), detail::group_size(group));
  } catch (const std::exception& e) {
    err = e.what();
  }
  detail::agree_or_throw(group, err);  // every rank checked everything: from here on nothing can be half done

  at::NoGradGuard no_grad;
  // A copy reads this rank's slice through the file's mapping; its pages are then given back, so that a rank's
  // resident memory is what it holds, not the checkpoint it read from. With map_in_place the tensors that can take
  // their range of the mapping as storage do (LoadOptions), and the pages are left to the page cache.
  // A copied range's pages are given back even where an edge page is shared with a tensor loaded in place: nothing
  // has written to the mapping yet, so that tensor faults the same bytes in again.
  for (auto& c : plan.copies) {
    if (c.in_place) {
      c.dst.set_(c.src);
      continue;
    }
    c.dst.copy_(c.src);
    c.chunk->file->release_pages(*c.chunk->stored);
  }
  for (auto& z : plan.zero_fills) z.zero_();
}

}  // namespace dtensor::checkpoint
