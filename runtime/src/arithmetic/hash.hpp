#pragma once
// kvmap's hashes, one owner: FNV-1a over text (names in call signatures), and one 64-bit
// mixer (SplitMix64's finalizer) behind fingerprints, random stream keys, per-sample keys
// and generator-state hashes.
#include <cstdint>

#include "detail.hpp"

namespace kvmap::Detail {

inline constexpr std::uint64_t kFnvOffset = 1469598103934665603ull;
inline constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio

constexpr std::uint64_t fnv1a(std::uint64_t h, const char* text) {
  for (; *text != '\0'; ++text) h = (h ^ static_cast<unsigned char>(*text)) * 1099511628211ull;
  return h;
}

// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One step of SplitMix64: the mixer of x advanced by the golden-ratio increment.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  return mix64(x + kGolden);
}

// Fingerprints: h extended by v (order matters).
constexpr std::uint64_t combine64(std::uint64_t h, std::uint64_t v) {
  return mix64(h ^ (v + kGolden + (h << 6) + (h >> 2)));
}

}  // namespace kvmap::Detail
