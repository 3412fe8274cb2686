// Conversions of Python arguments (dist_views.hpp).
#include "dist_views.hpp"

#include <torch/python.h>

namespace kvmap::python {

void same_space(const char* who, const PyDistView& x, const PyDistView& y) {
  if (x.place() != y.place()) {
    throw py::type_error(std::string(who) + ": the DistViews must live in one memory space, got " +
                         place_name(x.place()) + " and " + place_name(y.place()));
  }
}

kvmap::Comm to_comm(const py::object& comm) {
  if (comm.is_none()) return kvmap::Comm::world();
  // An mpi4py communicator: its Fortran handle converts without mpi4py's C headers.
  if (!py::hasattr(comm, "py2f")) {
    throw py::type_error("kvmap: comm must be an mpi4py.MPI.Comm or None, got " +
                         std::string(py::str(py::type::of(comm))));
  }
  return kvmap::Comm::from_fortran(comm.attr("py2f")().cast<std::int64_t>());
}

std::optional<int> to_split(const py::object& split) {
  if (split.is_none()) return std::nullopt;
  if (!py::isinstance<py::int_>(split) || py::isinstance<py::bool_>(split)) {
    throw py::type_error("kvmap: split must be an int or None, got " +
                         std::string(py::str(py::type::of(split))));
  }
  return split.cast<int>();
}

py::tuple to_tuple(const kvmap::Shape& s) {
  py::tuple t(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) t[i] = s[i];
  return t;
}

kvmap::DType dtype_of(const py::object& dtype, kvmap::DType fallback) {
  if (dtype.is_none()) return fallback;
  return kvmap::from_torch(torch::python::detail::py_object_to_dtype(dtype));
}

kvmap::Boundary to_boundary(const char* who, const std::string& name) {
  for (kvmap::Boundary b :
       {kvmap::Boundary::None, kvmap::Boundary::Periodic, kvmap::Boundary::Reflect,
        kvmap::Boundary::Nearest, kvmap::Boundary::Constant}) {
    if (name == kvmap::name(b)) return b;
  }
  throw py::value_error(std::string(who) +
                        ": boundary must be 'none', 'periodic', 'reflect', "
                        "'nearest' or a number, got '" +
                        name + "'");
}

}  // namespace kvmap::python
