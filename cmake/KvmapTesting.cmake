# Test registration helpers. MPI tests run at every process count in KVMAP_TEST_NPROCS
# (capped by MPIEXEC_MAX_NUMPROCS), always through
#   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} N ${MPIEXEC_PREFLAGS} exe ${MPIEXEC_POSTFLAGS}
# with the launcher flags and environment of the MPI implementation FindMPI found
# (cmake/KvmapMpiexec.cmake), which a site changes without editing CMake (MPIEXEC_PREFLAGS,
# KVMAP_MPIEXEC_PREFLAGS, KVMAP_MPIEXEC_ENVIRONMENT). The same launcher, flags and environment
# are written to <build>/kvmap-mpiexec for scripts.
include_guard(GLOBAL)

include(KvmapMpiexec)
kvmap_mpi_launch_defaults("${MPIEXEC_EXECUTABLE}" "${MPI_CXX_LIBRARY_VERSION_STRING}" _kvmap_launch)
set(KVMAP_MPI_IMPLEMENTATION "${_kvmap_launch_IMPLEMENTATION}")
set(KVMAP_MPIEXEC_PREFLAGS "${_kvmap_launch_FLAGS}" CACHE STRING
    "Launcher flags of kvmap's MPI tests after MPIEXEC_PREFLAGS (default: the MPI implementation's)")
set(KVMAP_MPIEXEC_ENVIRONMENT "${_kvmap_launch_ENVIRONMENT}" CACHE STRING
    "Environment of kvmap's MPI tests and <build>/kvmap-mpiexec, VAR=value;... (default: the MPI implementation's)")
# Every MPI test below, and kvmap-mpiexec, use both.
set(MPIEXEC_PREFLAGS ${MPIEXEC_PREFLAGS} ${KVMAP_MPIEXEC_PREFLAGS})
if(MPIEXEC_EXECUTABLE)
  kvmap_write_mpiexec(${PROJECT_BINARY_DIR}/kvmap-mpiexec "${MPIEXEC_EXECUTABLE}" "${MPIEXEC_PREFLAGS}"
                      "${KVMAP_MPIEXEC_ENVIRONMENT}" "${KVMAP_MPI_IMPLEMENTATION}")
  message(STATUS "kvmap: MPI ${KVMAP_MPI_IMPLEMENTATION}: ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} N "
                 "${MPIEXEC_PREFLAGS}; environment ${KVMAP_MPIEXEC_ENVIRONMENT} (${PROJECT_BINARY_DIR}/kvmap-mpiexec)")
endif()

set(KVMAP_TEST_NPROCS "1;2;3;4" CACHE STRING "Process counts MPI tests run at")
set(KVMAP_TEST_TIMEOUT 300 CACHE STRING "Timeout of one test in seconds (a hang is a failure)")
set(KVMAP_TEST_THREADS 2 CACHE STRING "OpenMP threads per rank in tests (Kokkos and LibTorch)")

# Kokkos and LibTorch share libgomp: fixed thread count, no pinning, no busy waiting.
set(KVMAP_TEST_ENVIRONMENT
    "OMP_NUM_THREADS=${KVMAP_TEST_THREADS}"
    "OMP_PROC_BIND=false"
    "OMP_WAIT_POLICY=PASSIVE"
    ${KVMAP_MPIEXEC_ENVIRONMENT})

function(kvmap_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "COMMAND;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT ${KVMAP_TEST_TIMEOUT})
  endif()
  add_test(NAME ${name} COMMAND ${T_COMMAND})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} ENVIRONMENT "${KVMAP_TEST_ENVIRONMENT}"
                       LABELS "${T_LABELS}")
endfunction()

function(kvmap_add_mpi_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "COMMAND;NPROCS;LABELS" ${ARGN})
  if(NOT T_NPROCS)
    set(T_NPROCS ${KVMAP_TEST_NPROCS})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT ${KVMAP_TEST_TIMEOUT})
  endif()
  list(POP_FRONT T_COMMAND exe)
  set(args ${T_COMMAND})
  foreach(np IN LISTS T_NPROCS)
    if(MPIEXEC_MAX_NUMPROCS AND np GREATER MPIEXEC_MAX_NUMPROCS)
      continue()
    endif()
    add_test(NAME ${name}_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS}
                     ${exe} ${MPIEXEC_POSTFLAGS} ${args})
    set_tests_properties(${name}_np${np} PROPERTIES TIMEOUT ${T_TIMEOUT} PROCESSORS ${np}
                         ENVIRONMENT "${KVMAP_TEST_ENVIRONMENT}" LABELS "mpi;${T_LABELS}")
  endforeach()
endfunction()
