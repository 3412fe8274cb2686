# Finds LibTorch and presents exactly one LibTorch to the build, for kvmap and for the
# projects that link the installed kvmap:
#   - every torch library comes from the chosen Torch_DIR. TorchConfig looks up libc10 with
#     find_library, which searches the system before the torch prefix: with Debian's libtorch
#     installed it returns Debian's libc10 beside a wheel's libtorch (two c10 in one process
#     corrupt the dispatcher). Such results are replaced by the file of the imported target
#     of the same torch, and kvmap links the imported target `torch` only, so no absolute
#     system library path reaches the exported targets;
#   - a CUDA-built torch (the PyPI wheel) configures and links on a machine without a GPU:
#     CUDA code stays C++17 (torch copies the C++ standard to CUDA; CMake 3.25 with nvcc 13
#     rejects "CUDA20"), and the linker resolves libtorch_cuda's dependencies in the
#     wheel's nvidia/*/lib before older copies of the system's CUDA toolkit.
# Sets KVMAP_TORCH_LIBDIR (the directory of libtorch) and KVMAP_TORCH_CXX_STANDARD (the
# C++ standard the ATen headers require, at least 17).
include_guard(GLOBAL)

macro(kvmap_find_torch)
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
  if(TARGET torch)
    _kvmap_torch_one_copy()
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
