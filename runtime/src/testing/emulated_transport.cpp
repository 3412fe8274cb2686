// The emulated transport of emulated_comm (testing/hooks.hpp): this process plays one rank of
// a communicator, every other rank is taken to do what it does, and no MPI call is made. In the
// testing target only, never in libkvmap.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hooks.hpp"
#include "kvmap/error.hpp"

namespace kvmap::Detail {

namespace {

class EmulatedTransport final : public Transport {
 public:
  using Transport::Transport;
  MPI_Comm raw() const override {
    throw Error("kvmap::Comm: an emulated communicator has no MPI communicator");
  }
  void release() override {}
  void barrier() const override {}
  // Every rank's contribution is this rank's.
  void allgather_bytes(const void* mine, std::size_t nbytes, void* all) const override {
    for (int r = 0; r < size() && nbytes > 0; ++r)
      std::memcpy(static_cast<unsigned char*>(all) + nbytes * r, mine, nbytes);
  }
  void bcast_bytes(void*, std::size_t, int) const override {}  // the root's are already there
  std::string bcast_string(const std::string& mine, int) const override { return mine; }
  void allreduce_bytes(void*, std::size_t, MPI_User_function*) const override {}
  void allreduce(void*, std::size_t, DType, Reduction) const override {}
  // Every rank's block is this rank's, repeated where each rank's goes.
  void allgatherv_bytes(const void* send, int send_count, void* recv,
                        const std::vector<int>& counts,
                        const std::vector<int>& displs) const override {
    const auto n = static_cast<std::size_t>(size());
    KVMAP_CHECK(counts.size() == n && displs.size() == n, ValueError,
                "kvmap: allgatherv needs one count and displacement per rank");
    for (std::size_t r = 0; r < n; ++r) {
      const auto bytes = static_cast<std::size_t>(std::min(send_count, counts[r]));
      if (bytes > 0) std::memcpy(static_cast<unsigned char*>(recv) + displs[r], send, bytes);
    }
  }
  // Messages from other ranks never arrive.
  void run(Messages&, const void*, void*) const override {}
  void alltoallw(const void*, const PeerTypes&, void*, const PeerTypes&) const override {}
  std::vector<IdMessage> sparse_exchange(std::vector<IdMessage> sends, int) const override {
    std::vector<IdMessage> own;
    for (IdMessage& m : sends) {
      if (m.peer == rank()) own.push_back(std::move(m));
    }
    return own;
  }
  NodeRank node_rank() const override { return NodeRank{}; }
};

}  // namespace

std::unique_ptr<Transport> emulated_transport(int rank, int size) {
  return std::make_unique<EmulatedTransport>(rank, size);
}

}  // namespace kvmap::Detail
