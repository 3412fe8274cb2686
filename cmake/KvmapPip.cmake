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
#   - Kokkos: Kokkos_ROOT / CMAKE_PREFIX_PATH, else the project's dependency cache
#     (cmake/KvmapKokkos.cmake).
include_guard(GLOBAL)

set(KVMAP_TOP_LEVEL OFF)  # no tests, examples or perf in a wheel
set(CMAKE_INSTALL_LIBDIR kvmap/lib CACHE PATH "libkvmap and its CMake package, inside the Python package")
set(CMAKE_INSTALL_INCLUDEDIR kvmap/include CACHE PATH "kvmap's headers, inside the Python package")
set(CMAKE_INSTALL_DATADIR kvmap/share CACHE PATH "kvmap's data, inside the Python package")
set(CMAKE_INSTALL_BINDIR kvmap/bin CACHE PATH "kvmap's programs, inside the Python package")
set(KVMAP_PYTHON_PACKAGE_DIR kvmap)
# <site-packages>/kvmap/lib -> <site-packages>/torch/lib, and <site-packages>/kvmap -> it.
set(KVMAP_PIP_RPATH_LIB "$ORIGIN/../../torch/lib")
set(KVMAP_PIP_RPATH_EXTENSION "$ORIGIN/../torch/lib")

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
