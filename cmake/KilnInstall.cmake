# KilnInstall.cmake: install rules and the CMake package of Kiln (included at the end of the
# top-level CMakeLists.txt, after every library target exists).
#
#   cmake --install <build dir> --prefix <prefix>
#
# installs
#   <prefix>/lib/libkiln_*.a                  the libraries (static; libkiln_cudasim.a in a
#                                             simulator build)
#   <prefix>/include/kiln/{engine,layers,data,comm,models}/...   every .h / .cuh, so a program
#                                             includes "engine/tensor.h" as Kiln's sources do
#   <prefix>/lib/cmake/Kiln/                  KilnConfig.cmake, KilnConfigVersion.cmake,
#                                             KilnTargets*.cmake (the Kiln:: targets),
#                                             KilnCuda.cmake (kiln_add_cuda_sources),
#                                             KilnDNNL.cmake
# and a project uses it with find_package(Kiln 0.5 REQUIRED) and Kiln::layers & co.
# The apps, examples and tests are not installed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Library target -> exported name (Kiln::<name>), with an alias of the same name in the tree
# (a project that adds Kiln with add_subdirectory links the same names).
set(kiln_exported kiln_flags)
foreach(name engine layers data comm models pipeline)
  add_library(Kiln::${name} ALIAS kiln_${name})
  set_target_properties(kiln_${name} PROPERTIES EXPORT_NAME ${name})
  list(APPEND kiln_exported kiln_${name})
endforeach()
# The CUDA simulator (simulator builds only): Kiln::engine links it, so a program using an
# installed simulator build links it too, through the engine.
if(TARGET kiln_cudasim)
  add_library(Kiln::cudasim ALIAS kiln_cudasim)
  set_target_properties(kiln_cudasim PROPERTIES EXPORT_NAME cudasim)
  list(APPEND kiln_exported kiln_cudasim)
endif()

install(TARGETS ${kiln_exported} EXPORT KilnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The headers of every library, in the layout of the tree (the CUDA simulator's runtime headers,
# engine/cuda/sim/*.h, included: a simulator build's users compile their .cu files against them).
install(DIRECTORY engine layers data comm models
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln
        FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")

set(KILN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
install(EXPORT KilnTargets NAMESPACE Kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR})

# What KilnConfig.cmake records of this build (the NCCL switch is decided in comm/).
get_target_property(kiln_comm_definitions kiln_comm INTERFACE_COMPILE_DEFINITIONS)
set(KILN_WITH_NCCL OFF)
if(kiln_comm_definitions MATCHES "KILN_WITH_NCCL=1")
  set(KILN_WITH_NCCL ON)
endif()
configure_package_config_file(cmake/KilnConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/KilnConfig.cmake
  INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR})
# 0.x: a newer minor may change the API, so find_package(Kiln 0.5) accepts 0.5.* only.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/KilnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/KilnConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/KilnConfigVersion.cmake
              cmake/KilnCuda.cmake
              cmake/KilnDNNL.cmake
        DESTINATION ${KILN_INSTALL_CMAKEDIR})
