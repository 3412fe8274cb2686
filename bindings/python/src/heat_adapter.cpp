// Heat interop (heat_adapter.hpp). The drop-in's path costs what the DistView path costs
// (perf/instructions.py --python): no Python code runs between a call and the core, a
// DNDarray's adoption on one rank is kept on it while its storage, shape, split and
// communicator are unchanged (and needs no agreement of its own: the call's plan checks every
// argument's shard against its layout), and the results are built from what kvmap knows.
#include "heat_adapter.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <utility>
#include <vector>

#include "dist_view_access.hpp"

namespace kvmap::python {

namespace {

// ---- What kvmap relies on of Heat 1.9's DNDarray ------------------------------------------
// Its constructor stores its arguments, each under a private name that the public property of
// the same meaning returns; its __new__ is object's. test_heat_private_fields checks both.
enum DndField { kArray, kGshape, kDtype, kSplit, kDevice, kComm, kBalanced, kDndFields };
constexpr const char* kFieldNames[kDndFields] = {
    "_DNDarray__array",  "_DNDarray__gshape", "_DNDarray__dtype",   "_DNDarray__split",
    "_DNDarray__device", "_DNDarray__comm",   "_DNDarray__balanced"};
constexpr const char* kPropertyNames[kDndFields] = {"larray", "gshape", "dtype",   "split",
                                                    "device", "comm",   "balanced"};
// Where a DNDarray keeps its adoption as a DistView (on one rank).
constexpr const char* kKeptAdoption = "_kvmap_adopted";

// An interned string, kept (interned strings live as long as the interpreter).
PyObject* interned(const char* s) {
  PyObject* n = PyUnicode_InternFromString(s);
  if (!n) throw py::error_already_set();
  return n;
}
PyObject* dnd_field_name(int f) {
  static PyObject* names[kDndFields] = {};
  if (!names[f]) names[f] = interned(kFieldNames[f]);
  return names[f];
}
PyObject* dnd_property_name(int f) {
  static PyObject* names[kDndFields] = {};
  if (!names[f]) names[f] = interned(kPropertyNames[f]);
  return names[f];
}

// Heat's objects, looked up once Heat is imported (a DNDarray exists only then); kept for the
// life of the process.
struct HeatObjects {
  PyObject* dndarray = nullptr;           // heat.DNDarray
  PyObject* communication = nullptr;      // heat.core.communication.Communication
  PyObject* mpi_communication = nullptr;  // heat.core.communication.MPICommunication
  PyObject* mpi_world = nullptr;          // heat.core.communication.MPI_WORLD
  PyObject* mpi_self = nullptr;           // heat.core.communication.MPI_SELF
  PyObject* cpu = nullptr;                // heat.cpu
  PyObject* gpu = nullptr;                // heat.gpu, where Heat has one
  PyObject* canonical_type = nullptr;     // heat.core.types.canonical_heat_type
  py::dict types;                         // torch dtype -> Heat type: the one cache of them
  // What Heat's constructor leaves in a DNDarray's __dict__, learned from the first result it
  // built (see new_dndarray); usable only when checked.
  py::dict instance_template;
  bool template_checked = false, template_usable = false;
};

// Heat's objects where Heat is imported (nullptr otherwise, or with `import_heat` an
// ImportError saying what needs it).
HeatObjects* heat_objects(bool import_heat = false) {
  static HeatObjects* objects = nullptr;
  if (objects) return objects;
  py::object heat = py::reinterpret_steal<py::object>(PyImport_GetModule(py::str("heat").ptr()));
  if (!heat || heat.is_none()) {
    PyErr_Clear();
    if (!import_heat) return nullptr;
    try {
      heat = py::module_::import("heat");
    } catch (py::error_already_set&) {
      throw py::import_error("kvmap: DistView.to_heat needs Heat (pip install heat)");
    }
  }
  auto* o = new HeatObjects();  // never freed: Heat stays imported
  auto keep = [](py::object v) { return v.release().ptr(); };
  const py::object comm = heat.attr("core").attr("communication");
  o->dndarray = keep(heat.attr("DNDarray"));
  o->communication = keep(comm.attr("Communication"));
  o->mpi_communication = keep(comm.attr("MPICommunication"));
  o->mpi_world = keep(comm.attr("MPI_WORLD"));
  o->mpi_self = keep(comm.attr("MPI_SELF"));
  o->cpu = keep(heat.attr("cpu"));
  o->gpu = py::hasattr(heat, "gpu") ? keep(heat.attr("gpu")) : nullptr;
  o->canonical_type = keep(heat.attr("core").attr("types").attr("canonical_heat_type"));
  objects = o;
  return objects;
}

bool is_dndarray(const HeatObjects* h, PyObject* o) {
  return h && PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(h->dndarray));
}

// Field f of the DNDarray x whose __dict__ is `dict`: from the dict where Heat keeps it, else
// through the property (another Heat, a subclass).
py::object dnd_field(PyObject* x, PyObject* dict, int f) {
  PyObject* v = PyDict_GetItemWithError(dict, dnd_field_name(f));  // borrowed
  if (v) return py::reinterpret_borrow<py::object>(v);
  if (PyErr_Occurred()) throw py::error_already_set();
  v = PyObject_GetAttr(x, dnd_property_name(f));
  if (!v) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(v);
}

// Heat's type for a torch dtype (TypeError where Heat has none), cached.
py::object heat_type(HeatObjects& h, PyObject* torch_dtype) {
  PyObject* t = PyDict_GetItemWithError(h.types.ptr(), torch_dtype);  // borrowed
  if (t) return py::reinterpret_borrow<py::object>(t);
  if (PyErr_Occurred()) throw py::error_already_set();
  PyObject* made = PyObject_CallOneArg(h.canonical_type, torch_dtype);
  if (!made) {
    PyErr_Clear();
    throw py::type_error("DistView.to_heat: Heat has no dtype for " +
                         std::string(py::str(py::handle(torch_dtype))));
  }
  const py::object type = py::reinterpret_steal<py::object>(made);
  if (PyDict_SetItem(h.types.ptr(), torch_dtype, type.ptr()) < 0) throw py::error_already_set();
  return type;
}

// ---- a DNDarray as a DistView --------------------------------------------------------------

// The DNDarray's fields kvmap adopts it from.
struct DndArgs {
  py::object dict, larray, split, gshape, comm;
};
DndArgs dnd_args(PyObject* x) {
  DndArgs a;
  a.dict = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(x, nullptr));
  if (!a.dict) throw py::error_already_set();
  a.larray = dnd_field(x, a.dict.ptr(), kArray);
  a.split = dnd_field(x, a.dict.ptr(), kSplit);
  a.gshape = dnd_field(x, a.dict.ptr(), kGshape);
  a.comm = dnd_field(x, a.dict.ptr(), kComm);
  if (!THPVariable_Check(a.larray.ptr())) {
    throw py::type_error("kvmap: the DNDarray's larray is not a torch.Tensor");
  }
  return a;
}

// Whether the DistView `view` still adopts `t` as it did: the same memory, shape and strides.
bool adopts(const PyDistView& view, const at::Tensor& t) {
  return view.visit([&](const auto& v) {
    const kvmap::Impl::LocalBlock& b = kvmap::Detail::DistViewAccess::block(v);
    return b.data == t.data_ptr() && t.sizes().equals(b.extents) && t.strides().equals(b.strides);
  });
}

// The adoption kept on the DNDarray (by a vmap call on one rank), while its larray, split,
// gshape and communicator are the ones it was made from and the larray still has the same
// memory, shape and strides; None otherwise.
py::object kept_adoption(const DndArgs& a) {
  static PyObject* const name = interned(kKeptAdoption);
  PyObject* kept = PyDict_GetItemWithError(a.dict.ptr(), name);  // borrowed
  if (!kept && PyErr_Occurred()) throw py::error_already_set();
  if (!kept || !PyTuple_Check(kept) || PyTuple_GET_SIZE(kept) != 5 ||
      PyTuple_GET_ITEM(kept, 0) != a.larray.ptr() || PyTuple_GET_ITEM(kept, 3) != a.comm.ptr()) {
    return py::none();
  }
  const int same_split = PyObject_RichCompareBool(PyTuple_GET_ITEM(kept, 1), a.split.ptr(), Py_EQ);
  const int same_gshape =
      PyObject_RichCompareBool(PyTuple_GET_ITEM(kept, 2), a.gshape.ptr(), Py_EQ);
  if (same_split < 0 || same_gshape < 0) throw py::error_already_set();
  const py::handle view = PyTuple_GET_ITEM(kept, 4);
  const at::Tensor& t = THPVariable_Unpack(a.larray.ptr());
  if (same_split && same_gshape && adopts(view.cast<const PyDistView&>(), t)) {
    return py::reinterpret_borrow<py::object>(view);
  }
  return py::none();
}

// An unbalanced DNDarray (or one whose balance Heat does not know): its per-rank counts are
// gathered.
py::object adopt_unbalanced(const DndArgs& a) {
  const at::Tensor& t = THPVariable_Unpack(a.larray.ptr());
  const std::optional<int> s = to_split(a.split);
  const kvmap::Shape gs = a.gshape.cast<kvmap::Shape>();
  const kvmap::Comm c = to_comm(a.comm.attr("handle"));
  PyDistView view(in_space(place_of(t), [&](auto space) -> AnyView {
    using M = typename decltype(space)::type;
    py::gil_scoped_release release;  // a collective: other Python threads run meanwhile
    return kvmap::DistView<M>::from_local(t, s, c);
  }));
  const kvmap::Shape made = view.visit([](const auto& v) { return v.gshape(); });
  if (made != gs) {  // the same verdict on every rank
    throw py::value_error("kvmap.from_heat: the DNDarray's local shards make up the shape " +
                          kvmap::to_string(made) + ", but its gshape is " + kvmap::to_string(gs));
  }
  view.comm = a.comm;  // Heat's communication: the results' (to_heat)
  return py::cast(std::move(view));
}

// Whether a vmap call may adopt without an agreement of its own (one rank) and keep the
// adoption on the DNDarray.
enum class Adoption { Collective, ForVmap };

// The DistView sharing the DNDarray x's memory: a balanced or replicated one (Heat's rule is
// kvmap's: every rank knows the layout) with one fixed-size agreement, or for a vmap call on
// one rank without communication and kept on x; an unbalanced one through its gathered counts.
py::object adopt(PyObject* x, Adoption how) {
  const DndArgs a = dnd_args(x);
  if (how == Adoption::ForVmap) {
    py::object kept = kept_adoption(a);
    if (!kept.is_none()) return kept;
  }
  const int balanced =
      a.split.is_none() ? 1 : PyObject_IsTrue(dnd_field(x, a.dict.ptr(), kBalanced).ptr());
  if (balanced < 0) throw py::error_already_set();
  if (!balanced) return adopt_unbalanced(a);
  const at::Tensor& t = THPVariable_Unpack(a.larray.ptr());
  const std::optional<int> s = to_split(a.split);
  const kvmap::Shape gs = a.gshape.cast<kvmap::Shape>();
  const kvmap::Comm c = to_comm(a.comm.attr("handle"));
  kvmap::Layout layout =
      s ? kvmap::Layout::balanced(gs, s, c.size()) : kvmap::Layout::replicated(gs, c.size());
  // On several ranks the adoption is agreed (one fixed-size agreement): Heat's `balanced` can
  // differ between ranks (its larray setter clears it on the ranks whose shard changed shape),
  // and a rank that gathers counts while the others went on to the call's agreement would
  // wait forever. On one rank nothing can diverge.
  const bool keep = how == Adoption::ForVmap && c.size() == 1;
  PyDistView adopted(in_space(place_of(t), [&](auto space) -> AnyView {
    using M = typename decltype(space)::type;
    if (!keep) {
      py::gil_scoped_release release;  // a collective: other Python threads run meanwhile
      return kvmap::DistView<M>::from_local(t, layout, c);
    }
    return kvmap::Detail::adopt_without_agreement<M>(t, std::move(layout), c);
  }));
  adopted.comm = a.comm;  // Heat's communication: the results' (to_heat)
  py::object view = py::cast(std::move(adopted));
  if (keep) {
    static PyObject* const name = interned(kKeptAdoption);
    const py::tuple entry = py::make_tuple(a.larray, a.split, a.gshape, a.comm, view);
    if (PyDict_SetItem(a.dict.ptr(), name, entry.ptr()) < 0) throw py::error_already_set();
  }
  return view;
}

py::object from_heat(const py::object& x) {
  HeatObjects* h = heat_objects();
  if (!is_dndarray(h, x.ptr())) {
    throw py::type_error("kvmap.from_heat: expected a heat.DNDarray, got " +
                         std::string(py::str(py::type::of(x).attr("__name__"))));
  }
  return adopt(x.ptr(), Adoption::Collective);
}

// ---- a DistView as a DNDarray --------------------------------------------------------------

// heat.DNDarray(*args), args in the order of DndField. Heat's constructor only stores its
// arguments (and checks the device, which kvmap's results satisfy by construction), and costs
// as much as the rest of the call: the first result is built by it, and where its __dict__
// holds exactly the arguments under the fields' names plus constants (None, bools, ints),
// later results are that __dict__ with the arguments replaced. Another Heat that stores
// anything else keeps its constructor.
py::object new_dndarray(HeatObjects& h, const py::tuple& args) {
  auto* type = reinterpret_cast<PyTypeObject*>(h.dndarray);
  if (h.template_usable) {
    py::dict d = py::reinterpret_steal<py::dict>(PyDict_Copy(h.instance_template.ptr()));
    if (!d) throw py::error_already_set();
    for (int f = 0; f < kDndFields; ++f) {
      if (PyDict_SetItem(d.ptr(), dnd_field_name(f), PyTuple_GET_ITEM(args.ptr(), f)) < 0) {
        throw py::error_already_set();
      }
    }
    const py::tuple none;
    py::object out = py::reinterpret_steal<py::object>(type->tp_new(type, none.ptr(), nullptr));
    if (!out || PyObject_GenericSetDict(out.ptr(), d.ptr(), nullptr) < 0) {
      throw py::error_already_set();
    }
    return out;
  }
  PyObject* raw = PyObject_Call(h.dndarray, args.ptr(), nullptr);
  if (!raw) throw py::error_already_set();
  py::object out = py::reinterpret_steal<py::object>(raw);
  if (!h.template_checked) {
    h.template_checked = true;
    py::dict d = py::reinterpret_steal<py::dict>(PyObject_GenericGetDict(out.ptr(), nullptr));
    if (!d) throw py::error_already_set();
    bool usable = type->tp_new == PyBaseObject_Type.tp_new;
    int matched = 0;
    for (auto item : d) {
      int field = kDndFields;
      for (int f = 0; f < kDndFields; ++f) {
        const int eq = PyObject_RichCompareBool(item.first.ptr(), dnd_field_name(f), Py_EQ);
        if (eq < 0) throw py::error_already_set();
        if (eq) field = f;
      }
      if (field < kDndFields) {
        usable = usable && item.second.ptr() == PyTuple_GET_ITEM(args.ptr(), field);
        ++matched;
      } else {
        const PyObject* v = item.second.ptr();
        usable = usable && (v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v));
      }
    }
    h.template_usable = usable && matched == kDndFields;
    if (h.template_usable)
      h.instance_template = py::reinterpret_steal<py::dict>(PyDict_Copy(d.ptr()));
  }
  return out;
}

// Heat's communication object for `view`: `comm`, else the one the DistView was made on
// (Heat's own for from_heat), else Heat's MPI_WORLD (kvmap's default is COMM_WORLD). An mpi4py
// communicator other than COMM_WORLD/COMM_SELF is duplicated once, collectively (Heat frees the
// handle it wraps when its object dies), and remembered on the DistView.
py::object heat_comm(const HeatObjects& h, PyDistView& view, py::object comm) {
  if (comm.is_none()) comm = view.comm;
  py::object result;
  if (comm.is_none()) {
    result = py::reinterpret_borrow<py::object>(h.mpi_world);
  } else if (PyObject_IsInstance(comm.ptr(), h.communication) == 1) {
    result = comm;
  } else {
    const py::module_ mpi = py::module_::import("mpi4py.MPI");
    if (!py::isinstance(comm, mpi.attr("Comm"))) {
      throw py::type_error(
          "DistView.to_heat: comm must be None, an mpi4py.MPI.Comm or a Heat "
          "communication, got " +
          std::string(py::str(py::type::of(comm).attr("__name__"))));
    }
    if (comm.equal(mpi.attr("COMM_NULL"))) {
      throw py::value_error(
          "DistView.to_heat: the DistView's communicator was freed; pass comm= "
          "(an mpi4py communicator or Heat's communication of the same ranks)");
    }
    if (comm.equal(mpi.attr("COMM_WORLD"))) {
      result = py::reinterpret_borrow<py::object>(h.mpi_world);
    } else if (comm.equal(mpi.attr("COMM_SELF"))) {
      result = py::reinterpret_borrow<py::object>(h.mpi_self);
    } else {
      result = py::handle(h.mpi_communication)(comm.attr("Dup")());
      view.comm = result;
    }
  }
  const int size = result.attr("size").cast<int>(), rank = result.attr("rank").cast<int>();
  const int view_size = view.visit([](const auto& v) { return v.comm().size(); });
  const int view_rank = view.visit([](const auto& v) { return v.comm().rank(); });
  if (size != view_size || rank != view_rank) {
    throw py::value_error("DistView.to_heat: the communicator has rank " + std::to_string(rank) +
                          " of " + std::to_string(size) + ", the DistView rank " +
                          std::to_string(view_rank) + " of " + std::to_string(view_size));
  }
  return result;
}

// The DNDarray's arguments for the DistView on Heat's communication `hcomm`, in DndField's
// order (on the device Heat names for the view's memory space).
py::tuple dnd_constructor_args(HeatObjects& h, const AnyView& view, PyObject* device,
                               const py::object& hcomm, bool balanced) {
  at::Tensor local = std::visit([](const auto& v) { return v.local(); }, view);
  const std::optional<int> split = std::visit([](const auto& v) { return v.split(); }, view);
  auto* torch_dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(local.scalar_type()));
  const py::object type = heat_type(h, torch_dtype);
  const py::tuple gshape = to_tuple(std::visit([](const auto& v) { return v.gshape(); }, view));
  py::tuple args(static_cast<std::size_t>(kDndFields));
  PyTuple_SET_ITEM(args.ptr(), kArray, THPVariable_Wrap(std::move(local)));
  PyTuple_SET_ITEM(args.ptr(), kGshape, gshape.inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kDtype, type.inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kSplit,
                   split ? PyLong_FromLong(*split) : py::none().inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kDevice, py::handle(device).inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kComm, hcomm.inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kBalanced, py::bool_(balanced).release().ptr());
  return args;
}

// The DNDarray of a call's result on the Python communicator `comm`: built directly where
// kvmap knows all Heat needs (a balanced or replicated result on Heat's communication), else
// as to_heat builds it.
py::object result_dndarray(HeatObjects& h, AnyView view, const py::object& comm) {
  const bool balanced =
      std::visit([](const auto& v) { return !v.split() || v.is_balanced(); }, view);
  PyObject* device = view.index() == 0 ? h.cpu : h.gpu;
  if (!balanced || !device ||
      PyObject_TypeCheck(comm.ptr(), reinterpret_cast<PyTypeObject*>(h.communication)) == 0) {
    PyDistView out(std::move(view));
    out.comm = comm;
    return to_heat(out, py::none());
  }
  return new_dndarray(h, dnd_constructor_args(h, view, device, comm, true));
}

// The check test_heat_private_fields runs: for the DNDarray x, each private field kvmap reads
// and whether it holds what the property of the same meaning returns; and whether results can
// be built from a template (DNDarray.__new__ is object's).
py::dict private_fields(const py::object& x) {
  const py::object dict =
      py::reinterpret_steal<py::object>(PyObject_GenericGetDict(x.ptr(), nullptr));
  if (!dict) throw py::error_already_set();
  py::dict report;
  for (int f = 0; f < kDndFields; ++f) {
    PyObject* v = PyDict_GetItemWithError(dict.ptr(), dnd_field_name(f));  // borrowed
    if (!v && PyErr_Occurred()) throw py::error_already_set();
    py::object prop = x.attr(kPropertyNames[f]);
    report[kFieldNames[f]] =
        py::make_tuple(kPropertyNames[f], v != nullptr,
                       v != nullptr && (v == prop.ptr() || py::handle(v).equal(prop)));
  }
  auto* type = reinterpret_cast<PyTypeObject*>(py::type::of(x).ptr());
  report["__new__ is object.__new__"] = type->tp_new == PyBaseObject_Type.tp_new;
  return report;
}

}  // namespace

py::object to_heat(PyDistView& view, py::object comm) {
  HeatObjects& h = *heat_objects(/*import_heat=*/true);
  const py::object hcomm = heat_comm(h, view, std::move(comm));
  // kvmap balances by Heat's rule, so its O(1) answer is Heat's `balanced`; a balanced
  // DNDarray's shape map Heat computes itself, without communication.
  const bool balanced = view.visit([](const auto& v) { return !v.split() || v.is_balanced(); });
  PyObject* device = view.place() == Place::Host ? h.cpu : h.gpu;
  if (!device) throw py::value_error("DistView.to_heat: this Heat has no GPU device");
  py::object out =
      py::handle(h.dndarray)(*dnd_constructor_args(h, *view.view, device, hcomm, balanced));
  // An unbalanced one's it would gather: prime Heat's cache (a private attribute, where this
  // Heat version has one) with kvmap's counts, so that Heat needs no collective either.
  if (!balanced && py::hasattr(out, "_DNDarray__lshape_map")) {
    const auto map = view.visit([](const auto& v) { return v.lshape_map(); });
    const int ndim = view.visit([](const auto& v) { return v.ndim(); });
    at::Tensor t = at::empty({static_cast<std::int64_t>(map.size()), ndim}, at::kLong);
    for (std::size_t r = 0; r < map.size(); ++r) {
      for (int k = 0; k < ndim; ++k) t[static_cast<std::int64_t>(r)][k] = map[r][k];
    }
    out.attr("_DNDarray__lshape_map") = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  }
  return out;
}

py::tuple run_with_dndarrays(const PyMapped& m, PyObject* args, PyObject* kwargs,
                             Py_ssize_t first_foreign) {
  HeatObjects* h = heat_objects();
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  std::vector<py::object> adopted;  // alive for the call
  adopted.reserve(static_cast<std::size_t>(nargs));
  ArgViews views(nargs);
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    if (i >= first_foreign && is_dndarray(h, a)) {
      adopted.push_back(adopt(a, Adoption::ForVmap));
      a = adopted.back().ptr();
    } else if (i >= first_foreign && !py::isinstance<PyDistView>(a)) {
      throw py::type_error(std::string(m.who()) + ": positional argument " + std::to_string(i) +
                           " must be a kvmap.DistView or a heat.DNDarray, got " +
                           std::string(py::str(py::type::of(py::handle(a)))) +
                           " (pass other arguments as keywords)");
    }
    views[i] = &py::handle(a).cast<const PyDistView&>();
  }
  VmapResults r = run_vmap_views(m, views.data(), nargs, kwargs);
  py::tuple out(r.views.size());
  for (std::size_t k = 0; k < r.views.size(); ++k) {
    PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(k),
                     result_dndarray(*h, std::move(r.views[k]), r.comm).release().ptr());
  }
  return out;
}

void bind_heat(py::module_& m) {
  m.def("from_heat", &from_heat, py::arg("x"),
        "A DistView sharing the memory of the heat.DNDarray x (collective over x.comm).\n\n"
        "Zero copy: the DistView's shard is x.larray's storage, so writes on either side are\n"
        "seen by the other. The split axis, the per-rank counts (unbalanced and empty shards\n"
        "included) and the communicator are x's; x.split None gives a replicated DistView. A\n"
        "balanced or replicated DNDarray (Heat's `balanced` flag) costs one fixed-size\n"
        "agreement; an unbalanced one's per-rank counts are gathered.");
  m.def("_heat_private_fields", &private_fields);
}

}  // namespace kvmap::python
