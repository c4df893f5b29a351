// The exposed communication time: how long the calling thread has spent inside collectives, issuing one
// and blocked until one completes (a blocking collective's whole run; an asynchronous one's wait()). An
// asynchronous collective that runs while the thread computes costs only its issue and whatever is left
// of it at wait(): what async TP and FSDP's prefetch hide does not show here, what they fail to hide does.
#pragma once

#include <cstdint>

namespace dtensor {

int64_t exposed_comm_ns();  // the calling thread's total since it started

}  // namespace dtensor
