#pragma once
// Element types of distributed arrays: kvmap::DType and its C++ counterparts.
#include <complex>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace kvmap {

enum class DType {
  Bool,
  UInt8,
  Int8,
  Int16,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
  Complex64,
  Complex128
};

inline constexpr int kNumDTypes = 12;

// Storage types for the 16-bit floats (Kokkos 3.4 has no host arithmetic type for them).
struct float16_bits {
  std::uint16_t bits;
};
struct bfloat16_bits {
  std::uint16_t bits;
};

std::size_t size_of(DType dtype);
const char* name(DType dtype);
bool is_floating_point(DType dtype);
bool is_complex(DType dtype);
// Throws ValueError when the integer is not a DType.
DType dtype_from_int(int value);

namespace Impl {
template <class T, class = void>
struct is_complex_like : std::false_type {};
// std::complex and Kokkos::complex alike: a value_type and real()/imag().
template <class T>
struct is_complex_like<T, std::void_t<typename T::value_type, decltype(std::declval<T>().real()),
                                      decltype(std::declval<T>().imag())>> : std::true_type {};
template <class>
inline constexpr bool dependent_false = false;
}  // namespace Impl

// The DType of a C++ element type (cv-qualifiers ignored).
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    return DType::Bool;
  } else if constexpr (std::is_same_v<U, float16_bits>) {
    return DType::Float16;
  } else if constexpr (std::is_same_v<U, bfloat16_bits>) {
    return DType::BFloat16;
  } else if constexpr (std::is_same_v<U, float>) {
    return DType::Float32;
  } else if constexpr (std::is_same_v<U, double>) {
    return DType::Float64;
  } else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 1) {
    return DType::UInt8;
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 1) {
    return DType::Int8;
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 2) {
    return DType::Int16;
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) {
    return DType::Int32;
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) {
    return DType::Int64;
  } else if constexpr (Impl::is_complex_like<U>::value) {
    using V = std::remove_cv_t<typename U::value_type>;
    static_assert((std::is_same_v<V, float> && sizeof(U) == 8) ||
                      (std::is_same_v<V, double> && sizeof(U) == 16),
                  "kvmap::dtype_of: complex element types must be complex<float> or "
                  "complex<double> with the layout of std::complex");
    return std::is_same_v<V, float> ? DType::Complex64 : DType::Complex128;
  } else {
    static_assert(Impl::dependent_false<U>,
                  "kvmap::dtype_of: element type has no kvmap::DType (supported: bool, "
                  "(u)int8, int16/32/64, float, double, complex<float/double>, "
                  "kvmap::float16_bits, kvmap::bfloat16_bits)");
    return DType::Bool;
  }
}

}  // namespace kvmap
