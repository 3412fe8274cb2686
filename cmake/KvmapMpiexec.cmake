# How to launch MPI jobs for the MPI implementation in use, in one place for CMake (tests,
# <build>/kvmap-mpiexec) and for scripts without a build tree (cmake -P):
#   Open MPI: --oversubscribe (tests run more ranks than cores); OMPI_ALLOW_RUN_AS_ROOT and
#             OMPI_ALLOW_RUN_AS_ROOT_CONFIRM (it refuses root otherwise: CI and containers);
#             OMPI_MCA_mpi_yield_when_idle=1 (waiting ranks yield to the ones computing).
#   MPICH and its derivatives (Hydra's mpiexec: MVAPICH, Intel MPI): no flags, no variables;
#             Hydra oversubscribes and runs as root as it is.
# The implementation is what the library calls itself (FindMPI's MPI_<lang>_LIBRARY_VERSION_STRING)
# or, failing that, what `mpiexec --version` prints.
#
# Script mode writes a launcher without configuring a project:
#   cmake -DMPIEXEC_EXECUTABLE=$(command -v mpiexec) -DKVMAP_MPIEXEC_OUTPUT=<file> -P KvmapMpiexec.cmake
include_guard(GLOBAL)

# Sets <prefix>_IMPLEMENTATION ("Open MPI", "MPICH" or "unknown"), <prefix>_FLAGS and
# <prefix>_ENVIRONMENT (VAR=value list) in the caller's scope.
function(kvmap_mpi_launch_defaults mpiexec library_version prefix)
  set(_id "${library_version}")
  if(NOT _id AND mpiexec)
    execute_process(COMMAND ${mpiexec} --version OUTPUT_VARIABLE _id ERROR_VARIABLE _id TIMEOUT 30)
  endif()
  if(_id MATCHES "Open MPI|OpenRTE")
    set(${prefix}_IMPLEMENTATION "Open MPI" PARENT_SCOPE)
    set(${prefix}_FLAGS "--oversubscribe" PARENT_SCOPE)
    set(${prefix}_ENVIRONMENT
        "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mpi_yield_when_idle=1"
        PARENT_SCOPE)
  elseif(_id MATCHES "MPICH|HYDRA|MVAPICH|Intel")
    set(${prefix}_IMPLEMENTATION "MPICH" PARENT_SCOPE)
    set(${prefix}_FLAGS "" PARENT_SCOPE)
    set(${prefix}_ENVIRONMENT "" PARENT_SCOPE)
  else()
    set(${prefix}_IMPLEMENTATION "unknown" PARENT_SCOPE)
    set(${prefix}_FLAGS "" PARENT_SCOPE)
    set(${prefix}_ENVIRONMENT "" PARENT_SCOPE)
  endif()
endfunction()

# Writes an executable sh script: kvmap-mpiexec -n N program [args...] runs
# `mpiexec flags -n N program args` with the environment exported.
function(kvmap_write_mpiexec output mpiexec flags environment implementation)
  string(REPLACE ";" " " _flags "${flags}")
  # Open MPI takes a launcher named by absolute path as --prefix and sets LD_LIBRARY_PATH and
  # PATH for the ranks: the launcher goes by name where PATH finds that same file.
  get_filename_component(_name "${mpiexec}" NAME)
  unset(_kvmap_on_path CACHE)
  find_program(_kvmap_on_path NAMES "${_name}")
  set(_on_path_found "${_kvmap_on_path}")
  unset(_kvmap_on_path CACHE)
  if(_on_path_found)
    get_filename_component(_on_path "${_on_path_found}" REALPATH)
    get_filename_component(_given "${mpiexec}" REALPATH)
    if(_on_path STREQUAL _given)
      set(mpiexec "${_name}")
    endif()
  endif()
  set(_exports "")
  foreach(_kv IN LISTS environment)
    string(APPEND _exports "export ${_kv}\n")
  endforeach()
  file(WRITE "${output}"
       "#!/bin/sh\n"
       "# The MPI launcher of kvmap's tests and scripts, with the flags and environment of\n"
       "# ${implementation} (cmake/KvmapMpiexec.cmake). Usage: kvmap-mpiexec -n N program [args...]\n"
       "${_exports}exec \"${mpiexec}\" ${_flags} \"$@\"\n")
  file(CHMOD "${output}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
       WORLD_READ WORLD_EXECUTE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND KVMAP_MPIEXEC_OUTPUT)
  if(NOT MPIEXEC_EXECUTABLE)
    find_program(MPIEXEC_EXECUTABLE NAMES mpiexec mpirun)
  endif()
  if(NOT MPIEXEC_EXECUTABLE)
    message(FATAL_ERROR "kvmap: no mpiexec found; pass -DMPIEXEC_EXECUTABLE=<launcher>")
  endif()
  kvmap_mpi_launch_defaults("${MPIEXEC_EXECUTABLE}" "" _launch)
  kvmap_write_mpiexec("${KVMAP_MPIEXEC_OUTPUT}" "${MPIEXEC_EXECUTABLE}" "${_launch_FLAGS}"
                      "${_launch_ENVIRONMENT}" "${_launch_IMPLEMENTATION}")
  message(STATUS "kvmap: ${KVMAP_MPIEXEC_OUTPUT}: ${_launch_IMPLEMENTATION} (${MPIEXEC_EXECUTABLE} ${_launch_FLAGS})")
endif()
