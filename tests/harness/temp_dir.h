// Temporary directories of the tests, one home: made under the system's temp folder as dtensor_<tag>_XXXXXX, and
// removed with everything in them when the test binary ends (gtest_main's environment; a crash leaves them, their
// names saying which test made them).
#pragma once

#include <string>

namespace dtensor::testing {

// A fresh, empty directory; throws std::runtime_error when it cannot be made.
std::string temp_dir(const std::string& tag);

// Removes every directory temp_dir made in this process (what the test environment's TearDown calls).
void remove_temp_dirs();

}  // namespace dtensor::testing
