// The DistView class: shape and placement (properties), and what moves its data
// (redistribution, another memory space, a Heat DNDarray).
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "dist_views.hpp"
#include "heat_adapter.hpp"

namespace kvmap::python {

namespace {

// Shape, dtype, placement, communicator size and rank, and the local shard.
void bind_properties(py::class_<PyDistView>& c) {
  c.def_property_readonly(
       "larray",
       [](const PyDistView& d) { return d.visit([](const auto& v) { return v.local(); }); },
       "The local shard as a torch tensor sharing its memory (on the DistView's device)")
      .def_property_readonly(
          "device", [](const PyDistView& d) { return std::string(place_name(d.place())); },
          "'cpu' (host memory) or 'gpu' (the GPU of this rank), as Heat names devices")
      .def_property_readonly("gshape",
                             [](const PyDistView& d) {
                               return d.visit([](const auto& v) { return to_tuple(v.gshape()); });
                             })
      .def_property_readonly("shape",
                             [](const PyDistView& d) {
                               return d.visit([](const auto& v) { return to_tuple(v.gshape()); });
                             })
      .def_property_readonly("lshape",
                             [](const PyDistView& d) {
                               return d.visit([](const auto& v) { return to_tuple(v.lshape()); });
                             })
      .def_property_readonly("split",
                             [](const PyDistView& d) -> py::object {
                               const auto split = d.visit([](const auto& v) { return v.split(); });
                               if (split) return py::int_(*split);
                               return py::none();
                             })
      .def_property_readonly(
          "ndim",
          [](const PyDistView& d) { return d.visit([](const auto& v) { return v.ndim(); }); })
      .def_property_readonly(
          "dtype",
          [](const PyDistView& d) {
            const kvmap::DType dt = d.visit([](const auto& v) { return v.dtype(); });
            return py::reinterpret_borrow<py::object>(
                reinterpret_cast<PyObject*>(torch::getTHPDtype(kvmap::to_torch(dt))));
          })
      .def_property_readonly(
          "lshape_map",
          [](const PyDistView& d) {
            const auto map = d.visit([](const auto& v) { return v.lshape_map(); });
            const int ndim = d.visit([](const auto& v) { return v.ndim(); });
            at::Tensor t = at::empty({static_cast<std::int64_t>(map.size()), ndim}, at::kLong);
            for (std::size_t r = 0; r < map.size(); ++r) {
              for (int k = 0; k < ndim; ++k) t[r][k] = map[r][k];
            }
            return t;
          })
      .def_property_readonly("comm_size",
                             [](const PyDistView& d) {
                               return d.visit([](const auto& v) { return v.comm().size(); });
                             })
      .def_property_readonly("comm_rank",
                             [](const PyDistView& d) {
                               return d.visit([](const auto& v) { return v.comm().rank(); });
                             })
      .def_readwrite("_comm", &PyDistView::comm)
      .def("is_balanced", [](const PyDistView& d) {
        return d.visit([](const auto& v) { return v.is_balanced(); });
      });
  c.def("_local_address", [](const PyDistView& d) {
     return d.visit([](const auto& v) { return reinterpret_cast<std::uintptr_t>(v.local_data()); });
   }).def("__repr__", [](const PyDistView& d) {
    return d.visit([&](const auto& v) {
      return "kvmap.DistView(gshape=" + kvmap::to_string(v.gshape()) +
             ", split=" + (v.split() ? std::to_string(*v.split()) : std::string("None")) +
             ", dtype=" + kvmap::name(v.dtype()) + ", device=" + place_name(d.place()) + ", " +
             v.layout().str() + ")";
    });
  });
}

// In place (balance_, resplit_, as Heat's), to every rank or a root, to another memory space,
// to Heat.
void bind_moves(py::class_<PyDistView>& c) {
  // The source is copied and the result assigned with the GIL held: another Python thread
  // never sees the DistView half replaced. Both return the array itself, as Heat's in-place
  // methods do (`x.resplit_(None).larray`).
  c.def("balance_",
        [](py::object self) {
          PyDistView& d = self.cast<PyDistView&>();
          const AnyView source = *d.view;
          std::optional<AnyView> result;
          {
            py::gil_scoped_release release;
            result.emplace(std::visit([](const auto& v) { return AnyView(v.balance()); }, source));
          }
          *d.view = std::move(*result);
          return self;
        })
      .def("resplit_",
           [](py::object self, const py::object& axis) {
             PyDistView& d = self.cast<PyDistView&>();
             const auto split = to_split(axis);
             const AnyView source = *d.view;
             std::optional<AnyView> result;
             {
               py::gil_scoped_release release;
               result.emplace(
                   std::visit([&](const auto& v) { return AnyView(v.resplit(split)); }, source));
             }
             *d.view = std::move(*result);
             return self;
           })
      .def(
          "gather",
          [](const PyDistView& d, int root) -> py::object {
            at::Tensor t;
            {
              py::gil_scoped_release release;
              t = d.visit([&](const auto& v) { return v.gather(root); });
            }
            if (!t.defined()) return py::none();
            return py::cast(t);
          },
          py::arg("root") = 0)
      .def("allgather",
           [](const PyDistView& d) {
             py::gil_scoped_release release;
             return d.visit([](const auto& v) { return v.allgather(); });
           })
      // The same array in the other memory space: the local shards copied there, the layout
      // and communicator kept (one fixed-size agreement).
      .def("_moved_to",
           [](const PyDistView& d, const std::string& device) {
             const Place target = to_place(device);
             py::gil_scoped_release release;
             return in_space(target, [&](auto space) {
               using M = typename decltype(space)::type;
               const at::Device to = torch_device_of<M>();
               return d.visit([&](const auto& v) {
                 return PyDistView(
                     kvmap::DistView<M>::from_local(v.local().to(to), v.layout(), v.comm()));
               });
             });
           })
      .def("to_heat", &to_heat, py::arg("comm") = py::none(),
           "A heat.DNDarray sharing this DistView's memory: no copy, no communication.\n\n"
           "Split axis, per-rank counts and communicator carry over (comm overrides the one the\n"
           "DistView was made on; an mpi4py communicator other than COMM_WORLD/COMM_SELF is\n"
           "duplicated once, collectively, since Heat frees the handles it holds).");
}

}  // namespace

void bind_dist_view(py::module_& m) {
  py::class_<PyDistView> c(m, "DistView");
  bind_properties(c);
  bind_moves(c);
}

}  // namespace kvmap::python
