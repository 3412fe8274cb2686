# Finds Kokkos and Kokkos Kernels (>= 3.4) and presents the targets Kokkos::kokkos and
# Kokkos::kokkoskernels to the rest of the build, whatever installed them: a source build,
# spack, Kokkos 4.x, or Debian's binary libtrilinos-kokkos-dev, whose config points
# Kokkos::kokkos at a missing <prefix>/lib/include and defines no Kokkos::kokkoskernels.
# Sets KVMAP_KOKKOS_DEVICES (e.g. "OPENMP;SERIAL") and KVMAP_KOKKOS_VERSION.
include_guard(GLOBAL)

# Kokkos_ROOT / CMAKE_PREFIX_PATH first; then the prefix scripts/install-deps.sh builds.
if(DEFINED ENV{KVMAP_DEPS_PREFIX})
  set(_kvmap_deps_cache "$ENV{KVMAP_DEPS_PREFIX}")
elseif(DEFINED ENV{XDG_CACHE_HOME})
  set(_kvmap_deps_cache "$ENV{XDG_CACHE_HOME}/kvmap")
else()
  set(_kvmap_deps_cache "$ENV{HOME}/.cache/kvmap")
endif()
file(GLOB _kvmap_cached_kokkos LIST_DIRECTORIES true "${_kvmap_deps_cache}/kokkos-*")
# Not the CUDA build (KVMAP_CUDA=1): it needs its nvcc_wrapper as the compiler, so it is used
# only where named (the preset cuda-compile).
list(FILTER _kvmap_cached_kokkos EXCLUDE REGEX "-cuda$")
set(_kvmap_kokkos_howto
    "Install Kokkos (>= 3.4) and Kokkos Kernels with the same backends: scripts/install-deps.sh "
    "builds both into ${_kvmap_deps_cache}/kokkos-3.4.01; spack install kokkos kokkos-kernels; or "
    "from source. Then name the prefix: Kokkos_ROOT=<prefix> in the environment or "
    "-DKokkos_ROOT=<prefix> (for pip: Kokkos_ROOT=<prefix> pip install .).")
# A pip build (SKBUILD) takes a Kokkos only where one is named (Kokkos_ROOT, Kokkos_DIR,
# CMAKE_PREFIX_PATH), never the dependency cache or a system one it happens to see: with none
# named, Kokkos is built into the wheel (cmake/KvmapBundledKokkos.cmake), so that the wheel
# depends on nothing of the machine that built it.
set(KVMAP_BUNDLED_KOKKOS OFF)
if(SKBUILD)
  set(_kvmap_cached_kokkos "")
  set(_kvmap_kokkos_named FALSE)
  # (scikit-build-core's own CMAKE_PREFIX_PATH, the build environment's site-packages, names
  # none: only the environment's counts.)
  foreach(_v IN ITEMS Kokkos_ROOT Kokkos_DIR)
    if(${_v} OR DEFINED ENV{${_v}})
      set(_kvmap_kokkos_named TRUE)
    endif()
  endforeach()
  if(DEFINED ENV{CMAKE_PREFIX_PATH})
    set(_kvmap_kokkos_named TRUE)
  endif()
  if(_kvmap_kokkos_named)
    find_package(Kokkos 3.4 QUIET)
  endif()
  if(NOT Kokkos_FOUND)
    if(CMAKE_CXX_STANDARD)
      set(KVMAP_BUNDLED_CXX_STANDARD ${CMAKE_CXX_STANDARD})
    else()
      set(KVMAP_BUNDLED_CXX_STANDARD 20)
    endif()
    include(KvmapBundledKokkos)
    set(KVMAP_BUNDLED_KOKKOS ON)
    set(_kvmap_cached_kokkos "${KVMAP_BUNDLED_KOKKOS_PREFIX}")
  endif()
endif()
find_package(Kokkos 3.4 HINTS ${_kvmap_cached_kokkos})
if(NOT Kokkos_FOUND)
  message(FATAL_ERROR "kvmap: Kokkos not found. ${_kvmap_kokkos_howto}")
endif()
# Kokkos Kernels is usually installed beside Kokkos (Kokkos_ROOT names that prefix only).
get_filename_component(_kvmap_kokkos_prefix "${Kokkos_DIR}/../../.." ABSOLUTE)
find_package(KokkosKernels HINTS ${_kvmap_cached_kokkos} "${_kvmap_kokkos_prefix}")
if(NOT KokkosKernels_FOUND)
  message(FATAL_ERROR "kvmap: Kokkos ${Kokkos_VERSION} found in ${Kokkos_DIR}, but not Kokkos Kernels. "
                      "${_kvmap_kokkos_howto}")
endif()

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
