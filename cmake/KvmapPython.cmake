# Decides whether the Python bindings can be built: Debian's /usr/bin/python3 (or
# Python_EXECUTABLE, e.g. the torch2 venv's) with its development files, pybind11, LibTorch's
# libtorch_python and the Python modules torch and mpi4py. Sets KVMAP_PYTHON_FOUND.
include_guard(GLOBAL)

set(KVMAP_PYTHON_FOUND FALSE)
if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3)
endif()
find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
if(NOT Python_FOUND)
  message(STATUS "kvmap: Python bindings off (no Python interpreter with development files)")
  return()
endif()
set(PYBIND11_FINDPYTHON ON)
# The interpreter's own pybind11 first (a venv's is new enough for its Python), then the system's.
execute_process(COMMAND ${Python_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir())"
                RESULT_VARIABLE _kvmap_pb_rc OUTPUT_VARIABLE _kvmap_pb_dir ERROR_QUIET
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_kvmap_pb_rc EQUAL 0)
  find_package(pybind11 CONFIG QUIET HINTS "${_kvmap_pb_dir}")
else()
  find_package(pybind11 CONFIG QUIET)
endif()
# libtorch_python of the one LibTorch kvmap links (cmake/KvmapTorch.cmake), nowhere else.
find_library(KVMAP_TORCH_PYTHON_LIBRARY torch_python PATHS "${KVMAP_TORCH_LIBDIR}" NO_DEFAULT_PATH)
# (pip: torch of the environment pip installs into, cmake/KvmapPip.cmake; mpi4py is a
# dependency pip installs after the build.)
if(SKBUILD)
  set(_kvmap_py_modules torch)
else()
  set(_kvmap_py_modules "torch, mpi4py")
endif()
execute_process(COMMAND ${KVMAP_PYTHON_ENV} ${Python_EXECUTABLE} -c "import ${_kvmap_py_modules}; print(torch.__version__)"
                RESULT_VARIABLE _kvmap_py_rc OUTPUT_VARIABLE _kvmap_py_torch ERROR_QUIET
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT pybind11_FOUND)
  message(STATUS "kvmap: Python bindings off (pybind11 not found)")
elseif(NOT KVMAP_TORCH_PYTHON_LIBRARY)
  message(STATUS "kvmap: Python bindings off (libtorch_python not found)")
elseif(NOT _kvmap_py_rc EQUAL 0)
  message(STATUS "kvmap: Python bindings off (${Python_EXECUTABLE} cannot import ${_kvmap_py_modules})")
elseif(Torch_VERSION AND NOT _kvmap_py_torch MATCHES "^${Torch_VERSION_MAJOR}\\.${Torch_VERSION_MINOR}\\.")
  # Tensors cross the boundary as the same objects only with the same LibTorch.
  message(STATUS "kvmap: Python bindings off (Python's torch ${_kvmap_py_torch} is not the LibTorch "
                 "${Torch_VERSION} kvmap links)")
else()
  set(KVMAP_PYTHON_FOUND TRUE)
  message(STATUS "kvmap: Python bindings for ${Python_EXECUTABLE} (torch ${_kvmap_py_torch})")
endif()
