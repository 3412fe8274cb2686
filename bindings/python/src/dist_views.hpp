#pragma once
// Python's DistViews in every memory space the build has (one std::variant over them), where a
// tensor or a device name puts one, and the conversions of Python arguments the bindings share.
#include <torch/csrc/utils/pybind.h>

#include <Kokkos_Core.hpp>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "kvmap/kvmap.hpp"
#include "tensor_blocks.hpp"

namespace kvmap::python {

namespace py = pybind11;

// The memory spaces of Python's DistViews: those the build instantiates kvmap for
// (KVMAP_FOR_EACH_MEMORY_SPACE): host memory, and in a CUDA or HIP build the GPU's. Python
// names them as Heat does: "cpu" and "gpu".
using HostView = kvmap::DistView<Kokkos::HostSpace>;
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
#define KVMAP_PY_DEVICE_SPACE(Space) using DeviceSpace = Space;
KVMAP_FOR_EACH_DEVICE_SPACE(KVMAP_PY_DEVICE_SPACE)
#undef KVMAP_PY_DEVICE_SPACE
using AnyView = std::variant<HostView, kvmap::DistView<DeviceSpace>>;
#else
using AnyView = std::variant<HostView>;
#endif

enum class Place { Host, Device };

inline const char* place_name(Place p) {
  return p == Place::Host ? "cpu" : "gpu";
}

template <class M>
struct SpaceTag {
  using type = M;
};

// f(SpaceTag<M>{}) for the memory space M of `place`; ValueError for "gpu" in a build
// without a GPU backend.
template <class F>
auto in_space(Place place, F&& f) {
  if (place == Place::Device) {
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
    return f(SpaceTag<DeviceSpace>{});
#else
    throw kvmap::ValueError(std::string("kvmap: this kvmap is built for host memory only (Kokkos "
                                        "devices: ") +
                            KVMAP_KOKKOS_DEVICES_STRING +
                            "); GPU tensors and device='gpu' need kvmap built on a Kokkos with "
                            "its CUDA or HIP backend");
#endif
  }
  return f(SpaceTag<Kokkos::HostSpace>{});
}

// The torch device of memory space M on this rank (its GPU: kvmap's device map).
template <class M>
at::Device torch_device_of() {
  return kvmap::Detail::torch_device(kvmap::Impl::device_of<M>());
}

inline Place place_of(const at::Tensor& t) {
  return t.is_cpu() ? Place::Host : Place::Device;
}

inline Place to_place(const std::string& device) {
  if (device == "cpu") return Place::Host;
  if (device == "gpu") return Place::Device;
  throw py::value_error("kvmap: device must be 'cpu' or 'gpu', got '" + device + "'");
}

// A DistView that can change in place (balance_, resplit_), as Heat's DNDarray does, in any
// of the build's memory spaces. `comm` is the Python communicator it was made on where Python
// gave one (an mpi4py communicator, or Heat's communication object for kvmap.from_heat; None:
// COMM_WORLD): the C++ DistView holds its own duplicate and hands no communicator back (see
// _comms.py).
struct PyDistView {
  std::shared_ptr<AnyView> view;
  py::object comm = py::none();
  // Heat's halo attributes (get_halo): the rows before and after this rank's block, or None.
  py::object halo_prev = py::none(), halo_next = py::none();
  template <class M>
  explicit PyDistView(kvmap::DistView<M> v) : view(std::make_shared<AnyView>(std::move(v))) {}
  explicit PyDistView(AnyView v) : view(std::make_shared<AnyView>(std::move(v))) {}
  // f(the DistView), whatever its memory space.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), *view);
  }
  Place place() const { return view->index() == 0 ? Place::Host : Place::Device; }
};

// TypeError unless x and y live in one memory space.
void same_space(const char* who, const PyDistView& x, const PyDistView& y);

// The communicator of a Python argument: an mpi4py communicator, or None (COMM_WORLD).
kvmap::Comm to_comm(const py::object& comm);
// A split axis: an int or None (TypeError for anything else, bool included).
std::optional<int> to_split(const py::object& split);
py::tuple to_tuple(const kvmap::Shape& s);
// A torch dtype, or `fallback` for None.
kvmap::DType dtype_of(const py::object& dtype, kvmap::DType fallback);
// A boundary's name ("none", "periodic", "reflect", "nearest", "constant"; ValueError naming
// `who` for any other).
kvmap::Boundary to_boundary(const char* who, const std::string& name);

}  // namespace kvmap::python
