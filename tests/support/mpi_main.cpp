// doctest main for MPI tests: every rank runs every test case; the process exits non-zero
// on every rank when any rank had a failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include "kvmap/runtime.hpp"

#if defined(__SANITIZE_ADDRESS__)
// Under LeakSanitizer: keep every dlopen'ed plugin (Open MPI's MCA components) mapped, so
// allocations they never free are attributed to their library and matched by
// tests/sanitizers/lsan.supp instead of appearing as "<unknown module>".
extern "C" int dlclose(void*) {
  return 0;
}
#endif

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failed = 0;
  {
    doctest::Context context(argc, argv);
    if (rank != 0) context.setOption("minimal", true);  // other ranks report only failures
    failed = context.run() != 0 ? 1 : 0;
    if (context.shouldExit()) return failed;
  }
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed;
}
