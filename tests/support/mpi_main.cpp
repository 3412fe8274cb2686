// doctest main for MPI tests: every rank runs every test case; the process exits non-zero
// on every rank when any rank had a failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include "kvmap/runtime.hpp"

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
