#include "kvmap/random.hpp"

#include <atomic>
#include <mutex>

#include "kvmap/error.hpp"

#include "comm_registry.hpp"
#include "agreement.hpp"
#include "dist_view_access.hpp"
#include "hash.hpp"
#include "philox.hpp"

namespace kvmap {

namespace {
std::mutex g_seed_mutex;
std::uint64_t g_seed = 0x6b766d6170ull;  // "kvmap"
std::uint64_t g_seed_epoch = 0;          // advanced by manual_seed: restarts every stream count

enum class Distribution { Uniform, Normal };

// What the fill kernel captures (at namespace scope: CUDA's extended lambdas cannot capture
// function-local types).
struct FillGeometry {
  int ndim;
  std::int64_t lext[Impl::kMaxRank];
  std::int64_t gstride[Impl::kMaxRank];
  std::int64_t lo[Impl::kMaxRank];
};

template <class M, class T>
void fill_random(const DistView<M>& out, std::uint64_t key, Distribution dist) {
  using Exec = typename DistView<M>::execution_space;
  const Layout& L = out.layout();
  const int ndim = L.ndim();
  FillGeometry g{};
  g.ndim = ndim;
  std::int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    g.lext[d] = out.lshape()[d];
    g.gstride[d] = stride;
    stride *= L.gshape()[d];
  }
  if (L.split()) g.lo[*L.split()] = L.offset(out.comm().rank());
  T* data = static_cast<T*>(out.local_data());
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= g.lext[d];
  const bool normal = dist == Distribution::Normal;
  Kokkos::parallel_for(
      "kvmap::random", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) {
        std::int64_t rest = i, global = 0;
        for (int d = g.ndim - 1; d >= 0; --d) {
          global += (rest % g.lext[d] + g.lo[d]) * g.gstride[d];
          rest /= g.lext[d];
        }
        data[i] = Detail::philox_element<T>(static_cast<std::uint64_t>(global), 0, key, normal);
      });
  Exec().fence();
}

template <class M>
DistView<M> make_random(const char* site, Shape gshape, DType dtype, std::optional<int> split,
                        Comm comm, std::optional<std::uint64_t> seed, Distribution dist) {
  // Seeded calls use stream 0 of that seed; unseeded calls take the next stream of this
  // communicator, on every rank whatever happens next, and every rank must use the same key:
  // agreed with the arguments.
  const Detail::StreamState state =
      seed ? Detail::StreamState{*seed, 0} : Detail::next_stream(comm);
  return Detail::new_balanced<M>(
      site, gshape, dtype, split, comm,
      [&](Detail::Signature& sig) {
        sig.arg("seed", state.seed).arg("stream", state.stream);
        KVMAP_CHECK(dtype == DType::Float32 || dtype == DType::Float64, TypeError,
                    "kvmap::" << site << ": dtype must be float32 or float64, got " << name(dtype));
      },
      [&](DistView<M>& out) {
        if (dtype == DType::Float32) {
          fill_random<M, float>(out, state.key(), dist);
        } else {
          fill_random<M, double>(out, state.key(), dist);
        }
      });
}

}  // namespace

void manual_seed(std::uint64_t seed, const Comm& comm) {
  Detail::collective(
      "manual_seed", comm,
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        sig.arg("seed", seed);
        return true;
      },
      [&](bool, const Detail::NoPayload&) {
        std::lock_guard<std::mutex> lock(g_seed_mutex);
        g_seed = seed;
        ++g_seed_epoch;
        return true;
      });
}

std::uint64_t initial_seed() {
  std::lock_guard<std::mutex> lock(g_seed_mutex);
  return g_seed;
}

namespace Detail {
std::uint64_t stream_key(std::uint64_t seed, std::uint64_t stream) {
  return splitmix64(splitmix64(seed) ^ (stream * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull));
}
StreamState next_stream(const Comm& comm) {
  std::uint64_t seed = 0, epoch = 0;
  {
    std::lock_guard<std::mutex> lock(g_seed_mutex);
    seed = g_seed;
    epoch = g_seed_epoch;
  }
  return StreamState{seed, Detail::next_sequence(comm, epoch)};
}
}  // namespace Detail

namespace random {

template <class M>
DistView<M> uniform(Shape gshape, DType dtype, std::optional<int> split, Comm comm,
                    std::optional<std::uint64_t> seed) {
  return make_random<M>("random::uniform", std::move(gshape), dtype, split, std::move(comm), seed,
                        Distribution::Uniform);
}

template <class M>
DistView<M> normal(Shape gshape, DType dtype, std::optional<int> split, Comm comm,
                   std::optional<std::uint64_t> seed) {
  return make_random<M>("random::normal", std::move(gshape), dtype, split, std::move(comm), seed,
                        Distribution::Normal);
}

#define KVMAP_INSTANTIATE_RANDOM(Space)                                                        \
  template KVMAP_EXPORT DistView<Space> uniform<Space>(Shape, DType, std::optional<int>, Comm, \
                                                       std::optional<std::uint64_t>);          \
  template KVMAP_EXPORT DistView<Space> normal<Space>(Shape, DType, std::optional<int>, Comm,  \
                                                      std::optional<std::uint64_t>);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_RANDOM)

}  // namespace random
}  // namespace kvmap
