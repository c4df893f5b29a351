#include "dtensor/tensor/placement.h"
#include "dtensor/core/error.h"

#include <regex>
#include <sstream>
#include <stdexcept>

namespace dtensor {

int64_t Placement::dim() const {
  DTENSOR_CHECK(kind_ == Kind::SHARD, "dtensor: ", to_string(), " has no shard dim");
  return dim_;
}

Placement Placement::strided_shard(int64_t dim, int64_t split_factor) {
  DTENSOR_CHECK(split_factor >= 1, "dtensor: _StridedShard needs split_factor >= 1, got ", split_factor);
  return Placement(Kind::SHARD, dim, ReduceOp::SUM, split_factor);
}

Placement Placement::with_dim(int64_t dim) const {
  DTENSOR_CHECK(kind_ == Kind::SHARD, "dtensor: ", to_string(), " has no shard dim");
  return Placement(Kind::SHARD, dim, ReduceOp::SUM, split_factor_);
}

bool has_strided_shard(const Placements& placements) {
  for (const auto& p : placements) {
    if (p.is_strided_shard()) return true;
  }
  return false;
}

ReduceOp Placement::reduce_op() const {
  DTENSOR_CHECK(kind_ == Kind::PARTIAL, "dtensor: ", to_string(), " has no reduce op");
  return op_;
}

Placement Placement::normalized(int64_t ndim) const {
  if (kind_ != Kind::SHARD) return *this;
  int64_t d = dim_ < 0 ? dim_ + ndim : dim_;
  DTENSOR_CHECK(d >= 0 && d < ndim, "dtensor: ", to_string(), " is out of range for a tensor of ", ndim, " dims");
  return with_dim(d);
}

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::SHARD:
      if (split_factor_ > 1) return "_StridedShard(dim=" + std::to_string(dim_) + ", sf=" + std::to_string(split_factor_) + ")";
      return "Shard(dim=" + std::to_string(dim_) + ")";
    case Kind::REPLICATE: return "Replicate()";
    case Kind::PARTIAL: return std::string("Partial(") + reduce_op_name(op_) + ")";
  }
  return "?";
}

Placement Placement::parse(const std::string& text) {
  static const std::regex shard_re(R"(\s*(?:Shard|S)\((?:dim=)?(-?\d+)\)\s*)");
  static const std::regex replicate_re(R"(\s*(?:Replicate\(\)|R)\s*)");
  static const std::regex partial_re(R"(\s*(?:Partial|P)(?:\((?:reduce_op=)?'?(\w*)'?\))?\s*)");
  static const std::regex strided_re(R"(\s*_StridedShard\((?:dim=)?(-?\d+),\s*(?:sf=|split_factor=)?(\d+)\)\s*)");
  std::smatch m;
  if (std::regex_match(text, m, shard_re)) return shard(std::stoll(m[1]));
  if (std::regex_match(text, m, strided_re)) return strided_shard(std::stoll(m[1]), std::stoll(m[2]));
  if (std::regex_match(text, m, replicate_re)) return replicate();
  if (std::regex_match(text, m, partial_re)) {
    return partial(m[1].length() ? reduce_op_from_name(m[1]) : ReduceOp::SUM);
  }
  throw DTENSOR_ERROR("dtensor: cannot parse placement '", text,
                      "' (expected Shard(dim=N), Replicate() or Partial(sum|avg|max|min))");
}

size_t Placement::hash() const {
  size_t h = static_cast<size_t>(kind_) * 1000003u;
  if (kind_ == Kind::SHARD) h ^= std::hash<int64_t>()(dim_) + 0x9e3779b9u + static_cast<size_t>(split_factor_ - 1) * 31u;
  if (kind_ == Kind::PARTIAL) h ^= static_cast<size_t>(op_) * 7919u;
  return h;
}

std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << p.to_string(); }

std::string to_string(const Placements& placements) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < placements.size(); ++i) os << (i ? ", " : "") << placements[i];
  os << "]";
  return os.str();
}

Placements replicate_all(int64_t mesh_ndim) { return Placements(mesh_ndim, Replicate()); }

Placements reduce_partials(Placements p) {
  for (auto& x : p) {
    if (x.is_partial()) x = Replicate();
  }
  return p;
}

}  // namespace dtensor
