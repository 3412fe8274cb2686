// The PMPI layer of the traffic test (see pmpi_counter.hpp). Linked into the test executable,
// whose definitions of the MPI_ functions come before the MPI library's in symbol lookup, so
// libkvmap's calls land here.
#include "pmpi_counter.hpp"

#include <mpi.h>

namespace kvmap_traffic {
namespace {

bool g_on = false;
Counts g_counts;

std::uint64_t type_bytes(int count, MPI_Datatype type) {
  int size = 0;
  PMPI_Type_size(type, &size);
  return static_cast<std::uint64_t>(count < 0 ? 0 : count) * static_cast<std::uint64_t>(size);
}

int comm_size(MPI_Comm comm) {
  int n = 1;
  PMPI_Comm_size(comm, &n);
  return n;
}

void note(const char* name, bool collective, std::uint64_t received) {
  if (!g_on) return;
  ++g_counts.calls;
  if (collective) ++g_counts.collectives;
  g_counts.bytes_received += received;
  if (!g_counts.functions.empty()) g_counts.functions += ' ';
  g_counts.functions += name;
}

}  // namespace

void start() {
  g_counts = Counts{};
  g_on = true;
}

Counts stop() {
  g_on = false;
  return g_counts;
}

}  // namespace kvmap_traffic

using kvmap_traffic::comm_size;
using kvmap_traffic::g_counts;
using kvmap_traffic::g_on;
using kvmap_traffic::note;
using kvmap_traffic::type_bytes;

extern "C" {

int MPI_Barrier(MPI_Comm comm) {
  note("Barrier", true, 0);
  return PMPI_Barrier(comm);
}

int MPI_Allreduce(const void* s, void* r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  note("Allreduce", true, type_bytes(count, t));
  return PMPI_Allreduce(s, r, count, t, op, comm);
}

int MPI_Reduce(const void* s, void* r, int count, MPI_Datatype t, MPI_Op op, int root,
               MPI_Comm comm) {
  int me = 0;
  PMPI_Comm_rank(comm, &me);
  note("Reduce", true, me == root ? type_bytes(count, t) : 0);
  return PMPI_Reduce(s, r, count, t, op, root, comm);
}

int MPI_Bcast(void* buf, int count, MPI_Datatype t, int root, MPI_Comm comm) {
  int me = 0;
  PMPI_Comm_rank(comm, &me);
  note("Bcast", true, me == root ? 0 : type_bytes(count, t));
  return PMPI_Bcast(buf, count, t, root, comm);
}

int MPI_Allgather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt,
                  MPI_Comm comm) {
  note("Allgather", true, type_bytes(rc, rt) * comm_size(comm));
  return PMPI_Allgather(s, sc, st, r, rc, rt, comm);
}

int MPI_Allgatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[], const int rd[],
                   MPI_Datatype rt, MPI_Comm comm) {
  std::uint64_t bytes = 0;
  for (int p = 0; p < comm_size(comm); ++p) bytes += type_bytes(rc[p], rt);
  note("Allgatherv", true, bytes);
  return PMPI_Allgatherv(s, sc, st, r, rc, rd, rt, comm);
}

int MPI_Gather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, int root,
               MPI_Comm comm) {
  int me = 0;
  PMPI_Comm_rank(comm, &me);
  note("Gather", true, me == root ? type_bytes(rc, rt) * comm_size(comm) : 0);
  return PMPI_Gather(s, sc, st, r, rc, rt, root, comm);
}

int MPI_Gatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[], const int rd[],
                MPI_Datatype rt, int root, MPI_Comm comm) {
  int me = 0;
  PMPI_Comm_rank(comm, &me);
  std::uint64_t bytes = 0;
  if (me == root) {
    for (int p = 0; p < comm_size(comm); ++p) bytes += type_bytes(rc[p], rt);
  }
  note("Gatherv", true, bytes);
  return PMPI_Gatherv(s, sc, st, r, rc, rd, rt, root, comm);
}

int MPI_Scatterv(const void* s, const int sc[], const int sd[], MPI_Datatype st, void* r, int rc,
                 MPI_Datatype rt, int root, MPI_Comm comm) {
  note("Scatterv", true, type_bytes(rc, rt));
  return PMPI_Scatterv(s, sc, sd, st, r, rc, rt, root, comm);
}

int MPI_Alltoall(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt,
                 MPI_Comm comm) {
  note("Alltoall", true, type_bytes(rc, rt) * comm_size(comm));
  if (g_on) ++g_counts.all_to_all;
  return PMPI_Alltoall(s, sc, st, r, rc, rt, comm);
}

int MPI_Alltoallv(const void* s, const int sc[], const int sd[], MPI_Datatype st, void* r,
                  const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm comm) {
  std::uint64_t bytes = 0;
  for (int p = 0; p < comm_size(comm); ++p) bytes += type_bytes(rc[p], rt);
  note("Alltoallv", true, bytes);
  if (g_on) ++g_counts.all_to_all;
  return PMPI_Alltoallv(s, sc, sd, st, r, rc, rd, rt, comm);
}

int MPI_Alltoallw(const void* s, const int sc[], const int sd[], const MPI_Datatype st[], void* r,
                  const int rc[], const int rd[], const MPI_Datatype rt[], MPI_Comm comm) {
  std::uint64_t bytes = 0;
  for (int p = 0; p < comm_size(comm); ++p) bytes += type_bytes(rc[p], rt[p]);
  note("Alltoallw", true, bytes);
  if (g_on) ++g_counts.all_to_all;
  return PMPI_Alltoallw(s, sc, sd, st, r, rc, rd, rt, comm);
}

int MPI_Send(const void* buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  note("Send", false, 0);
  if (g_on) g_counts.sent_to.insert(dest);
  return PMPI_Send(buf, count, t, dest, tag, comm);
}

int MPI_Isend(const void* buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm comm,
              MPI_Request* req) {
  note("Isend", false, 0);
  if (g_on) g_counts.sent_to.insert(dest);
  return PMPI_Isend(buf, count, t, dest, tag, comm, req);
}

int MPI_Recv(void* buf, int count, MPI_Datatype t, int src, int tag, MPI_Comm comm,
             MPI_Status* status) {
  note("Recv", false, type_bytes(count, t));
  if (g_on) g_counts.received_from.insert(src);
  return PMPI_Recv(buf, count, t, src, tag, comm, status);
}

int MPI_Irecv(void* buf, int count, MPI_Datatype t, int src, int tag, MPI_Comm comm,
              MPI_Request* req) {
  note("Irecv", false, type_bytes(count, t));
  if (g_on) g_counts.received_from.insert(src);
  return PMPI_Irecv(buf, count, t, src, tag, comm, req);
}

int MPI_Sendrecv(const void* s, int sc, MPI_Datatype st, int dest, int stag, void* r, int rc,
                 MPI_Datatype rt, int src, int rtag, MPI_Comm comm, MPI_Status* status) {
  note("Sendrecv", false, type_bytes(rc, rt));
  if (g_on) {
    g_counts.sent_to.insert(dest);
    g_counts.received_from.insert(src);
  }
  return PMPI_Sendrecv(s, sc, st, dest, stag, r, rc, rt, src, rtag, comm, status);
}

int MPI_Type_commit(MPI_Datatype* t) {
  if (g_on) ++g_counts.types_committed;
  return PMPI_Type_commit(t);
}

int MPI_Op_create(MPI_User_function* fn, int commute, MPI_Op* op) {
  if (g_on) ++g_counts.ops_created;
  return PMPI_Op_create(fn, commute, op);
}

}  // extern "C"
