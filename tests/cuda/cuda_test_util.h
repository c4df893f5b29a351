// CUDA tests report themselves skipped (never passed) where no GPU can be used, saying why.
#pragma once

#include <gtest/gtest.h>

#include "dtensor/mesh/cuda.h"

#define DTENSOR_REQUIRE_GPU()                                                             \
  do {                                                                                    \
    if (!dtensor::cuda_available()) GTEST_SKIP() << dtensor::cuda_unavailable_reason();  \
  } while (0)
