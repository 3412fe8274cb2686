// The DistView class: shape and placement (properties), and what moves its data
// (redistribution, another memory space, a Heat DNDarray).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

// Halos along the split axis: the extended block (DistView::halo), and Heat's get_halo with
// its attributes.
void bind_halos(py::class_<PyDistView>& c) {
  c.def("_halo",
        [](const PyDistView& d, std::int64_t before, std::int64_t after,
           const std::string& boundary, double constant) {
          const auto options = kvmap::OverlapOptions()
                                   .depth(before, after)
                                   .boundary(to_boundary("DistView.halo", boundary), constant);
          py::gil_scoped_release release;  // a collective: other Python threads run meanwhile
          return d.visit([&](const auto& v) { return v.halo(options); });
        })
      .def(
          "get_halo",
          [](PyDistView& d, const py::object& halo_size, bool prev, bool next) {
            if (!py::isinstance<py::int_>(halo_size) || py::isinstance<py::bool_>(halo_size)) {
              throw py::type_error("halo_size needs to be of Python type integer, " +
                                   std::string(py::str(py::type::of(halo_size))) + " given");
            }
            const std::int64_t n = halo_size.cast<std::int64_t>();
            if (n < 0) {
              throw py::value_error("halo_size needs to be a non-negative Python integer, " +
                                    std::to_string(n) + " given");
            }
            d.halo_prev = py::none();
            d.halo_next = py::none();
            const std::optional<int> split = d.visit([](const auto& v) { return v.split(); });
            if (!split || n == 0) return;
            const auto options = kvmap::OverlapOptions().depth(prev ? n : 0, next ? n : 0);
            at::Tensor ext;
            {
              py::gil_scoped_release release;
              ext = d.visit([&](const auto& v) { return v.halo(options); });
            }
            // The rows before and after this rank's own (fewer at the array's ends).
            const std::int64_t own = d.visit([](const auto& v) { return v.lshape()[*v.split()]; });
            if (own == 0) return;
            const std::int64_t offset =
                d.visit([](const auto& v) { return v.layout().offset(v.comm().rank()); });
            const std::int64_t before = std::min(prev ? n : 0, offset);
            const std::int64_t after = ext.size(*split) - own - before;
            if (before > 0) d.halo_prev = py::cast(ext.narrow(*split, 0, before));
            if (after > 0) d.halo_next = py::cast(ext.narrow(*split, before + own, after));
          },
          py::arg("halo_size"), py::arg("prev") = true, py::arg("next") = true,
          "Fetches the rows of halo_size before and after this rank's block along the split axis\n"
          "into halo_prev and halo_next (None at the array's ends, on empty ranks, and for a\n"
          "replicated array), as Heat's DNDarray.get_halo does; unlike Heat, halo_size may exceed\n"
          "the neighbours' blocks (the rows then come from as many ranks as they lie on).")
      .def_readonly("halo_prev", &PyDistView::halo_prev)
      .def_readonly("halo_next", &PyDistView::halo_next)
      .def_property_readonly(
          "array_with_halos",
          [](const PyDistView& d) {
            at::Tensor local = d.visit([](const auto& v) { return v.local(); });
            const std::optional<int> split = d.visit([](const auto& v) { return v.split(); });
            if (!split || (d.halo_prev.is_none() && d.halo_next.is_none())) return local;
            std::vector<at::Tensor> parts;
            if (!d.halo_prev.is_none()) parts.push_back(d.halo_prev.cast<at::Tensor>());
            parts.push_back(local);
            if (!d.halo_next.is_none()) parts.push_back(d.halo_next.cast<at::Tensor>());
            return at::cat(parts, *split);
          },
          "The local block with the halos of the last get_halo along the split axis (Heat's).");
}

}  // namespace

void bind_dist_view(py::module_& m) {
  py::class_<PyDistView> c(m, "DistView");
  bind_properties(c);
  bind_moves(c);
  bind_halos(c);
}

}  // namespace kvmap::python
