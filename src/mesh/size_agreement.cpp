// Size agreement before a collective reaches Gloo (see size_agreement.h for why).
//
// Descriptor of one rank, int64[kFixed + 2n] (its length depends only on the group, so the exchange itself
// can never disagree): [collective, dtype, in bytes, out bytes, ndim, shape[0..kShapeDims), in_splits[n],
// out_splits[n]].
// Agreement, by collective (n = group size):
//   all ranks:       same collective, same dtype
//   all_reduce:      same in bytes
//   broadcast:       same in bytes
//   all_gather:      same in bytes; out bytes == n * in bytes
//   reduce_scatter:  same in bytes; out bytes == in bytes / n
//   all_to_all:      same bytes per row; rank i's out_splits[j] == rank j's in_splits[i]
//   all_gather rows: same ndim and sizes after dim 0 (the row counts may differ: an uneven gather)
#include "mesh/size_agreement.h"

#include "mesh/heartbeat.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdlib>
#include <sstream>
#include <string>

#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"
#include "mesh/group_text.h"

namespace dtensor::detail {
namespace {

constexpr int64_t kShapeDims = 6;
constexpr int64_t kFixed = 5 + kShapeDims;
static_assert(kFixed == kDescriptorSplitsAt);
enum Field : int64_t { COLLECTIVE = 0, DTYPE, IN_BYTES, OUT_BYTES, NDIM, SHAPE };

const char* name_of(int64_t collective) {
  switch (static_cast<SizedCollective>(collective)) {
    case SizedCollective::ALL_REDUCE: return "all_reduce";
    case SizedCollective::ALL_GATHER: return "all_gather";
    case SizedCollective::REDUCE_SCATTER: return "reduce_scatter";
    case SizedCollective::ALL_TO_ALL: return "all_to_all";
    case SizedCollective::BROADCAST: return "broadcast";
    case SizedCollective::BARRIER: return "barrier";
    case SizedCollective::ALL_GATHER_ROWS: return "all_gather";
  }
  return "an unknown collective";
}

int64_t nbytes(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

std::string describe_rank(const int64_t* d, int64_t n, bool with_splits) {
  std::ostringstream os;
  if (static_cast<SizedCollective>(d[COLLECTIVE]) == SizedCollective::BARRIER) return "barrier";
  os << name_of(d[COLLECTIVE]) << " of a " << c10::toString(static_cast<at::ScalarType>(d[DTYPE])) << " tensor [";
  for (int64_t k = 0; k < std::min(d[NDIM], kShapeDims); ++k) os << (k ? ", " : "") << d[SHAPE + k];
  if (d[NDIM] > kShapeDims) os << ", ...";
  os << "] (" << d[IN_BYTES] << " bytes in";
  if (static_cast<SizedCollective>(d[COLLECTIVE]) != SizedCollective::ALL_REDUCE &&
      static_cast<SizedCollective>(d[COLLECTIVE]) != SizedCollective::BROADCAST) {
    os << ", " << d[OUT_BYTES] << " bytes out";
  }
  os << ")";
  if (with_splits) {
    os << " with in_splits [";
    for (int64_t j = 0; j < n; ++j) os << (j ? ", " : "") << d[kFixed + j];
    os << "], out_splits [";
    for (int64_t j = 0; j < n; ++j) os << (j ? ", " : "") << d[kFixed + n + j];
    os << "]";
  }
  return os.str();
}

// Empty when the descriptors make one collective, else what is wrong.
std::string disagreement(const std::vector<const int64_t*>& all, int64_t n) {
  const int64_t* first = all[0];
  for (int64_t r = 1; r < n; ++r) {
    if (all[r][COLLECTIVE] != first[COLLECTIVE]) return "ranks called different collectives";
    if (all[r][DTYPE] != first[DTYPE] && static_cast<SizedCollective>(first[COLLECTIVE]) != SizedCollective::BARRIER) {
      return "ranks passed different dtypes";
    }
  }
  const auto kind = static_cast<SizedCollective>(first[COLLECTIVE]);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t* d = all[r];
    switch (kind) {
      case SizedCollective::BARRIER:
        break;
      case SizedCollective::ALL_REDUCE:
      case SizedCollective::BROADCAST:
        if (d[IN_BYTES] != first[IN_BYTES]) return "ranks passed tensors of different sizes";
        break;
      case SizedCollective::ALL_GATHER:
        if (d[IN_BYTES] != first[IN_BYTES]) return "ranks passed inputs of different sizes";
        if (d[OUT_BYTES] != n * d[IN_BYTES]) return "an output is not group size times the input";
        break;
      case SizedCollective::REDUCE_SCATTER:
        if (d[IN_BYTES] != first[IN_BYTES]) return "ranks passed inputs of different sizes";
        if (d[OUT_BYTES] * n != d[IN_BYTES]) return "an output is not the input divided by the group size";
        break;
      case SizedCollective::ALL_GATHER_ROWS: {
        // The row counts may differ; a row may not: its dims, and its bytes (dims past kShapeDims).
        if (d[NDIM] != first[NDIM]) return "ranks passed inputs with different numbers of dims";
        for (int64_t k = 1; k < std::min(d[NDIM], kShapeDims); ++k) {
          if (d[SHAPE + k] != first[SHAPE + k]) return "ranks passed inputs whose sizes differ beyond the gathered dim";
        }
        const bool both_have_rows = d[SHAPE] > 0 && first[SHAPE] > 0;
        if (both_have_rows && d[IN_BYTES] / d[SHAPE] != first[IN_BYTES] / first[SHAPE]) {
          return "ranks passed inputs whose sizes differ beyond the gathered dim";
        }
        break;
      }
      case SizedCollective::ALL_TO_ALL:
        for (int64_t j = 0; j < n; ++j) {
          if (d[kFixed + n + j] != all[j][kFixed + r]) {
            return "rank " + std::to_string(r) + " expects " + std::to_string(d[kFixed + n + j]) +
                   " rows from rank " + std::to_string(j) + ", which sends it " + std::to_string(all[j][kFixed + r]);
          }
        }
        break;
    }
  }
  return "";
}

}  // namespace

bool size_agreement_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DTENSOR_CHECK_COLLECTIVE_SIZES");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

int64_t descriptor_length(int64_t group_size) { return kFixed + 2 * group_size; }

std::vector<int64_t> size_descriptor(SizedCollective collective, const at::Tensor& in, const at::Tensor& out,
                                     const std::vector<int64_t>& in_splits, const std::vector<int64_t>& out_splits,
                                     int64_t n) {
  std::vector<int64_t> d(descriptor_length(n), 0);
  d[COLLECTIVE] = static_cast<int64_t>(collective);
  if (!in.defined()) return d;  // barrier
  d[DTYPE] = static_cast<int64_t>(in.scalar_type());
  d[IN_BYTES] = nbytes(in);
  d[OUT_BYTES] = nbytes(out);
  d[NDIM] = in.dim();
  for (int64_t k = 0; k < std::min<int64_t>(in.dim(), kShapeDims); ++k) d[SHAPE + k] = in.size(k);
  if (collective == SizedCollective::ALL_TO_ALL) {
    // Rows of dim 0; no splits means equal rows to every rank, as c10d reads them.
    int64_t rows_in = in.dim() ? in.size(0) : 1, rows_out = out.dim() ? out.size(0) : 1;
    for (int64_t j = 0; j < n; ++j) {
      d[kFixed + j] = in_splits.empty() ? rows_in / n : in_splits[j];
      d[kFixed + n + j] = out_splits.empty() ? rows_out / n : out_splits[j];
    }
  }
  return d;
}

void check_descriptors(const std::string& what, const std::vector<int>& global_ranks,
                       const std::vector<const int64_t*>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  std::string wrong = disagreement(rows, n);
  if (wrong.empty()) return;
  const bool splits = rows[0][COLLECTIVE] == static_cast<int64_t>(SizedCollective::ALL_TO_ALL);
  std::ostringstream os;
  os << "dtensor: " << what << ": " << wrong << " (a distributed collective mismatch; nothing was sent):";
  for (int64_t r = 0; r < n; ++r) {
    os << "\n  rank " << global_ranks[r] << " (group rank " << r << "): " << describe_rank(rows[r], n, splits);
  }
  throw dtensor::Error(os.str());
}

bool needs_size_agreement(const ProcessGroup& group, const at::Tensor& in) {
  // The shared-memory backend checks CPU tensors' sizes inside the collective itself; CUDA tensors go elsewhere.
  // A peerless group (a plan dry run's, on meta tensors) has no peers to disagree with: checks_sizes_in_band.
  const bool in_band = group.checks_sizes_in_band() && (!in.defined() || in.is_cpu() || in.is_meta());
  return group.size() > 1 && size_agreement_enabled() && !in_band && !group.failed();
}

void agree_on_sizes(ProcessGroup& group, SizedCollective collective, const at::Tensor& in, const at::Tensor& out,
                    const std::vector<int64_t>& in_splits, const std::vector<int64_t>& out_splits) {
  const int64_t n = group.size();
  if (!needs_size_agreement(group, in)) return;
  const int64_t len = descriptor_length(n);
  std::vector<int64_t> d = size_descriptor(collective, in, out, in_splits, out_splits, n);
  at::Tensor mine = at::from_blob(d.data(), {len}, at::kLong);
  at::Tensor all = at::empty({n * len}, at::kLong);
  c10d::AllgatherOptions opts;
  opts.timeout = group.timeout();
  const std::string what = std::string(name_of(static_cast<int64_t>(collective))) + " on " + group.describe();
  try {
    CollectiveWaitMark mark;  // tprun's watchdog: blocked in a collective, then progress
    auto work = group.backend()._allgather_base(all, mine, opts);
    if (!work->wait(group.timeout())) throw std::runtime_error("timed out");
    mark.succeeded();
  } catch (const std::exception& e) {
    const std::string msg = message_of(e);
    std::string why = group.with_member_states(what + " failed while the ranks compared sizes (within " +
                                               std::to_string(group.timeout().count()) + " ms): " + msg);
    group.mark_failed(why);
    throw DTENSOR_ERROR("dtensor: ", why);
  }
  std::vector<const int64_t*> rows;
  for (int64_t r = 0; r < n; ++r) rows.push_back(all.data_ptr<int64_t>() + r * len);
  check_descriptors(what, group.ranks(), rows);
}

}  // namespace dtensor::detail
