# Finds Kokkos and Kokkos Kernels (>= 3.4) and presents the targets Kokkos::kokkos and
# Kokkos::kokkoskernels to the rest of the build, whatever installed them: a source build,
# spack, Kokkos 4.x, or Debian's binary libtrilinos-kokkos-dev, whose config points
# Kokkos::kokkos at a missing <prefix>/lib/include and defines no Kokkos::kokkoskernels.
# Sets KVMAP_KOKKOS_DEVICES (e.g. "OPENMP;SERIAL") and KVMAP_KOKKOS_VERSION.
include_guard(GLOBAL)

find_package(Kokkos 3.4 REQUIRED)
find_package(KokkosKernels REQUIRED)

# Debian: headers live in Kokkos_INCLUDE_DIRS (/usr/include/trilinos), not where the
# imported target says.
function(_kvmap_repair_include_dirs target fallback_dirs)
  get_target_property(_dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  set(_broken FALSE)
  if(NOT _dirs)
    set(_broken TRUE)
  else()
    foreach(_d IN LISTS _dirs)
      if(NOT _d MATCHES "^\\$<" AND NOT EXISTS "${_d}")
        set(_broken TRUE)
      endif()
    endforeach()
  endif()
  if(_broken)
    foreach(_d IN LISTS fallback_dirs)
      if(NOT EXISTS "${_d}")
        message(FATAL_ERROR "kvmap: ${target} lists no usable include directory and the fallback "
                            "'${_d}' does not exist either")
      endif()
    endforeach()
    message(STATUS "kvmap: repairing include directories of ${target} -> ${fallback_dirs}")
    set_property(TARGET ${target} PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${fallback_dirs}")
  endif()
endfunction()

if(NOT TARGET Kokkos::kokkos)
  message(FATAL_ERROR "kvmap: find_package(Kokkos) defined no Kokkos::kokkos target")
endif()
_kvmap_repair_include_dirs(Kokkos::kokkos "${Kokkos_INCLUDE_DIRS}")

if(NOT TARGET Kokkos::kokkoskernels)
  if(TARGET trilinos_kokkoskernels)
    add_library(Kokkos::kokkoskernels INTERFACE IMPORTED)
    set_property(TARGET Kokkos::kokkoskernels PROPERTY INTERFACE_LINK_LIBRARIES
                 trilinos_kokkoskernels Kokkos::kokkos)
    set_property(TARGET Kokkos::kokkoskernels PROPERTY INTERFACE_INCLUDE_DIRECTORIES
                 "${KokkosKernels_INCLUDE_DIRS}")
  elseif(TARGET Kokkos::kokkoskernels_kokkoskernels)
    add_library(Kokkos::kokkoskernels ALIAS Kokkos::kokkoskernels_kokkoskernels)
  else()
    message(FATAL_ERROR "kvmap: find_package(KokkosKernels) defined no usable target")
  endif()
endif()
_kvmap_repair_include_dirs(Kokkos::kokkoskernels "${KokkosKernels_INCLUDE_DIRS};${Kokkos_INCLUDE_DIRS}")

set(KVMAP_KOKKOS_DEVICES "${Kokkos_DEVICES}")
set(KVMAP_KOKKOS_VERSION "${Kokkos_VERSION}")
message(STATUS "kvmap: Kokkos ${Kokkos_VERSION} (${Kokkos_DIR}) devices: ${Kokkos_DEVICES}")
