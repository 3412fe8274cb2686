# Test registration helpers. MPI tests run at every process count in KVMAP_TEST_NPROCS
# (capped by MPIEXEC_MAX_NUMPROCS), always through
#   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} N ${MPIEXEC_PREFLAGS} exe ${MPIEXEC_POSTFLAGS}
# so a site adds --oversubscribe or --allow-run-as-root without editing CMake.
include_guard(GLOBAL)

set(KVMAP_TEST_NPROCS "1;2;3;4" CACHE STRING "Process counts MPI tests run at")
set(KVMAP_TEST_TIMEOUT 300 CACHE STRING "Timeout of one test in seconds (a hang is a failure)")
set(KVMAP_TEST_THREADS 2 CACHE STRING "OpenMP threads per rank in tests (Kokkos and LibTorch)")

# Kokkos and LibTorch share libgomp: fixed thread count, no pinning, no busy waiting.
set(KVMAP_TEST_ENVIRONMENT
    "OMP_NUM_THREADS=${KVMAP_TEST_THREADS}"
    "OMP_PROC_BIND=false"
    "OMP_WAIT_POLICY=PASSIVE"
    # Ranks outnumber cores in tests: waiting ranks yield instead of spinning.
    "OMPI_MCA_mpi_yield_when_idle=1")

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
