// The backend of fake_world's groups (process_group.h): no peers; every collective completes at once and
// fills its output from the local input (fake_backend.cpp lists how).
#pragma once

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Backend;
}

namespace dtensor::detail {

inline constexpr const char* kFakeBackendName = "fake";

c10::intrusive_ptr<c10d::Backend> make_fake_backend(int group_rank, int group_size);

}  // namespace dtensor::detail
