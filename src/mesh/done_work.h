// A c10d::Work that completed when it was made, for backends that finish a collective before returning.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace dtensor::detail {

class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(c10d::OpType type) : c10d::Work(-1, type) { finish(); }
};

inline c10::intrusive_ptr<c10d::Work> done_work(c10d::OpType type) { return c10::make_intrusive<DoneWork>(type); }

}  // namespace dtensor::detail
