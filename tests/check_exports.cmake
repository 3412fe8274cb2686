# Fails unless the shared libkvmap exports the API and nothing private: no kvmap::Detail and
# no Kokkos symbol in its dynamic symbol table, the API's entry points present, and no test
# hook compiled into it at all (they live in kvmap_internals only).
# cmake -DLIBRARY=<libkvmap.so> -DNM=<nm> -P check_exports.cmake
execute_process(COMMAND ${NM} -D --defined-only -C ${LIBRARY} OUTPUT_VARIABLE exports
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR exports STREQUAL "")
  message(FATAL_ERROR "check_exports: '${NM} -D' could not read ${LIBRARY}")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${exports}")
list(LENGTH lines exported)
set(private "")
foreach(line IN LISTS lines)
  # "<address> <type> <demangled name>": the name begins at the third field.
  string(REGEX REPLACE "^[0-9a-fA-F]+ [A-Za-z] " "" name "${line}")
  if(name MATCHES "kvmap::Detail::" OR name MATCHES "^(typeinfo( name)? for |vtable for )?Kokkos::")
    list(APPEND private "${name}")
  endif()
endforeach()
if(private)
  list(JOIN private "\n  " shown)
  message(FATAL_ERROR "check_exports: ${LIBRARY} exports private symbols:\n  ${shown}")
endif()
foreach(api "kvmap::stats()" "kvmap::Comm::world()" "kvmap::ScopeGuard::ScopeGuard("
            "kvmap::DistView<Kokkos::HostSpace>::local() const" "kvmap::Impl::vmap_core<Kokkos::HostSpace>"
            "typeinfo for kvmap::ValueError" "kvmap::check_close(")
  string(FIND "${exports}" "${api}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_exports: ${LIBRARY} does not export ${api}")
  endif()
endforeach()
# The test hooks (runtime/src/testing) are not compiled into the library at all. What stays in
# it, hidden, is the library's side: the switches the hooks turn and the fault points they arm
# (platform/switches.cpp: one relaxed atomic load each when nothing is armed, as in every
# application), and the registry's comm_over, which makes a Comm over any transport of
# kvmap's own (the testing target's emulated transport is the one there is).
execute_process(COMMAND ${NM} -C ${LIBRARY} OUTPUT_VARIABLE all RESULT_VARIABLE rc)
foreach(hook arm_fault set_mpi_count_limit set_force_host_staging set_host_follows_gpu_decision
             redecide_gpu_aware_mpi emulated_comm emulated_transport)
  if(all MATCHES "kvmap::Detail::${hook}\\(")
    message(FATAL_ERROR "check_exports: the test hook ${hook} is compiled into ${LIBRARY}")
  endif()
endforeach()
message(STATUS "check_exports: OK, ${exported} symbols exported, none private, no test hook")
