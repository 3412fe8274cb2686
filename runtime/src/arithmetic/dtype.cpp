#include "kvmap/dtype.hpp"

#include "kvmap/error.hpp"

namespace kvmap {

namespace Impl {
void throw_invalid_dtype(DType dtype) {
  throw ValueError("kvmap: invalid DType " + std::to_string(static_cast<int>(dtype)));
}
}  // namespace Impl

std::size_t size_of(DType dtype) {
  return visit(dtype, [](auto tag) { return sizeof(typename decltype(tag)::type); });
}

const char* name(DType dtype) {
  switch (dtype) {
#define KVMAP_DTYPE_NAME(E, name, T, torch_type, mpi_type) \
  case DType::E: return name;
    KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_NAME)
#undef KVMAP_DTYPE_NAME
  }
  return "invalid";
}

bool is_floating_point(DType dtype) {
  return visit(dtype, [](auto tag) {
    using T = typename decltype(tag)::type;
    return std::is_floating_point_v<T> || std::is_same_v<T, float16_bits> ||
           std::is_same_v<T, bfloat16_bits>;
  });
}

bool is_complex(DType dtype) {
  return visit(dtype,
               [](auto tag) { return Impl::is_complex_like<typename decltype(tag)::type>::value; });
}

DType dtype_from_int(int value) {
  KVMAP_CHECK(value >= 0 && value < kNumDTypes, ValueError,
              "kvmap: " << value << " is not a DType (expected 0.." << kNumDTypes - 1 << ")");
  return static_cast<DType>(value);
}

}  // namespace kvmap
