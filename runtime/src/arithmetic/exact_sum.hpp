#pragma once
// An exact sum of doubles, each scaled by a power of two, in fixed point: the agreement
// payload of linalg::dot and nrm2. Any order of additions (any reduction tree MPI picks, any
// number of ranks taking part) gives the same bits, so the result is the same on every rank
// and from run to run; its size does not depend on the number of ranks.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "detail.hpp"

namespace kvmap::Detail {

struct ExactSum {
  // Bits of weight 2^kLow .. 2^(kLow + 32 kLimbs): every double times 2^-1080 .. 2^1080
  // (the squares and scaled partial sums of nrm2), with room for 2^30 ranks of carries.
  static constexpr int kLow = -2240;
  static constexpr int kLimbs = 140;
  // 32 bits of significance per limb, carried in 64: additions never overflow a limb before
  // 2^31 of them, and the carries are propagated only when rounding.
  std::int64_t limb[kLimbs];
  std::uint32_t nan, pos_inf, neg_inf, unused;

  ExactSum() { std::memset(this, 0, sizeof *this); }

  // Adds v * 2^scale exactly (a non-finite v is counted, not added).
  void add(double v, int scale = 0) {
    if (std::isnan(v)) {
      ++nan;
      return;
    }
    if (std::isinf(v)) {
      ++(v > 0 ? pos_inf : neg_inf);
      return;
    }
    if (v == 0.0) return;
    int e = 0;
    const double f = std::frexp(v, &e);  // v = f * 2^e, 0.5 <= |f| < 1
    const auto mantissa = static_cast<std::int64_t>(std::ldexp(f, 53));
    const int pos = e - 53 + scale - kLow;  // weight of the mantissa's lowest bit
    const int i = pos / 32, shift = pos % 32;
    const std::uint64_t m = static_cast<std::uint64_t>(mantissa < 0 ? -mantissa : mantissa);
    const unsigned __int128 wide = static_cast<unsigned __int128>(m) << shift;
    const std::int64_t sign = mantissa < 0 ? -1 : 1;
    for (int k = 0; k < 3 && i + k < kLimbs; ++k) {
      limb[i + k] += sign * static_cast<std::int64_t>((wide >> (32 * k)) & 0xffffffffu);
    }
  }

  void merge(const ExactSum& o) {
    for (int k = 0; k < kLimbs; ++k) limb[k] += o.limb[k];
    nan += o.nan;
    pos_inf += o.pos_inf;
    neg_inf += o.neg_inf;
  }

  // The sum rounded to nearest: mantissa * 2^exponent (the mantissa a double below 2^97, so
  // sums beyond the double range keep their value; 0 for an empty sum). Non-finite parts are
  // the caller's (nan, pos_inf, neg_inf).
  std::pair<double, int> rounded() const {
    // Carries into 32-bit digits, the sign in the final carry.
    std::int64_t digit[kLimbs];
    __int128 carry = 0;
    for (int k = 0; k < kLimbs; ++k) {
      const __int128 t = static_cast<__int128>(limb[k]) + carry;
      digit[k] = static_cast<std::int64_t>(t & 0xffffffff);
      carry = t >> 32;  // arithmetic: floor division
    }
    bool negative = carry < 0;
    if (negative) {
      // Two's complement of the digits: the magnitude.
      std::int64_t borrow = 0;
      for (int k = 0; k < kLimbs; ++k) {
        const std::int64_t t = -digit[k] - borrow;
        digit[k] = t & 0xffffffff;
        borrow = t < 0 ? 1 : 0;
      }
    }
    int top = kLimbs - 1;
    while (top >= 0 && digit[top] == 0) --top;
    if (top < 0) return {0.0, 0};
    const int lo = top >= 2 ? top - 2 : 0;
    unsigned __int128 head = 0;
    for (int k = top; k >= lo; --k) head = (head << 32) | static_cast<std::uint64_t>(digit[k]);
    bool sticky = false;
    for (int k = 0; k < lo; ++k) sticky = sticky || digit[k] != 0;
    // The digits below as a sticky bit under 96 significant bits: one correct rounding.
    head = (head << 1) | (sticky ? 1u : 0u);
    const double m = static_cast<double>(head);
    return {negative ? -m : m, 32 * lo + kLow - 1};
  }
};

}  // namespace kvmap::Detail
