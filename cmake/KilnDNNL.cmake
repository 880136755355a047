# KilnDNNL.cmake: the DNNL::dnnl target (oneDNN), used by Kiln's tree and by KilnConfig.cmake.
# oneDNN's own CMake package where it is installed (Debian's libdnnl-dev has one); otherwise
# an imported target over the library and header found on the system. No include guard: an
# imported target is seen in its directory only, so each find_package(Kiln) scope defines it.
if(NOT TARGET DNNL::dnnl)
  find_package(dnnl CONFIG QUIET)
  if(NOT TARGET DNNL::dnnl)
    find_library(DNNL_LIBRARY dnnl REQUIRED)
    find_path(DNNL_INCLUDE_DIR dnnl.hpp REQUIRED)
    add_library(DNNL::dnnl UNKNOWN IMPORTED)
    set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})
  endif()
endif()
