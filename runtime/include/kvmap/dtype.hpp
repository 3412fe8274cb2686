#pragma once
/// \file
/// Element types of distributed arrays: kvmap::DType and its C++ counterparts.
#include "kvmap/config.hpp"
#include <complex>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

KVMAP_API_BEGIN
namespace kvmap {

/// Storage type of DType::Float16 (Kokkos 3.4 has no host arithmetic type for it).
struct float16_bits {
  std::uint16_t bits;  ///< the IEEE binary16 bit pattern
};
/// Storage type of DType::BFloat16.
struct bfloat16_bits {
  std::uint16_t bits;  ///< the bfloat16 bit pattern (the upper half of a float32)
};

/// \def KVMAP_FOR_EACH_DTYPE(X)
/// The one table of kvmap's element types: X(enumerator, name, storage type, torch
/// ScalarType enumerator, MPI datatype) for each.
// The one table of kvmap's element types; adding a type is one line here.
//   X(enumerator, name, storage type, torch ScalarType enumerator, MPI datatype)
// The torch and MPI columns are tokens, expanded only where those libraries are included
// (MPI_DATATYPE_NULL: MPI has no type, reductions refuse it; messages carry bytes).
#define KVMAP_FOR_EACH_DTYPE(X)                                                     \
  X(Bool, "bool", bool, Bool, MPI_C_BOOL)                                           \
  X(UInt8, "uint8", std::uint8_t, Byte, MPI_UINT8_T)                                \
  X(Int8, "int8", std::int8_t, Char, MPI_INT8_T)                                    \
  X(Int16, "int16", std::int16_t, Short, MPI_INT16_T)                               \
  X(Int32, "int32", std::int32_t, Int, MPI_INT32_T)                                 \
  X(Int64, "int64", std::int64_t, Long, MPI_INT64_T)                                \
  X(Float16, "float16", ::kvmap::float16_bits, Half, MPI_DATATYPE_NULL)             \
  X(BFloat16, "bfloat16", ::kvmap::bfloat16_bits, BFloat16, MPI_DATATYPE_NULL)      \
  X(Float32, "float32", float, Float, MPI_FLOAT)                                    \
  X(Float64, "float64", double, Double, MPI_DOUBLE)                                 \
  X(Complex64, "complex64", std::complex<float>, ComplexFloat, MPI_C_FLOAT_COMPLEX) \
  X(Complex128, "complex128", std::complex<double>, ComplexDouble, MPI_C_DOUBLE_COMPLEX)

#define KVMAP_DTYPE_ENUMERATOR(E, name, T, torch_type, mpi_type) E,
/// An element type: Bool, UInt8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32,
/// Float64, Complex64, Complex128 (KVMAP_FOR_EACH_DTYPE).
enum class DType { KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_ENUMERATOR) };
#undef KVMAP_DTYPE_ENUMERATOR

#define KVMAP_DTYPE_COUNT(E, name, T, torch_type, mpi_type) +1
/// How many element types there are.
inline constexpr int kNumDTypes = 0 KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_COUNT);
#undef KVMAP_DTYPE_COUNT

/// A type as a value: what visit() hands its function.
template <class T>
struct type_tag {
  using type = T;  ///< the storage type
};

/// Calls f(type_tag<T>{}) with the storage type T of `dtype` (the table's third column) and
/// returns what it returns; ValueError for a value that is not a DType.
template <class F>
decltype(auto) visit(DType dtype, F&& f);

/// Bytes per element.
std::size_t size_of(DType dtype);
/// The type's name as torch and Heat print it ("float32").
const char* name(DType dtype);
/// Float16, BFloat16, Float32 or Float64.
bool is_floating_point(DType dtype);
/// Complex64 or Complex128.
bool is_complex(DType dtype);
/// Throws ValueError when the integer is not a DType.
DType dtype_from_int(int value);

namespace Impl {
template <class T, class = void>
struct is_complex_like : std::false_type {};
/// std::complex and Kokkos::complex alike: a value_type and real()/imag().
template <class T>
struct is_complex_like<T, std::void_t<typename T::value_type, decltype(std::declval<T>().real()),
                                      decltype(std::declval<T>().imag())>> : std::true_type {};
template <class>
inline constexpr bool dependent_false = false;
/// The DType whose storage type is exactly U (as an int), or -1.
template <class U>
constexpr int table_dtype() {
  int found = -1, index = 0;
#define KVMAP_DTYPE_MATCH(E, name, T, torch_type, mpi_type) \
  if (std::is_same_v<U, T>) found = index;                  \
  ++index;
  KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_MATCH)
#undef KVMAP_DTYPE_MATCH
  return found;
}
[[noreturn]] void throw_invalid_dtype(DType dtype);
}  // namespace Impl

/// The DType of a C++ element type (cv-qualifiers ignored).
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (Impl::table_dtype<U>() >= 0) {
    return static_cast<DType>(Impl::table_dtype<U>());
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

template <class F>
decltype(auto) visit(DType dtype, F&& f) {
  switch (dtype) {
#define KVMAP_DTYPE_VISIT(E, name, T, torch_type, mpi_type) \
  case DType::E: return std::forward<F>(f)(type_tag<T>{});
    KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_VISIT)
#undef KVMAP_DTYPE_VISIT
  }
  Impl::throw_invalid_dtype(dtype);
}

}  // namespace kvmap
KVMAP_API_END
