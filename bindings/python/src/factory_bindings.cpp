// Factories of DistViews (from tensors, values, random streams) and linear algebra on them.
// A DistView made from a tensor lives where the tensor does; the other factories take device
// "cpu" or "gpu".
#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "dist_views.hpp"

namespace kvmap::python {

namespace {

// DistViews of tensors: each rank's full copy, each rank's shard, or a balanced shard.
void bind_from_tensors(py::module_& m) {
  m.def("_from_global", [](const at::Tensor& t, const py::object& split, const py::object& comm) {
    auto s = to_split(split);
    auto c = to_comm(comm);
    py::gil_scoped_release release;
    return in_space(place_of(t), [&](auto space) {
      using M = typename decltype(space)::type;
      return PyDistView(kvmap::DistView<M>::from_global(t, s, c));
    });
  });
  m.def("_from_local", [](const at::Tensor& t, const py::object& split, const py::object& comm) {
    auto s = to_split(split);
    auto c = to_comm(comm);
    py::gil_scoped_release release;
    return in_space(place_of(t), [&](auto space) {
      using M = typename decltype(space)::type;
      return PyDistView(kvmap::DistView<M>::from_local(t, s, c));
    });
  });
  // A shard of a balanced (split given) or replicated array of global shape `gshape`: every
  // rank knows the layout, so no count is gathered (one fixed-size agreement).
  m.def("_from_local_balanced", [](const at::Tensor& t, const py::object& split,
                                   const kvmap::Shape& gshape, const py::object& comm) {
    auto s = to_split(split);
    auto c = to_comm(comm);
    py::gil_scoped_release release;
    const kvmap::Layout layout = s ? kvmap::Layout::balanced(gshape, s, c.size())
                                   : kvmap::Layout::replicated(gshape, c.size());
    return in_space(place_of(t), [&](auto space) {
      using M = typename decltype(space)::type;
      return PyDistView(kvmap::DistView<M>::from_local(t, layout, c));
    });
  });
}

// DistViews of values (full, arange, random streams).
void bind_from_values(py::module_& m) {
  m.def("_full", [](const kvmap::Shape& shape, double value, const py::object& dtype,
                    const py::object& split, const py::object& comm, const std::string& device) {
    auto s = to_split(split);
    auto c = to_comm(comm);
    auto dt = dtype_of(dtype, kvmap::DType::Float32);
    const Place place = to_place(device);
    py::gil_scoped_release release;
    return in_space(place, [&](auto space) {
      using M = typename decltype(space)::type;
      return PyDistView(kvmap::DistView<M>::full(shape, value, dt, s, c));
    });
  });
  m.def("_arange", [](std::int64_t n, const py::object& dtype, const py::object& split,
                      const py::object& comm, const std::string& device) {
    auto s = to_split(split);
    auto c = to_comm(comm);
    auto dt = dtype_of(dtype, kvmap::DType::Int64);
    const Place place = to_place(device);
    py::gil_scoped_release release;
    return in_space(place, [&](auto space) {
      using M = typename decltype(space)::type;
      return PyDistView(kvmap::DistView<M>::arange(n, dt, s, c));
    });
  });
  m.def("_random", [](const std::string& kind, const kvmap::Shape& shape, const py::object& dtype,
                      const py::object& split, const py::object& seed, const py::object& comm,
                      const std::string& device) {
    auto s = to_split(split);
    auto c = to_comm(comm);
    auto dt = dtype_of(dtype, kvmap::DType::Float32);
    std::optional<std::uint64_t> sd;
    if (!seed.is_none()) sd = seed.cast<std::uint64_t>();
    const Place place = to_place(device);
    py::gil_scoped_release release;
    return in_space(place, [&](auto space) {
      using M = typename decltype(space)::type;
      return PyDistView(kind == "normal" ? kvmap::random::normal<M>(shape, dt, s, c, sd)
                                         : kvmap::random::uniform<M>(shape, dt, s, c, sd));
    });
  });
}

}  // namespace

void bind_factories(py::module_& m) {
  bind_from_tensors(m);
  bind_from_values(m);
  // The torch device kvmap's DistViews on `device` live on, for moving tensors there.
  m.def("_torch_device", [](const std::string& device) {
    return in_space(to_place(device), [](auto space) {
      return torch_device_of<typename decltype(space)::type>().str();
    });
  });
  m.def("_manual_seed", [](std::uint64_t seed, const py::object& comm) {
    auto c = to_comm(comm);
    py::gil_scoped_release release;
    kvmap::manual_seed(seed, c);
  });
  m.def("_dot", [](const PyDistView& x, const PyDistView& y) {
    same_space("kvmap.dot", x, y);
    py::gil_scoped_release release;
    return x.visit([&](const auto& a) {
      return kvmap::linalg::dot(a, std::get<std::decay_t<decltype(a)>>(*y.view));
    });
  });
  m.def("_nrm2", [](const PyDistView& x) {
    py::gil_scoped_release release;
    return x.visit([](const auto& a) { return kvmap::linalg::nrm2(a); });
  });
}

}  // namespace kvmap::python
