#pragma once
// Philox4x32-10 and kvmap's random streams: the one generator behind kvmap::random and the
// per-sample draws of vmap (sample_uniform/sample_normal), on the host and in Kokkos kernels.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/impl/kokkos_compat.hpp"

namespace kvmap {

namespace Detail {

// Philox4x32-10 (Salmon et al., SC'11): 4 x 32 random bits from a 128-bit counter and a
// 64-bit key.
struct Philox4x32 {
  std::uint32_t v[4];
};

KOKKOS_INLINE_FUNCTION Philox4x32 philox4x32(std::uint64_t counter_lo, std::uint64_t counter_hi,
                                             std::uint64_t key) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter_lo),
                c1 = static_cast<std::uint32_t>(counter_lo >> 32),
                c2 = static_cast<std::uint32_t>(counter_hi),
                c3 = static_cast<std::uint32_t>(counter_hi >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32),
                        lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32),
                        lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with the full mantissa of the target type (never rounds up to 1).
KOKKOS_INLINE_FUNCTION double uniform_double(std::uint32_t a, std::uint32_t b) {
  const std::uint64_t bits = (static_cast<std::uint64_t>(a) << 32 | b) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}
KOKKOS_INLINE_FUNCTION float uniform_float(std::uint32_t a) {
  return static_cast<float>(a >> 8) * (1.0f / 16777216.0f);
}
// Standard normal from two 64-bit words by Box-Muller (u1 in (0, 1]).
KOKKOS_INLINE_FUNCTION double normal_double(const Philox4x32& r) {
  const double u1 = 1.0 - uniform_double(r.v[0], r.v[1]);
  const double u2 = uniform_double(r.v[2], r.v[3]);
  return math::sqrt(-2.0 * math::log(u1)) * math::cos(6.283185307179586 * u2);
}

// One element of a random stream: Philox of the counter (lo, hi) under `key`, uniform in
// [0, 1) (24 bits for float, 53 for double) or standard normal. Every random value kvmap
// makes, in kvmap::random's kernels and in sample_uniform/sample_normal, comes from here.
template <class T>
KOKKOS_INLINE_FUNCTION T philox_element(std::uint64_t lo, std::uint64_t hi, std::uint64_t key,
                                        bool normal) {
  const Philox4x32 r = philox4x32(lo, hi, key);
  if (normal) return static_cast<T>(normal_double(r));
  if constexpr (std::is_same_v<T, float>) {
    return uniform_float(r.v[0]);
  } else {
    return static_cast<T>(uniform_double(r.v[0], r.v[1]));
  }
}

// The key of stream `stream` under `seed`; distinct (seed, stream) pairs give distinct keys.
std::uint64_t stream_key(std::uint64_t seed, std::uint64_t stream);
// The generator state for the next unseeded collective draw on `comm`: the kvmap seed and
// a stream number counted per communicator since the last manual_seed, so every rank of
// `comm` gets the same pair whatever it drew on other communicators.
struct StreamState {
  std::uint64_t seed;
  std::uint64_t stream;
  std::uint64_t key() const { return stream_key(seed, stream); }
};
StreamState next_stream(const Comm& comm);

}  // namespace Detail

}  // namespace kvmap
