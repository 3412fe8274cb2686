#pragma once
// Which GPU a rank uses. When kvmap initializes Kokkos (ScopeGuard, `import kvmap`) on a node
// with several visible devices, each rank takes device (node-local rank) mod (devices), the
// node-local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): the same answer under every
// launcher and batch system. The user's own choice wins: Kokkos' device flags on the command
// line, Kokkos' device environment variables, or Kokkos initialized before kvmap. Torch's
// current device follows the device Kokkos ends up on.
#include <string>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "mpi_transport.hpp"

namespace kvmap::Detail {

// The device of a rank: node_local_rank mod visible_devices. Pure; visible_devices >= 1.
int device_for_rank(int node_local_rank, int visible_devices);

// Whether the user chose the device: a Kokkos device flag among args[1..argc) (any Kokkos
// version's spelling: --kokkos-device-id, --kokkos-map-device-id-by, --kokkos-num-devices,
// ...), or one of Kokkos' device environment variables set (read through `getenv`).
bool user_chose_device(int argc, const char* const* argv, const char* (*getenv)(const char*));

// Collective over `comm` (through its transport, counted by stats()).
NodeRank node_local_rank(const Comm& comm);

// Devices the GPU backend of this Kokkos sees (after CUDA_VISIBLE_DEVICES and the like); 0
// without a GPU backend.
int visible_devices();

// Initializes Kokkos with argc/argv (as Kokkos::initialize), on the device this rank maps to
// unless the user chose; collective over MPI_COMM_WORLD. Makes the GPU-aware MPI decision
// first (platform/gpu_aware_mpi.hpp), so that a bad KVMAP_GPU_AWARE_MPI stops every rank
// here.
void initialize_kokkos(int& argc, char**& argv);

// How many ranks share this node, without communicating: as kvmap's device map counted them
// when it started Kokkos on a GPU build, else as the launcher says (OMPI_COMM_WORLD_LOCAL_SIZE
// of Open MPI, MPI_LOCALNRANKS of MPICH's Hydra, SLURM_NTASKS_PER_NODE), else 1.
int node_ranks();

// "cuda:1 (node-local rank 1 of 4, 4 devices visible, mapped by kvmap)", "host", ...
std::string device_report();

}  // namespace kvmap::Detail
