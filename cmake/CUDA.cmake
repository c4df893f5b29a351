# CUDA support, built as a plugin (libdtensor_cuda.so) that the library loads the first time a "cuda" mesh
# or CUDA tensor collective asks for it, so CPU jobs never map LibTorch's CUDA libraries.
#
# DTENSOR_WITH_CUDA: AUTO (default) builds the plugin when LibTorch has CUDA (libtorch_cuda, libc10_cuda),
# and the CUDA runtime headers and nccl.h can be found (the pip wheel's nvidia/*/include beside torch, or a
# toolkit under CUDA_HOME / /usr/local/cuda); ON requires it; OFF skips it. Only headers are needed here:
# the plugin links LibTorch's CUDA libraries, which bring their own CUDA runtime and NCCL.
#
# Produces DTENSOR_CUDA_FOUND and, when true, the interface target dtensor::libtorch_cuda.
set(DTENSOR_WITH_CUDA "AUTO" CACHE STRING "Build CUDA/NCCL support: AUTO, ON or OFF")
set(DTENSOR_CUDA_FOUND FALSE)
set(DTENSOR_CUDA_STATUS "off (DTENSOR_WITH_CUDA=OFF)")
if(NOT DTENSOR_WITH_CUDA STREQUAL "OFF")
  set(_nvidia "${TORCH_ROOT}/../nvidia")
  file(GLOB _nvidia_includes "${_nvidia}/*/include")
  find_library(DTENSOR_TORCH_CUDA_LIB torch_cuda PATHS "${TORCH_ROOT}/lib" NO_DEFAULT_PATH)
  find_library(DTENSOR_C10_CUDA_LIB c10_cuda PATHS "${TORCH_ROOT}/lib" NO_DEFAULT_PATH)
  # The runtime headers with their crt/ folder (some wheels ship cuda_runtime.h without it): a toolkit first.
  find_path(DTENSOR_CUDA_TOOLKIT_INCLUDE crt/host_config.h
            HINTS "$ENV{CUDA_HOME}/include" /usr/local/cuda/include ${_nvidia_includes})
  find_path(DTENSOR_NCCL_INCLUDE nccl.h HINTS ${_nvidia_includes} "$ENV{CUDA_HOME}/include" /usr/local/cuda/include /usr/include)
  set(_missing "")
  foreach(_v DTENSOR_TORCH_CUDA_LIB DTENSOR_C10_CUDA_LIB DTENSOR_CUDA_TOOLKIT_INCLUDE DTENSOR_NCCL_INCLUDE)
    if(NOT ${_v})
      list(APPEND _missing ${_v})
    endif()
  endforeach()
  if(NOT EXISTS "${TORCH_ROOT}/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")
    list(APPEND _missing ProcessGroupNCCL.hpp)
  endif()
  if(_missing)
    set(DTENSOR_CUDA_STATUS "off (LibTorch at ${TORCH_ROOT} lacks: ${_missing})")
    if(DTENSOR_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "dtensor: DTENSOR_WITH_CUDA=ON but ${DTENSOR_CUDA_STATUS}")
    endif()
  else()
    set(DTENSOR_CUDA_FOUND TRUE)
    set(DTENSOR_CUDA_STATUS "on (NCCL for CUDA tensors; headers ${DTENSOR_CUDA_TOOLKIT_INCLUDE})")
    add_library(dtensor_libtorch_cuda INTERFACE)
    add_library(dtensor::libtorch_cuda ALIAS dtensor_libtorch_cuda)
    # Every nvidia/*/include: ATen's CUDA headers pull in cuBLAS, cuSPARSE, cuSOLVER and cuRAND declarations.
    target_include_directories(dtensor_libtorch_cuda SYSTEM INTERFACE
      "${DTENSOR_CUDA_TOOLKIT_INCLUDE}" ${_nvidia_includes} "${DTENSOR_NCCL_INCLUDE}")
    target_link_libraries(dtensor_libtorch_cuda INTERFACE "${DTENSOR_TORCH_CUDA_LIB}" "${DTENSOR_C10_CUDA_LIB}")
    target_compile_definitions(dtensor_libtorch_cuda INTERFACE USE_C10D_NCCL USE_CUDA)
  endif()
endif()
message(STATUS "dtensor: CUDA support ${DTENSOR_CUDA_STATUS}")
