#include "kvmap/dtype.hpp"

#include "kvmap/error.hpp"

namespace kvmap {

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::Bool:
    case DType::UInt8:
    case DType::Int8: return 1;
    case DType::Int16:
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Int32:
    case DType::Float32: return 4;
    case DType::Int64:
    case DType::Float64:
    case DType::Complex64: return 8;
    case DType::Complex128: return 16;
  }
  throw ValueError("kvmap::size_of: invalid DType " + std::to_string(static_cast<int>(dtype)));
}

const char* name(DType dtype) {
  switch (dtype) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
  }
  return "invalid";
}

bool is_floating_point(DType dtype) {
  return dtype == DType::Float16 || dtype == DType::BFloat16 || dtype == DType::Float32 ||
         dtype == DType::Float64;
}

bool is_complex(DType dtype) {
  return dtype == DType::Complex64 || dtype == DType::Complex128;
}

DType dtype_from_int(int value) {
  KVMAP_CHECK(value >= 0 && value < kNumDTypes, ValueError,
              "kvmap: " << value << " is not a DType (expected 0.." << kNumDTypes - 1 << ")");
  return static_cast<DType>(value);
}

}  // namespace kvmap
