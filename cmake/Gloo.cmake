# Build-time needs of the library itself, not of its users (this file is not installed).
#
# src/mesh/world.cpp, the only translation unit that includes ProcessGroupGloo.hpp, needs c10d's
# headers and gloo's. Some wheels ship gloo's headers; when not, Debian's libgloo-dev provides declarations.
# We only pass shared_ptr<gloo::transport::Device> through, never touch gloo objects, so the declarations
# need not match the gloo version built into libtorch_cpu (ProcessGroupGloo holds gloo types only behind
# pointers). No public header includes gloo or c10d's backend headers, so find_package(dtensor) needs neither.
#
# Produces DTENSOR_GLOO_INCLUDE.
if(NOT EXISTS "${TORCH_ROOT}/include/torch/csrc/distributed/c10d/ProcessGroupGloo.hpp")
  message(FATAL_ERROR "dtensor: LibTorch at '${TORCH_ROOT}' has no c10d headers (ProcessGroupGloo.hpp)")
endif()
find_path(DTENSOR_GLOO_INCLUDE gloo/rendezvous/store.h
          HINTS "${TORCH_ROOT}/include" /usr/include /usr/local/include)
if(NOT DTENSOR_GLOO_INCLUDE)
  message(FATAL_ERROR "dtensor: gloo headers not found (neither in LibTorch nor system). apt install libgloo-dev")
endif()
