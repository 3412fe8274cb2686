// kvmap.GhostExchange (kvmap/ghost_exchange.hpp). Loading this module registers the operators
// torch.ops.kvmap.ghost_exchange and torch.ops.kvmap.ghost_exchange_reverse, which models call
// with a plan's handle between their layers (differentiable, scriptable).
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>

#include "bindings.hpp"
#include "dist_views.hpp"
#include "kvmap/ghost_exchange.hpp"

namespace kvmap::python {

namespace {

at::Tensor call_ghost_op(const at::Tensor& x, std::int64_t handle) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("kvmap::ghost_exchange", "")
                             .typed<at::Tensor(const at::Tensor&, std::int64_t)>();
  return op.call(x, handle);
}

}  // namespace

void bind_ghost_exchange(py::module_& m) {
  py::class_<kvmap::GhostExchange>(
      m, "GhostExchange",
      "The ghost exchange of a particle or graph decomposition (collective over comm): each "
      "rank's owned item ids and ghost item ids (1-D int64 tensors; a ghost id may repeat and "
      "may be one of the rank's own). Tensors have rows [owned..., ghosts...] along dimension "
      "0. forward(x) fills the ghost rows from their owners, reverse(g) sums ghost rows into "
      "their owners (its transpose); calling the plan, or torch.ops.kvmap.ghost_exchange(x, "
      "plan.handle) in a model, is forward with autograd (its backward is reverse).")
      .def(py::init([](const at::Tensor& owned, const at::Tensor& ghosts, const py::object& comm) {
             const kvmap::Comm c = to_comm(comm);
             py::gil_scoped_release release;
             return kvmap::GhostExchange(owned, ghosts, c);
           }),
           py::arg("owned_ids"), py::arg("ghost_ids"), py::arg("comm") = py::none())
      .def(
          "forward",
          [](const kvmap::GhostExchange& g, const at::Tensor& x) {
            py::gil_scoped_release release;
            return g.forward(x);
          },
          py::arg("x"), "A new tensor: x's owned rows, each ghost row its owner's (collective).")
      .def(
          "forward_",
          [](const kvmap::GhostExchange& g, at::Tensor& x) {
            {
              py::gil_scoped_release release;
              g.forward_(x);
            }
            return x;
          },
          py::arg("x"),
          "In place: x's ghost rows from their owners, its owned rows untouched; returns x "
          "(contiguous; collective). No autograd: an application's halo update.")
      .def(
          "usage",
          [](const kvmap::GhostExchange& g) {
            const kvmap::GhostExchange::Usage u = g.usage();
            py::dict d;
            d["forward_calls"] = u.forward_calls;
            d["reverse_calls"] = u.reverse_calls;
            d["forward_seconds"] = u.forward_seconds;
            d["reverse_seconds"] = u.reverse_seconds;
            return d;
          },
          "Calls of forward, forward_ and reverse (the operators' included) and the wall "
          "seconds in them on this rank since the plan was built (a dict; local).")
      .def(
          "reverse",
          [](const kvmap::GhostExchange& g, const at::Tensor& grad) {
            py::gil_scoped_release release;
            return g.reverse(grad);
          },
          py::arg("grad"),
          "A new tensor: each owned row plus the ghost rows of its id on every rank, the ghost "
          "rows zero (collective).")
      .def(
          "__call__",
          [](const kvmap::GhostExchange& g, const at::Tensor& x) {
            const std::int64_t handle = g.handle();
            py::gil_scoped_release release;
            return call_ghost_op(x, handle);
          },
          py::arg("x"), "forward with autograd: torch.ops.kvmap.ghost_exchange(x, self.handle).")
      .def_property_readonly("handle", &kvmap::GhostExchange::handle,
                             "The plan's handle for torch.ops.kvmap.ghost_exchange (valid while "
                             "the plan lives)")
      .def_property_readonly("owned", &kvmap::GhostExchange::owned, "Owned rows on this rank")
      .def_property_readonly("ghosts", &kvmap::GhostExchange::ghosts, "Ghost rows on this rank")
      .def_property_readonly("rows_sent", &kvmap::GhostExchange::rows_sent,
                             "Rows this rank sends per forward")
      .def_property_readonly("rows_received", &kvmap::GhostExchange::rows_received,
                             "Rows this rank receives per forward")
      .def_property_readonly("peers", &kvmap::GhostExchange::peers,
                             "Ranks this rank exchanges with");
}

}  // namespace kvmap::python
