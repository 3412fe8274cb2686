# Kokkos + Kokkos Kernels built into a wheel (pip install with no Kokkos given): the release
# archives of scripts/kokkos-sources.sh (version, sha256, URLs: read from there, one owner),
# from KVMAP_SOURCES (environment or cache variable), else ../shared/third_party beside the
# source tree, else downloaded from upstream; the sha256 is checked either way. Built at
# configure time (OpenMP + Serial, no architecture flags: the wheel runs on any x86-64 or
# aarch64 machine of its platform) as shared libraries with $ORIGIN RPATHs, installed into the
# wheel beside libkvmap (kvmap/lib, kvmap/include, kvmap/lib/cmake/Kokkos*): one Kokkos per
# process, the one the extension and libkvmap both link, and the one the wheel's CMake
# package gives C++ consumers. Of Kokkos Kernels the BLAS and batched components, without
# explicit instantiations (kvmap instantiates the few kernels it calls).
# Sets KVMAP_BUNDLED_KOKKOS_PREFIX (where find_package finds them).
include_guard(GLOBAL)

file(STRINGS "${PROJECT_SOURCE_DIR}/scripts/kokkos-sources.sh" _kvmap_src_lines
     REGEX "^(kokkos4_version|kokkos4_sha256|kernels4_sha256|kokkos4_url|kernels4_url)=")
foreach(_line IN LISTS _kvmap_src_lines)
  string(REGEX MATCH "^([a-z0-9_]+)=\"?([^\"]*)\"?$" _ "${_line}")
  set(_kvmap_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
endforeach()
if(NOT _kvmap_kokkos4_version OR NOT _kvmap_kokkos4_sha256 OR NOT _kvmap_kernels4_sha256)
  message(FATAL_ERROR "kvmap: cannot read the Kokkos versions and checksums from scripts/kokkos-sources.sh")
endif()
set(_kvmap_v "${_kvmap_kokkos4_version}")
string(REPLACE "$kokkos4_version" "${_kvmap_v}" _kvmap_kokkos4_url "${_kvmap_kokkos4_url}")
string(REPLACE "$kokkos4_version" "${_kvmap_v}" _kvmap_kernels4_url "${_kvmap_kernels4_url}")

if(NOT DEFINED KVMAP_SOURCES AND DEFINED ENV{KVMAP_SOURCES})
  set(KVMAP_SOURCES "$ENV{KVMAP_SOURCES}")
endif()
set(KVMAP_SOURCES "${KVMAP_SOURCES}" CACHE PATH
    "Where the Kokkos and Kokkos Kernels release archives are (default: ../shared/third_party beside the sources, else downloaded)")

set(_kvmap_bundle_dir "${CMAKE_BINARY_DIR}/bundled-kokkos")
set(KVMAP_BUNDLED_KOKKOS_PREFIX "${_kvmap_bundle_dir}/prefix")

# The checked archive NAME: from KVMAP_SOURCES or ../shared/third_party, else downloaded.
function(_kvmap_archive name sha url out)
  set(_path "")
  foreach(_dir IN ITEMS "${KVMAP_SOURCES}" "${PROJECT_SOURCE_DIR}/../shared/third_party")
    if(_dir AND EXISTS "${_dir}/${name}")
      set(_path "${_dir}/${name}")
      break()
    endif()
  endforeach()
  if(NOT _path)
    set(_path "${_kvmap_bundle_dir}/downloads/${name}")
    if(NOT EXISTS "${_path}")
      message(STATUS "kvmap: downloading ${url}")
      file(DOWNLOAD "${url}" "${_path}" EXPECTED_HASH SHA256=${sha} STATUS _status TLS_VERIFY ON)
      list(GET _status 0 _code)
      if(NOT _code EQUAL 0)
        file(REMOVE "${_path}")
        message(FATAL_ERROR "kvmap: could not download ${url} (${_status}). Put ${name} "
                            "(sha256 ${sha}) in a directory and name it: KVMAP_SOURCES=<dir> pip install ..., "
                            "or install Kokkos and Kokkos Kernels and name them: Kokkos_ROOT=<prefix> pip install ...")
      endif()
    endif()
  endif()
  file(SHA256 "${_path}" _actual)
  if(NOT _actual STREQUAL sha)
    message(FATAL_ERROR "kvmap: ${_path} has sha256 ${_actual}, not the release's ${sha}; remove it or fix KVMAP_SOURCES")
  endif()
  set(${out} "${_path}" PARENT_SCOPE)
endfunction()

# Runs one step of the build with its output shown (pip install -v), failing with its log.
function(_kvmap_bundle_step what)
  message(STATUS "kvmap: ${what}")
  string(TIMESTAMP _t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc COMMAND_ECHO NONE)
  string(TIMESTAMP _t1 "%s")
  math(EXPR _dt "${_t1} - ${_t0}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "kvmap: ${what} failed (exit ${_rc}); its output is above")
  endif()
  message(STATUS "kvmap: ${what}: done in ${_dt} s")
endfunction()

set(_kvmap_stamp_text "${_kvmap_v} ${_kvmap_kokkos4_sha256} ${_kvmap_kernels4_sha256} ${CMAKE_CXX_COMPILER} ${KVMAP_BUNDLED_CXX_STANDARD}")
if(EXISTS "${KVMAP_BUNDLED_KOKKOS_PREFIX}/.kvmap-complete")
  file(READ "${KVMAP_BUNDLED_KOKKOS_PREFIX}/.kvmap-complete" _kvmap_stamp)
endif()
if(NOT _kvmap_stamp STREQUAL _kvmap_stamp_text)
  _kvmap_archive("kokkos-${_kvmap_v}.tar.gz" "${_kvmap_kokkos4_sha256}" "${_kvmap_kokkos4_url}" _kvmap_kokkos_tgz)
  _kvmap_archive("kokkos-kernels-${_kvmap_v}.tar.gz" "${_kvmap_kernels4_sha256}" "${_kvmap_kernels4_url}" _kvmap_kernels_tgz)
  file(REMOVE_RECURSE "${_kvmap_bundle_dir}/src" "${_kvmap_bundle_dir}/build" "${KVMAP_BUNDLED_KOKKOS_PREFIX}")
  file(ARCHIVE_EXTRACT INPUT "${_kvmap_kokkos_tgz}" DESTINATION "${_kvmap_bundle_dir}/src")
  file(ARCHIVE_EXTRACT INPUT "${_kvmap_kernels_tgz}" DESTINATION "${_kvmap_bundle_dir}/src")
  cmake_host_system_information(RESULT _kvmap_jobs QUERY NUMBER_OF_LOGICAL_CORES)
  set(_kvmap_common -G "${CMAKE_GENERATOR}" -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} -DCMAKE_CXX_STANDARD=${KVMAP_BUNDLED_CXX_STANDARD}
      -DCMAKE_CXX_EXTENSIONS=OFF -DCMAKE_INSTALL_PREFIX=${KVMAP_BUNDLED_KOKKOS_PREFIX}
      -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_SHARED_LIBS=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
      -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=OFF)
  if(CMAKE_MAKE_PROGRAM)
    list(APPEND _kvmap_common -DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM})
  endif()
  if(CMAKE_CXX_COMPILER_LAUNCHER)
    list(APPEND _kvmap_common -DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
  set(_kvmap_src "${_kvmap_bundle_dir}/src")
  set(_kvmap_build "${_kvmap_bundle_dir}/build")
  _kvmap_bundle_step("Kokkos ${_kvmap_v} (OpenMP + Serial): configure"
    ${CMAKE_COMMAND} -S ${_kvmap_src}/kokkos-${_kvmap_v} -B ${_kvmap_build}/kokkos ${_kvmap_common}
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_TESTS=OFF)
  _kvmap_bundle_step("Kokkos ${_kvmap_v}: build (${_kvmap_jobs} jobs)"
    ${CMAKE_COMMAND} --build ${_kvmap_build}/kokkos -j ${_kvmap_jobs})
  _kvmap_bundle_step("Kokkos ${_kvmap_v}: install" ${CMAKE_COMMAND} --install ${_kvmap_build}/kokkos)
  _kvmap_bundle_step("Kokkos Kernels ${_kvmap_v} (BLAS, batched): configure"
    ${CMAKE_COMMAND} -S ${_kvmap_src}/kokkos-kernels-${_kvmap_v} -B ${_kvmap_build}/kernels
    ${_kvmap_common} -DKokkos_ROOT=${KVMAP_BUNDLED_KOKKOS_PREFIX}
    -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF
    -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON
    -DKokkosKernels_ENABLE_COMPONENT_BATCHED=ON
    -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF
    -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF
    -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_ORDINAL_INT64_T=OFF
    -DKokkosKernels_INST_OFFSET_INT=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF
    -DKokkosKernels_INST_LAYOUTLEFT=OFF -DKokkosKernels_INST_LAYOUTRIGHT=OFF
    -DKokkosKernels_ENABLE_TPL_BLAS=OFF -DKokkosKernels_ENABLE_TPL_LAPACK=OFF
    -DKokkosKernels_ENABLE_TPL_CUBLAS=OFF -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF
    -DKokkosKernels_ENABLE_TPL_CUSOLVER=OFF)
  _kvmap_bundle_step("Kokkos Kernels ${_kvmap_v}: build"
    ${CMAKE_COMMAND} --build ${_kvmap_build}/kernels -j ${_kvmap_jobs})
  _kvmap_bundle_step("Kokkos Kernels ${_kvmap_v}: install" ${CMAKE_COMMAND} --install ${_kvmap_build}/kernels)
  file(REMOVE_RECURSE "${_kvmap_bundle_dir}/src" "${_kvmap_build}")
  file(WRITE "${KVMAP_BUNDLED_KOKKOS_PREFIX}/.kvmap-complete" "${_kvmap_stamp_text}")
else()
  message(STATUS "kvmap: Kokkos ${_kvmap_v} for the wheel: already built in ${KVMAP_BUNDLED_KOKKOS_PREFIX}")
endif()

# Into the wheel: the libraries beside libkvmap, the headers beside kvmap's, the CMake
# packages under lib/cmake.
# A wheel holds no symbolic links: of each versioned library only the file CMake's targets
# name (.so.4.6.1) and the soname the loader asks for (.so.4.6) go in, not the link-time name.
install(DIRECTORY "${KVMAP_BUNDLED_KOKKOS_PREFIX}/lib/" DESTINATION ${CMAKE_INSTALL_LIBDIR}
        USE_SOURCE_PERMISSIONS
        PATTERN "libkokkoscore.so" EXCLUDE
        PATTERN "libkokkoscontainers.so" EXCLUDE
        PATTERN "libkokkossimd.so" EXCLUDE)
install(DIRECTORY "${KVMAP_BUNDLED_KOKKOS_PREFIX}/include/" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
