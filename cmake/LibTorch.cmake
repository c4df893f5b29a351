# Locates LibTorch without find_package(Torch): the CUDA pip wheels' TorchConfig insists on a CUDA toolkit,
# and we only need the CPU libraries. TORCH_ROOT is a directory holding include/ and lib/: a pip install
# (site-packages/torch) or an unpacked LibTorch zip (libtorch/).
#
# Produces the imported target dtensor::libtorch. Installed beside dtensorConfig.cmake: consumers of the
# installed package run it too, so it asks for nothing but LibTorch's headers and libraries (no gloo, no
# c10d headers: those are the library's build-time needs, cmake/Gloo.cmake).
set(TORCH_ROOT "" CACHE PATH "LibTorch root (site-packages/torch or an unpacked libtorch zip)")
set(DTENSOR_TORCH_CXX11_ABI "1" CACHE STRING "_GLIBCXX_USE_CXX11_ABI LibTorch was built with (torch.compiled_with_cxx11_abi())")

if(NOT TORCH_ROOT)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch, os; print(os.path.dirname(torch.__file__))"
                    OUTPUT_VARIABLE _torch_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set(TORCH_ROOT "${_torch_root}" CACHE PATH "" FORCE)
  endif()
endif()
if(NOT EXISTS "${TORCH_ROOT}/include/torch/csrc/api/include/torch/torch.h")
  message(FATAL_ERROR "dtensor: no LibTorch C++ headers under TORCH_ROOT='${TORCH_ROOT}'. "
                      "Pass -DTORCH_ROOT=<site-packages/torch or libtorch dir>. CPU-only pip wheels lack the headers.")
endif()
find_library(DTENSOR_TORCH_CPU_LIB torch_cpu PATHS "${TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
find_library(DTENSOR_C10_LIB c10 PATHS "${TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)

add_library(dtensor_libtorch INTERFACE)
add_library(dtensor::libtorch ALIAS dtensor_libtorch)
target_include_directories(dtensor_libtorch SYSTEM INTERFACE
  "${TORCH_ROOT}/include" "${TORCH_ROOT}/include/torch/csrc/api/include")
target_link_libraries(dtensor_libtorch INTERFACE "${DTENSOR_TORCH_CPU_LIB}" "${DTENSOR_C10_LIB}" Threads::Threads)
target_compile_definitions(dtensor_libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=${DTENSOR_TORCH_CXX11_ABI})
# LibTorch's Linux wheels are built with AT_PARALLEL_OPENMP: at::parallel_for is a header template whose threads are an
# `omp parallel` in the caller's own code. Compiled without -fopenmp it runs every range on the calling thread,
# silently (torch.utils.cpp_extension passes -fopenmp for the same reason). The soname libgomp.so.1 resolves to the one
# LibTorch loads: one thread pool.
target_compile_options(dtensor_libtorch INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp>)
target_link_options(dtensor_libtorch INTERFACE $<$<LINK_LANGUAGE:CXX>:-fopenmp>)
set(DTENSOR_TORCH_LIBDIR "${TORCH_ROOT}/lib")
