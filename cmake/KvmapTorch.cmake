# Finds LibTorch and presents exactly one LibTorch to the build, for kvmap and for the
# projects that link the installed kvmap:
#   - every torch library comes from the chosen Torch_DIR. TorchConfig looks up libc10 with
#     find_library, which searches the system before the torch prefix: with Debian's libtorch
#     installed it returns Debian's libc10 beside a wheel's libtorch (two c10 in one process
#     corrupt the dispatcher). Such results are replaced by the file of the imported target
#     of the same torch, and kvmap links the imported target `torch` only, so no absolute
#     system library path reaches the exported targets;
#   - a GPU-built torch (PyPI's default wheel is a CUDA build) serves a kvmap without a GPU
#     backend in Kokkos through its CPU libraries only (c10, torch_cpu, torch), found in the
#     package's own prefix the way torch.utils.cpp_extension builds CPU extensions: torch's
#     own TorchConfig would demand the CUDA toolkit (Caffe2Config: "uses CUDA but I cannot
#     find the CUDA libraries"), which a laptop, a CPU cluster or a login node does not have.
#     A Kokkos with CUDA (or HIP) loads the whole package and so needs the toolkit;
#   - a CUDA-built torch configures and links on a machine without a GPU: CUDA code stays
#     C++17 (torch copies the C++ standard to CUDA; CMake 3.25 with nvcc 13 rejects
#     "CUDA20"), and the linker resolves libtorch's dependencies in the wheel's nvidia/*/lib
#     before older copies of the system's CUDA toolkit.
# Sets KVMAP_TORCH_LIBDIR (the directory of libtorch), KVMAP_TORCH_CXX_STANDARD (the C++
# standard the ATen headers require, at least 17) and KVMAP_TORCH_GPU_PART (ON where torch's
# CUDA/ROCm part was loaded). kvmap_check_torch_headers() (kvmap's own build) then finds what
# torch's headers include but do not ship.
include_guard(GLOBAL)

macro(kvmap_find_torch)
  set(KVMAP_TORCH_GPU_PART OFF)
  _kvmap_torch_config_dir(_kvmap_torch_cfg)
  set(_kvmap_torch_cpu_view OFF)
  if(_kvmap_torch_cfg AND NOT Kokkos_ENABLE_CUDA AND NOT Kokkos_ENABLE_HIP)
    get_filename_component(_kvmap_torch_prefix "${_kvmap_torch_cfg}/../../.." ABSOLUTE)
    file(GLOB _kvmap_torch_gpu_libs "${_kvmap_torch_prefix}/lib/libtorch_cuda.so"
         "${_kvmap_torch_prefix}/lib/libtorch_hip.so" "${_kvmap_torch_prefix}/lib/libtorch_xpu.so")
    if(_kvmap_torch_gpu_libs)
      set(_kvmap_torch_cpu_view ON)
    endif()
  endif()
  if(_kvmap_torch_cpu_view)
    _kvmap_torch_cpu_targets("${_kvmap_torch_cfg}" "${_kvmap_torch_prefix}" ${ARGN})
  else()
    _kvmap_torch_whole_package(${ARGN})
  endif()
  if(TARGET torch)
    _kvmap_torch_one_copy()
  endif()
endmacro()

# The directory of TorchConfig.cmake (Torch_DIR, else where find_package would look), without
# loading it.
function(_kvmap_torch_config_dir out)
  set(_dir "")
  if(Torch_DIR AND EXISTS "${Torch_DIR}/TorchConfig.cmake")
    set(_dir "${Torch_DIR}")
  elseif(NOT Torch_DIR)
    find_path(_kvmap_torch_config_path TorchConfig.cmake
              HINTS ${Torch_ROOT} ENV Torch_ROOT
              PATH_SUFFIXES share/cmake/Torch lib/cmake/Torch lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch
              NO_CACHE)
    if(_kvmap_torch_config_path)
      set(_dir "${_kvmap_torch_config_path}")
    endif()
  endif()
  set(${out} "${_dir}" PARENT_SCOPE)
endfunction()

# The whole package through TorchConfig (CPU-only torch, or a GPU kvmap build).
macro(_kvmap_torch_whole_package)
  set(_kvmap_set_cuda_standard FALSE)
  if(NOT DEFINED CMAKE_CUDA_STANDARD)
    set(CMAKE_CUDA_STANDARD 17)
    set(_kvmap_set_cuda_standard TRUE)
  endif()
  # TorchConfig finds its Caffe2 package with PATHS, which CMake searches after the system:
  # beside a wheel's Torch it would load Debian's Caffe2 (another LibTorch's targets).
  if(Torch_DIR AND EXISTS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake")
    get_filename_component(_kvmap_caffe2_dir "${Torch_DIR}/../Caffe2" REALPATH)
    set(Caffe2_DIR "${_kvmap_caffe2_dir}" CACHE PATH "Caffe2 package of the LibTorch in Torch_DIR" FORCE)
    # A GPU build of kvmap compiles against torch's CUDA headers: the toolkit must be there
    # (Caffe2Config would stop with a message that does not say why kvmap needs it).
    file(STRINGS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake" _kvmap_caffe2_cuda REGEX "set\\(CAFFE2_USE_CUDA 1\\)")
    if(_kvmap_caffe2_cuda AND Kokkos_ENABLE_CUDA)
      find_package(CUDAToolkit QUIET)
      if(NOT CUDAToolkit_FOUND)
        message(FATAL_ERROR "kvmap: Kokkos ${Kokkos_VERSION} has the CUDA backend, so kvmap compiles "
                            "against LibTorch's CUDA part (${Torch_DIR}), which needs the CUDA toolkit "
                            "(nvcc, the CUDA runtime's headers and libraries); none was found. Put nvcc "
                            "on PATH or set CUDAToolkit_ROOT=<toolkit prefix>.")
      endif()
    endif()
  endif()
  find_package(Torch ${ARGN})
  if(Torch_FOUND AND Caffe2_DIR)
    get_filename_component(_kvmap_torch_dir "${Torch_DIR}" REALPATH)
    get_filename_component(_kvmap_caffe2_dir "${Caffe2_DIR}" REALPATH)
    get_filename_component(_kvmap_torch_parent "${_kvmap_torch_dir}" DIRECTORY)
    if(NOT _kvmap_caffe2_dir STREQUAL "${_kvmap_torch_parent}/Caffe2")
      message(FATAL_ERROR "kvmap: LibTorch's Torch package (${Torch_DIR}) loaded the Caffe2 package "
                          "of another LibTorch (${Caffe2_DIR}); set Caffe2_DIR to "
                          "${_kvmap_torch_parent}/Caffe2")
    endif()
  endif()
  if(_kvmap_set_cuda_standard)
    unset(CMAKE_CUDA_STANDARD)
  endif()
  if(TARGET c10_cuda OR TARGET c10_hip)
    set(KVMAP_TORCH_GPU_PART ON)
  endif()
endmacro()

# The CPU libraries of a GPU-built torch as the imported targets c10, torch_cpu and torch
# (libtorch, which loads the GPU part's libraries at run time, as `import torch` does), and
# the variables TorchConfig sets.
macro(_kvmap_torch_cpu_targets config_dir prefix)
  set(Torch_DIR "${config_dir}" CACHE PATH "LibTorch's CMake package" FORCE)
  file(STRINGS "${config_dir}/TorchConfigVersion.cmake" _kvmap_torch_v REGEX "set\\(PACKAGE_VERSION \"")
  string(REGEX MATCH "\"([0-9.]+)" _ "${_kvmap_torch_v}")
  set(Torch_VERSION "${CMAKE_MATCH_1}")
  string(REPLACE "." ";" _kvmap_torch_v "${Torch_VERSION}.0.0")
  list(GET _kvmap_torch_v 0 Torch_VERSION_MAJOR)
  list(GET _kvmap_torch_v 1 Torch_VERSION_MINOR)
  set(TORCH_INSTALL_PREFIX "${prefix}")
  set(TORCH_INCLUDE_DIRS "${prefix}/include" "${prefix}/include/torch/csrc/api/include")
  set(Torch_FOUND TRUE)
  foreach(_lib IN ITEMS c10 torch_cpu torch)
    if(NOT EXISTS "${prefix}/lib/lib${_lib}.so")
      set(Torch_FOUND FALSE)
      set(_kvmap_torch_missing "${prefix}/lib/lib${_lib}.so")
    endif()
  endforeach()
  if(Torch_FOUND AND NOT TARGET torch)
    add_library(c10 SHARED IMPORTED)
    set_target_properties(c10 PROPERTIES IMPORTED_LOCATION "${prefix}/lib/libc10.so" IMPORTED_SONAME libc10.so
                                         INTERFACE_INCLUDE_DIRECTORIES "${prefix}/include")
    add_library(torch_cpu SHARED IMPORTED)
    set_target_properties(torch_cpu PROPERTIES IMPORTED_LOCATION "${prefix}/lib/libtorch_cpu.so"
                                               IMPORTED_SONAME libtorch_cpu.so
                                               INTERFACE_LINK_LIBRARIES c10)
    add_library(torch SHARED IMPORTED)
    set_target_properties(torch PROPERTIES IMPORTED_LOCATION "${prefix}/lib/libtorch.so"
                                           IMPORTED_SONAME libtorch.so
                                           INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}"
                                           INTERFACE_LINK_LIBRARIES torch_cpu)
  endif()
  if(Torch_FOUND)
    set(TORCH_FOUND TRUE)
    set(TORCH_LIBRARIES torch)
    if(NOT "${ARGN}" MATCHES "QUIET")
      message(STATUS "kvmap: LibTorch ${Torch_VERSION} (${prefix}) is a GPU build; this kvmap has no "
                     "GPU backend and uses its CPU libraries only (no CUDA toolkit needed)")
    endif()
  elseif("${ARGN}" MATCHES "REQUIRED")
    message(FATAL_ERROR "kvmap: LibTorch in ${prefix} is incomplete: no ${_kvmap_torch_missing}")
  endif()
endmacro()

function(_kvmap_imported_file target out)
  set(_file "")
  foreach(_prop IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_RELWITHDEBINFO IMPORTED_LOCATION_NOCONFIG
                IMPORTED_LOCATION)
    get_target_property(_loc ${target} ${_prop})
    if(_loc)
      set(_file "${_loc}")
      break()
    endif()
  endforeach()
  set(${out} "${_file}" PARENT_SCOPE)
endfunction()

macro(_kvmap_torch_one_copy)
  _kvmap_imported_file(torch _kvmap_libtorch)
  if(NOT _kvmap_libtorch OR NOT EXISTS "${_kvmap_libtorch}")
    message(FATAL_ERROR "kvmap: the imported target torch of ${Torch_DIR} names no library file")
  endif()
  get_filename_component(KVMAP_TORCH_LIBDIR "${_kvmap_libtorch}" DIRECTORY)
  get_filename_component(KVMAP_TORCH_LIBDIR "${KVMAP_TORCH_LIBDIR}" REALPATH)

  # find_library results of TorchConfig that point at another copy: use the imported target's.
  foreach(_pair "c10_LIBRARY=c10" "C10_CUDA_LIBRARY=c10_cuda" "TORCH_LIBRARY=torch")
    string(REPLACE "=" ";" _pair "${_pair}")
    list(GET _pair 0 _var)
    list(GET _pair 1 _tgt)
    if(${_var} AND TARGET ${_tgt})
      _kvmap_imported_file(${_tgt} _ours)
      get_filename_component(_theirs_real "${${_var}}" REALPATH)
      get_filename_component(_ours_real "${_ours}" REALPATH)
      if(_ours AND NOT _theirs_real STREQUAL _ours_real)
        message(STATUS "kvmap: TorchConfig found ${${_var}}, another copy than ${Torch_DIR}'s; using ${_ours}")
        list(FIND TORCH_LIBRARIES "${${_var}}" _idx)
        if(_idx GREATER -1)
          list(REMOVE_AT TORCH_LIBRARIES ${_idx})
          list(INSERT TORCH_LIBRARIES ${_idx} "${_ours}")
        endif()
        set(${_var} "${_ours}" CACHE FILEPATH "${_tgt} of the LibTorch kvmap uses" FORCE)
      endif()
    endif()
  endforeach()

  # A wheel: libtorch_cuda needs nvidia/*/lib (its RPATH says so; the linker looks elsewhere).
  file(GLOB _kvmap_nvidia_libdirs LIST_DIRECTORIES TRUE "${KVMAP_TORCH_LIBDIR}/../../nvidia/*/lib")
  foreach(_dir IN LISTS _kvmap_nvidia_libdirs)
    get_filename_component(_dir "${_dir}" REALPATH)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_dir}")
  endforeach()

  # The standard the ATen headers demand ("#error C++NN or later compatible compiler ...").
  set(KVMAP_TORCH_CXX_STANDARD 17)
  foreach(_inc IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${_inc}/ATen/ATen.h")
      file(STRINGS "${_inc}/ATen/ATen.h" _kvmap_aten_std REGEX "C\\+\\+[0-9]+ or later compatible compiler")
      if(_kvmap_aten_std MATCHES "C\\+\\+([0-9]+) or later" AND CMAKE_MATCH_1 GREATER KVMAP_TORCH_CXX_STANDARD)
        set(KVMAP_TORCH_CXX_STANDARD ${CMAKE_MATCH_1})
      endif()
      break()
    endif()
  endforeach()
endmacro()

# kvmap's own build: the headers torch's headers include but its package does not ship (torch
# >= 2.x's ATen/functorch/Interpreter.h includes nlohmann/json.hpp) come from, in this order:
# KVMAP_NLOHMANN_JSON_INCLUDE_DIR; the Python package nlohmann-json in Python_EXECUTABLE's
# environment (a build requirement of pip's build, installed in the torch2 venv), so that a
# system copy does not decide a pip build; the system's (find_path: Debian's
# nlohmann-json3-dev, spack's nlohmann-json). Then every torch header that kvmap's sources
# include is preprocessed once: a header still missing stops the configuration with its name,
# instead of a compile error deep inside torch. Sets KVMAP_TORCH_EXTRA_INCLUDE_DIRS.
function(kvmap_check_torch_headers)
  set(KVMAP_NLOHMANN_JSON_INCLUDE_DIR "${KVMAP_NLOHMANN_JSON_INCLUDE_DIR}" CACHE PATH
      "Directory holding nlohmann/json.hpp, which LibTorch 2.x's headers include but do not ship")
  set(_extra "")
  set(_origin "")
  if(KVMAP_NLOHMANN_JSON_INCLUDE_DIR)
    set(_extra "${KVMAP_NLOHMANN_JSON_INCLUDE_DIR}")
    set(_origin "KVMAP_NLOHMANN_JSON_INCLUDE_DIR")
  elseif(Python_EXECUTABLE)
    execute_process(
      COMMAND ${Python_EXECUTABLE} -c
              "import importlib.util as u, os; s = u.find_spec('nlohmann_json'); print(os.path.join(s.submodule_search_locations[0], 'include') if s else '')"
      OUTPUT_VARIABLE _py_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_py_dir AND EXISTS "${_py_dir}/nlohmann/json.hpp")
      set(_extra "${_py_dir}")
      set(_origin "the Python package nlohmann-json of ${Python_EXECUTABLE}")
    endif()
  endif()

  # The torch headers kvmap's C++ sources include (device headers need the GPU part: left out
  # where kvmap does not compile them; the Python module's need Python.h, found later).
  set(_sources "")
  foreach(_dir IN ITEMS runtime tests perf examples)
    file(GLOB_RECURSE _found "${PROJECT_SOURCE_DIR}/${_dir}/*.cpp" "${PROJECT_SOURCE_DIR}/${_dir}/*.hpp"
         "${PROJECT_SOURCE_DIR}/${_dir}/*.h")
    list(APPEND _sources ${_found})
  endforeach()
  set(_headers "")
  foreach(_src IN LISTS _sources)
    file(STRINGS "${_src}" _lines REGEX "^#include <(ATen|c10|torch)/")
    foreach(_line IN LISTS _lines)
      string(REGEX MATCH "<([^>]+)>" _ "${_line}")
      set(_h "${CMAKE_MATCH_1}")
      if(_h MATCHES "^(c10|ATen)/(cuda|hip)/" AND NOT KVMAP_TORCH_GPU_PART)
        continue()
      endif()
      foreach(_inc IN LISTS TORCH_INCLUDE_DIRS)
        if(EXISTS "${_inc}/${_h}")
          list(APPEND _headers "${_h}")
          break()
        endif()
      endforeach()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES _headers)
  list(SORT _headers)
  set(_tu "${CMAKE_BINARY_DIR}/CMakeFiles/kvmap_torch_headers.cpp")
  set(_text "// Every torch header kvmap includes (cmake/KvmapTorch.cmake: kvmap_check_torch_headers)\n")
  foreach(_h IN LISTS _headers)
    string(APPEND _text "#include <${_h}>\n")
  endforeach()
  file(WRITE "${_tu}" "${_text}")

  function(_kvmap_preprocess extra out_rc out_err)
    set(_flags -std=c++${CMAKE_CXX_STANDARD} -E -o /dev/null)
    # The compiler's own directories stay where they are (-isystem /usr/include breaks
    # libstdc++'s #include_next), as CMake leaves them out of compile commands.
    foreach(_inc IN LISTS extra TORCH_INCLUDE_DIRS)
      if(NOT _inc IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
        list(APPEND _flags -isystem "${_inc}")
      endif()
    endforeach()
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} ${_flags} "${_tu}"
                    RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_QUIET)
    set(${out_rc} "${_rc}" PARENT_SCOPE)
    set(${out_err} "${_err}" PARENT_SCOPE)
  endfunction()

  if(NOT _extra)
    find_path(KVMAP_SYSTEM_NLOHMANN_JSON_DIR nlohmann/json.hpp)
    if(KVMAP_SYSTEM_NLOHMANN_JSON_DIR)
      set(_extra "${KVMAP_SYSTEM_NLOHMANN_JSON_DIR}")
      set(_origin "the system's")
    endif()
  endif()
  set(_rc 0)
  # nvcc_wrapper (a CUDA Kokkos) compiles .cpp files as CUDA: the check is the host compiler's.
  if(NOT Kokkos_ENABLE_CUDA)
    _kvmap_preprocess("${_extra}" _rc _err)
  endif()
  if(NOT _rc EQUAL 0)
    string(REGEX MATCH "fatal error: ([^:\n]+): No such file" _ "${_err}")
    set(_missing "${CMAKE_MATCH_1}")
    if(_missing STREQUAL "nlohmann/json.hpp")
      set(_env "the Python environment")
      if(Python_EXECUTABLE)
        set(_env "the Python environment of ${Python_EXECUTABLE}")
      endif()
      message(FATAL_ERROR "kvmap: LibTorch ${Torch_VERSION}'s headers (${TORCH_INSTALL_PREFIX}/include) include "
                          "<nlohmann/json.hpp>, which the torch package does not ship, and none was found. "
                          "Install the header-only package nlohmann-json into ${_env} that builds "
                          "kvmap (pip install nlohmann-json; pip's own build of kvmap "
                          "does this itself), or name a directory that holds nlohmann/json.hpp: "
                          "-DKVMAP_NLOHMANN_JSON_INCLUDE_DIR=<dir> (Debian: nlohmann-json3-dev, "
                          "spack: nlohmann-json).")
    elseif(_missing)
      message(FATAL_ERROR "kvmap: LibTorch ${Torch_VERSION}'s headers (${TORCH_INSTALL_PREFIX}/include) include "
                          "<${_missing}>, which neither the torch package nor this system provides. "
                          "The compiler said:\n${_err}")
    else()
      message(FATAL_ERROR "kvmap: LibTorch ${Torch_VERSION}'s headers do not preprocess with "
                          "${CMAKE_CXX_COMPILER} -std=c++${CMAKE_CXX_STANDARD}:\n${_err}")
    endif()
  endif()
  if(_extra)
    message(STATUS "kvmap: nlohmann/json.hpp for torch's headers: from ${_origin} (${_extra})")
  endif()
  set(KVMAP_TORCH_EXTRA_INCLUDE_DIRS "${_extra}" PARENT_SCOPE)
endfunction()
