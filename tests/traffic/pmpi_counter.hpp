#pragma once
// A PMPI layer compiled into the traffic test: every MPI communication call kvmap makes is
// counted here (calls, collectives, bytes received, point-to-point peers, datatypes
// committed) before it goes on to the MPI library through its PMPI_ name. Nothing in kvmap
// knows about it.
#include <cstdint>
#include <set>
#include <string>

namespace kvmap_traffic {

struct Counts {
  std::uint64_t calls = 0;           // every communication call (collective or point-to-point)
  std::uint64_t collectives = 0;     // collective calls
  std::uint64_t all_to_all = 0;      // MPI_Alltoall / Alltoallv / Alltoallw
  std::uint64_t bytes_received = 0;  // what this rank's calls receive, from their arguments
  std::uint64_t types_committed = 0;
  std::uint64_t ops_created = 0;
  std::set<int> sent_to, received_from;  // point-to-point peers (ranks of the communicator)
  std::string functions;                 // names of the calls, in order, space separated
};

// Starts counting from zero (counting is on from then until stop()).
void start();
// What was counted since start(); counting stops.
Counts stop();

}  // namespace kvmap_traffic
