// Placements: how a DTensor's data lies along one mesh dim (PyTorch's torch.distributed.tensor.placement_types).
//
//   Shard(d)     each rank along the mesh dim holds its torch.chunk of tensor dim d
//   Replicate()  each rank holds the whole (of what the other mesh dims leave it)
//   Partial(op)  each rank holds a term; the value is op over the ranks (sum, avg, max, min)
//   _StridedShard(d, sf)  PyTorch's _StridedShard (is_shard() is true, as it subclasses Shard): dim d cut
//                into sf torch.chunk pieces, each rank along the mesh dim holding its torch.chunk of every
//                piece, concatenated in piece order (shard_layout.h). FSDP's Shard(0) over dp on a weight
//                that TP (a later mesh dim of sf ranks) already shards on dim 0: on ("dp", "tp") =
//                (_StridedShard(0, sf=tp), Shard(0)), rank (i, j) holds dp-chunk i of tp-chunk j, the dp
//                shard of its TP-local weight (when every tp chunk splits alike; fully_shard checks).
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "dtensor/mesh/reduce_op.h"

namespace dtensor {

class Placement {
 public:
  enum class Kind : uint8_t { SHARD, REPLICATE, PARTIAL };

  static Placement shard(int64_t dim) { return Placement(Kind::SHARD, dim, ReduceOp::SUM); }
  static Placement replicate() { return Placement(Kind::REPLICATE, 0, ReduceOp::SUM); }
  static Placement partial(ReduceOp op = ReduceOp::SUM) { return Placement(Kind::PARTIAL, 0, op); }
  // split_factor 1 is Shard(dim).
  static Placement strided_shard(int64_t dim, int64_t split_factor);

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::SHARD; }
  bool is_shard(int64_t dim) const { return kind_ == Kind::SHARD && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::REPLICATE; }
  bool is_partial() const { return kind_ == Kind::PARTIAL; }
  int64_t dim() const;        // Shard only
  bool is_strided_shard() const { return kind_ == Kind::SHARD && split_factor_ > 1; }
  int64_t split_factor() const { return split_factor_; }  // 1 unless a _StridedShard
  // This shard on another tensor dim (a _StridedShard stays one, with its split factor).
  Placement with_dim(int64_t dim) const;
  ReduceOp reduce_op() const; // Partial only

  // Shard(d) with d < 0 becomes Shard(d + ndim); throws if d is out of range. Others are returned as is.
  Placement normalized(int64_t ndim) const;

  // PyTorch's repr: "Shard(dim=1)", "Replicate()", "Partial(sum)", "_StridedShard(dim=0, sf=2)"
  std::string to_string() const;
  static Placement parse(const std::string& text);  // inverse of to_string (also "S(1)", "R", "P", "P(max)")

  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && (kind_ != Kind::SHARD || (dim_ == o.dim_ && split_factor_ == o.split_factor_)) &&
           (kind_ != Kind::PARTIAL || op_ == o.op_);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  size_t hash() const;

 private:
  Placement(Kind kind, int64_t dim, ReduceOp op, int64_t split_factor = 1)
      : kind_(kind), op_(op), dim_(dim), split_factor_(split_factor) {}
  Kind kind_;
  ReduceOp op_;
  int64_t dim_;
  int64_t split_factor_;
};

// PyTorch's spellings.
inline Placement Shard(int64_t dim) { return Placement::shard(dim); }
inline Placement Replicate() { return Placement::replicate(); }
inline Placement Partial(ReduceOp op = ReduceOp::SUM) { return Placement::partial(op); }

using Placements = std::vector<Placement>;

std::ostream& operator<<(std::ostream& os, const Placement& p);
std::string to_string(const Placements& placements);  // "[Shard(dim=0), Replicate()]"

inline Placement _StridedShard(int64_t dim, int64_t split_factor) { return Placement::strided_shard(dim, split_factor); }
// Some placement is a _StridedShard.
bool has_strided_shard(const Placements& placements);

// Replicate on each of `mesh_ndim` mesh dims.
Placements replicate_all(int64_t mesh_ndim);
// `p` with every Partial replaced by Replicate: the placements after the pending reductions (what a
// non-linear op needs first; the default gradient placements of a Partial forward).
Placements reduce_partials(Placements p);

}  // namespace dtensor

template <>
struct std::hash<dtensor::Placement> {
  size_t operator()(const dtensor::Placement& p) const { return p.hash(); }
};
