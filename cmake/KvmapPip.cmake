# `pip install .` (scikit-build-core sets SKBUILD): the wheel is the Python package kvmap with
# libkvmap, its headers and its CMake package inside it, and no tests, examples or perf.
#   - Layout: <site-packages>/kvmap/{__init__.py,_kvmap*.so,lib/libkvmap.so,include,lib/cmake}.
#     The extension finds libkvmap through $ORIGIN/lib, both find torch's libraries through
#     $ORIGIN-relative paths to <site-packages>/torch/lib (no LD_LIBRARY_PATH; the process
#     keeps the one libc10 and libgomp that `import torch` loaded).
#   - LibTorch: the torch installed in the environment pip installs into, through
#     torch.utils.cmake_prefix_path. Under pip's build isolation the build's interpreter sees
#     only the build requirements (PYTHONPATH names them); with PYTHONPATH and
#     PYTHONNOUSERSITE unset the same interpreter sees its own environment's torch and mpi4py.
#     -DTorch_DIR (--config-settings=cmake.define.Torch_DIR=...) overrides.
#   - Kokkos: Kokkos_ROOT / Kokkos_DIR / CMAKE_PREFIX_PATH where one is named, else built
#     into the wheel (cmake/KvmapBundledKokkos.cmake).
include_guard(GLOBAL)

set(KVMAP_TOP_LEVEL OFF)  # no tests, examples or perf in a wheel
set(KVMAP_WHEEL ON)
set(CMAKE_INSTALL_LIBDIR kvmap/lib CACHE PATH "libkvmap and its CMake package, inside the Python package")
set(CMAKE_INSTALL_INCLUDEDIR kvmap/include CACHE PATH "kvmap's headers, inside the Python package")
set(CMAKE_INSTALL_DATADIR kvmap/share CACHE PATH "kvmap's data, inside the Python package")
set(CMAKE_INSTALL_BINDIR kvmap/bin CACHE PATH "kvmap's programs, inside the Python package")
set(KVMAP_PYTHON_PACKAGE_DIR kvmap)
# RPATHs: <site-packages>/kvmap/lib -> <site-packages>/torch/lib and itself (a Kokkos built
# into the wheel lies there), <site-packages>/kvmap -> both; nothing of the build machine
# (no link paths: CMAKE_INSTALL_RPATH_USE_LINK_PATH is off) but what kvmap_pip_rpaths() adds.
set(KVMAP_PIP_RPATH_LIB "$ORIGIN/../../torch/lib;$ORIGIN")
set(KVMAP_PIP_RPATH_EXTENSION "$ORIGIN/../torch/lib")

# After find_package(MPI) and Kokkos: the MPI library's own directory (as its compiler
# wrapper would add it) where the linker does not search it anyway, and the directory of a
# Kokkos named for the build (a site's Kokkos stays where it is); appended to the RPATHs of
# libkvmap and the extension.
macro(kvmap_pip_rpaths)
  set(_kvmap_abs_dirs "")
  set(_kvmap_libs ${MPI_CXX_LIBRARIES})
  if(NOT KVMAP_BUNDLED_KOKKOS)
    foreach(_t IN ITEMS Kokkos::kokkoscore Kokkos::kokkoskernels_kokkoskernels Kokkos::kokkoskernels)
      if(TARGET ${_t})
        get_target_property(_kvmap_imported ${_t} IMPORTED)
        get_target_property(_kvmap_type ${_t} TYPE)
        if(_kvmap_imported AND NOT _kvmap_type STREQUAL "INTERFACE_LIBRARY")
          get_target_property(_kvmap_loc ${_t} LOCATION)
          list(APPEND _kvmap_libs "${_kvmap_loc}")
        endif()
      endif()
    endforeach()
  endif()
  foreach(_lib IN LISTS _kvmap_libs)
    if(IS_ABSOLUTE "${_lib}" AND EXISTS "${_lib}")
      get_filename_component(_dir "${_lib}" DIRECTORY)
      if(NOT _dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES AND NOT _dir IN_LIST _kvmap_abs_dirs)
        list(APPEND _kvmap_abs_dirs "${_dir}")
      endif()
    endif()
  endforeach()
  list(APPEND CMAKE_INSTALL_RPATH ${_kvmap_abs_dirs})
  list(APPEND KVMAP_PIP_RPATH_EXTENSION ${_kvmap_abs_dirs})
  message(STATUS "kvmap: wheel RPATHs: libkvmap ${CMAKE_INSTALL_RPATH}; extension $ORIGIN/lib;${KVMAP_PIP_RPATH_EXTENSION}")
endmacro()

# Runs Python code with the interpreter pip builds for, in the environment pip installs into.
set(KVMAP_PYTHON_ENV ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE)

if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  execute_process(
    COMMAND ${KVMAP_PYTHON_ENV} ${Python_EXECUTABLE} -c
            "import os, torch.utils; print(os.path.join(torch.utils.cmake_prefix_path, 'Torch'))"
    RESULT_VARIABLE _kvmap_rc OUTPUT_VARIABLE _kvmap_torch_dir ERROR_VARIABLE _kvmap_err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _kvmap_rc EQUAL 0)
    message(FATAL_ERROR "kvmap: pip builds kvmap against the torch of the environment it installs "
                        "into, but ${Python_EXECUTABLE} cannot import torch:\n${_kvmap_err}\n"
                        "Install torch first (pip install 'torch>=2.14,<2.15'), or name a LibTorch "
                        "with --config-settings=cmake.define.Torch_DIR=<prefix>/share/cmake/Torch")
  endif()
  set(Torch_DIR "${_kvmap_torch_dir}" CACHE PATH "LibTorch of the torch in the target environment")
  message(STATUS "kvmap: pip build against the environment's torch: ${Torch_DIR}")
endif()
