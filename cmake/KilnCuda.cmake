# KilnCuda.cmake: kiln_add_cuda_sources(), the one way .cu files join a target, in Kiln's own
# tree and in a project using an installed Kiln (shipped with the package, included by
# KilnConfig.cmake).
#
#   kiln_add_cuda_sources(<target> a.cu b.cu ...)
#
# compiles the files the way Kiln itself was built:
#   real CUDA    as CUDA (nvcc), C++17, for Kiln's CUDA architectures unless the project set
#                CMAKE_CUDA_ARCHITECTURES; the CUDA language must be enabled (KilnConfig.cmake
#                enables it when find_package(Kiln) runs at directory scope).
#   simulator    as C++ (LANGUAGE CXX, -xc++) by the host compiler: engine/cuda/runtime.h then
#                includes the simulator's runtime (engine/cuda/sim/runtime.h) and kernels run
#                on CPU fibers, in the simulated runtime (Kiln::cudasim, which Kiln::engine
#                links in a simulator build). Multiply-adds are contracted as nvcc contracts
#                them (fp_options below).
#   CPU only     not at all: the files are left out (a status message says so in a project
#                using an installed Kiln), and KILN_WITH_CUDA is not defined, so the sources
#                that call the kernels keep them behind `#if KILN_WITH_CUDA` as Kiln's layers do.
# The target must link a Kiln library (Kiln::engine or one above it): that brings the headers,
# KILN_WITH_CUDA / KILN_CUDA_SIM, and the CUDA runtime (real or simulated).
#
# How Kiln was built is read from two global properties, KILN_WITH_CUDA and KILN_CUDA_SIM,
# set by Kiln's top-level CMakeLists.txt or by KilnConfig.cmake.
include_guard(GLOBAL)

function(kiln_add_cuda_sources target)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "kiln_add_cuda_sources: no target named '${target}' (create it first)")
  endif()
  get_property(with_cuda GLOBAL PROPERTY KILN_WITH_CUDA)
  get_property(sim GLOBAL PROPERTY KILN_CUDA_SIM)
  if(NOT with_cuda)
    if(NOT PROJECT_NAME STREQUAL "Kiln")
      message(STATUS "Kiln was built without a CUDA backend: the CUDA sources of ${target} "
                     "(${ARGN}) are not compiled")
    endif()
    return()
  endif()
  set(files "")
  foreach(f ${ARGN})
    get_filename_component(abs ${f} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    list(APPEND files ${abs})
  endforeach()
  target_sources(${target} PRIVATE ${files})
  if(sim)
    # Floating point under the simulator as nvcc compiles it: nvcc contracts a * b + c into one
    # fused multiply-add by default (--fmad=true), across statements and in the loop-carried
    # multiply-adds of reductions, so the host compiler is asked to do the same wherever the
    # CPU has FMA instructions (docs/cuda_simulator.md, "Floating point: contraction as nvcc
    # does it"):
    #   -ffp-contract=fast            contract across statements (GCC's default for C++
    #                                 already; clang's is "on", within one expression)
    #   --param=avoid-fma-max-bits=0  (GCC) contract loop-carried chains too, whatever -mtune:
    #                                 GCC's tuning for AMD Zen (avoid-fma-max-bits=256) leaves
    #                                 them unfused, so the same kernel rounded differently on
    #                                 an AMD and an Intel CPU
    #   -fexpensive-optimizations     (GCC) the pass that forms FMAs runs at -O1 too (the
    #                                 sanitizer trees); at -O0 nothing is contracted
    set(fp_options -ffp-contract=fast $<$<CXX_COMPILER_ID:GNU>:--param=avoid-fma-max-bits=0>
                   $<$<CXX_COMPILER_ID:GNU>:-fexpensive-optimizations>)
    set_source_files_properties(${files} TARGET_DIRECTORY ${target}
                                PROPERTIES LANGUAGE CXX
                                           COMPILE_OPTIONS "-xc++;${fp_options}")
  else()
    get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
    if(NOT "CUDA" IN_LIST languages)
      message(FATAL_ERROR "kiln_add_cuda_sources(${target}): Kiln was built with the CUDA "
              "backend, so these files are compiled by nvcc, but the CUDA language is not "
              "enabled: call find_package(Kiln) at directory scope (it enables CUDA), or "
              "enable_language(CUDA) first")
    endif()
    get_target_property(cuda_std ${target} CUDA_STANDARD)
    if(NOT cuda_std)
      set_target_properties(${target} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
    endif()
  endif()
endfunction()
