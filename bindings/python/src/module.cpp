// _kvmap: the Python face of kvmap. DistViews in every memory space the build has (host
// memory, and the GPU's in a CUDA or HIP build), the vmap scheduler with a Python callable,
// and the factories and redistributions Heat users know.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <array>
#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

#include "kvmap/kvmap.hpp"
#include "detail/platform/comm.hpp"
#include "detail/platform/mpi_process.hpp"
#include "detail/platform/device_map.hpp"
#include "detail/platform/gpu_aware_mpi.hpp"
#include "detail/platform/stats.hpp"
#include "detail/platform/tensor_bridge.hpp"
#include "detail/distributed/dist_view_access.hpp"

namespace py = pybind11;

namespace {

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

const char* place_name(Place p) {
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

Place place_of(const at::Tensor& t) {
  return t.is_cpu() ? Place::Host : Place::Device;
}

Place to_place(const std::string& device) {
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

// A Python exception raised by the user's function, held as C++ state until the scheduler
// has agreed on the failure; then restored as the very same Python exception. The references
// are dropped (under the GIL, from any thread) with the last copy of the C++ exception, so an
// exception that is not restored (a later chunk's, a remote rank's) keeps no traceback or
// frames alive. Base: kvmap::Error, or kvmap::OutOfMemoryError for Python's MemoryError and
// torch.OutOfMemoryError (the scheduler then runs the chunk again in halves).
template <class Base>
class PythonError : public Base {
 public:
  PythonError(const std::string& what, PyObject* t, PyObject* v, PyObject* tb)
      : Base(what), state_(std::make_shared<State>(t, v, tb)) {}
  // Sets the Python error indicator to this exception (new references).
  void restore() const {
    Py_XINCREF(state_->type);
    Py_XINCREF(state_->value);
    Py_XINCREF(state_->traceback);
    PyErr_Restore(state_->type, state_->value, state_->traceback);
  }

 private:
  struct State {
    PyObject* type;
    PyObject* value;
    PyObject* traceback;
    State(PyObject* t, PyObject* v, PyObject* tb) : type(t), value(v), traceback(tb) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
#if PY_VERSION_HEX >= 0x030D0000
      if (!Py_IsInitialized() || Py_IsFinalizing()) return;
#else
      if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
#endif
      const PyGILState_STATE gil = PyGILState_Ensure();
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(traceback);
      PyGILState_Release(gil);
    }
  };
  std::shared_ptr<State> state_;
};
using PythonCallError = PythonError<kvmap::Error>;
using PythonOutOfMemory = PythonError<kvmap::OutOfMemoryError>;

// torch.OutOfMemoryError (torch.cuda.OutOfMemoryError before torch 2.5), set at import.
PyObject* torch_oom_type = nullptr;

// The fetched Python error (new references, taken over) as the C++ exception that carries it.
[[noreturn]] void throw_python_error(const std::string& what, PyObject* t, PyObject* v,
                                     PyObject* tb) {
  if (PyErr_GivenExceptionMatches(t, PyExc_MemoryError) ||
      (torch_oom_type != nullptr && PyErr_GivenExceptionMatches(t, torch_oom_type))) {
    throw PythonOutOfMemory(what, t, v, tb);
  }
  throw PythonCallError(what, t, v, tb);
}

kvmap::Randomness to_randomness(const std::string& r) {
  if (r == "error") return kvmap::Randomness::Error;
  if (r == "same") return kvmap::Randomness::Same;
  if (r == "different") return kvmap::Randomness::Different;
  throw py::value_error("kvmap.vmap: randomness must be 'error', 'same' or 'different', got '" + r +
                        "'");
}

PyObject* error_type = nullptr;   // kvmap.Error
PyObject* remote_type = nullptr;  // kvmap.RemoteError

// The one mapping of C++ exceptions to Python errors, for pybind11's exception translator
// (kvmap's own exceptions) and for the slots pybind11 does not wrap (everything): a Python
// error raised by func on this rank as itself (type, message, traceback), RemoteError with
// failed_ranks, ValueError, TypeError, kvmap.Error; then pybind11's own, MemoryError and
// RuntimeError. Returns false, setting nothing, for an exception that is not kvmap's when
// `only_kvmap`.
bool set_python_error(const std::exception_ptr& p, bool only_kvmap = false) {
  try {
    std::rethrow_exception(p);
  } catch (const PythonCallError& e) {
    e.restore();
  } catch (const PythonOutOfMemory& e) {
    e.restore();
  } catch (const kvmap::RemoteError& e) {
    py::object exc = py::handle(remote_type)(e.what());
    exc.attr("failed_ranks") = py::cast(e.failed_ranks());
    PyErr_SetObject(remote_type, exc.ptr());
  } catch (const kvmap::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const kvmap::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const kvmap::Error& e) {
    PyErr_SetString(error_type, e.what());
  } catch (...) {
    if (only_kvmap) return false;
    try {
      throw;
    } catch (py::error_already_set& e) {
      e.restore();
    } catch (const py::builtin_exception& e) {
      e.set_error();
    } catch (const std::bad_alloc&) {
      PyErr_NoMemory();
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (...) {
      PyErr_SetString(PyExc_RuntimeError, "kvmap: unknown C++ exception");
    }
  }
  return true;
}

// What kvmap.vmap / kvmap.map_batches return: a callable holding f and its options, checked
// and converted once. Calls go straight from the interpreter to run_vmap (its type's
// tp_call): no Python frame, no argument parsing beyond the DistViews.
struct PyMapped {
  py::object func;
  kvmap::VmapOptions options;
  kvmap::Impl::Mapping mapping;
  const char* who() const {
    return mapping == kvmap::Impl::Mapping::Samples ? "kvmap.vmap" : "kvmap.map_batches";
  }
};

// The Python front-end of kvmap's one vmap core (kvmap.vmap and kvmap.map_batches): it
// converts the arguments, f and f's results; slot mapping, agreement, chunks and assembly
// are the core's. `args` holds DistViews only.
// The DistViews of a call's positional arguments: on the stack for the usual few (a call
// makes no heap allocation for them).
class ArgViews {
 public:
  explicit ArgViews(Py_ssize_t n) {
    if (n > static_cast<Py_ssize_t>(small_.size())) big_.resize(static_cast<std::size_t>(n));
  }
  const PyDistView*& operator[](Py_ssize_t i) { return data()[i]; }
  const PyDistView** data() { return big_.empty() ? small_.data() : big_.data(); }

 private:
  std::array<const PyDistView*, 8> small_{};
  std::vector<const PyDistView*> big_;
};

// The results of a call and the Python communicator they live on (their inputs').
struct VmapResults {
  std::vector<AnyView> views;
  py::object comm;
};

// `views`: the DistViews of the positional arguments.
VmapResults run_vmap_views(const PyMapped& m, const PyDistView* const* views, Py_ssize_t nargs,
                           PyObject* kwargs) {
  // Copies of the DistViews: their memory stays alive for the whole call, even when Python
  // code on another thread rebinds or rebalances the arguments while the GIL is released.
  // All in one memory space (f's tensors live there), the first's.
  std::vector<AnyView> arrays;
  arrays.reserve(static_cast<std::size_t>(nargs));
  py::object comm = py::none();
  Place place = Place::Host;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    const PyDistView& d = *views[i];
    if (i == 0) place = d.place();
    if (d.place() != place) {
      throw py::type_error(std::string(m.who()) +
                           ": the DistViews must live in one memory space: " + "argument 0 is on " +
                           place_name(place) + ", argument " + std::to_string(i) + " on " +
                           place_name(d.place()) + " (DistView.to(device) moves one)");
    }
    arrays.push_back(*d.view);
    if (comm.is_none()) comm = d.comm;
  }
  std::vector<at::Tensor> tensors;  // keyword tensors: passed whole, never shared by outputs
  if (kwargs) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
      if (THPVariable_Check(value)) tensors.push_back(THPVariable_Unpack(value));
    }
  }
  auto call = [&](const std::vector<at::Tensor>& per_array) {
    py::gil_scoped_acquire gil;
    try {
      py::tuple pargs(nargs);
      for (Py_ssize_t i = 0; i < nargs; ++i)
        PyTuple_SET_ITEM(pargs.ptr(), i, THPVariable_Wrap(per_array[static_cast<std::size_t>(i)]));
      PyObject* raw = PyObject_Call(m.func.ptr(), pargs.ptr(), kwargs);
      if (!raw) throw py::error_already_set();
      const py::object out = py::reinterpret_steal<py::object>(raw);
      std::vector<at::Tensor> outs;
      if (THPVariable_Check(out.ptr())) {
        outs.push_back(THPVariable_Unpack(out.ptr()));
      } else if (py::isinstance<py::tuple>(out) || py::isinstance<py::list>(out)) {
        for (auto o : out) {
          if (!THPVariable_Check(o.ptr())) {
            throw py::type_error(std::string(m.who()) +
                                 ": the function must return tensors, got a " +
                                 std::string(py::str(py::type::of(o))) + " in its result");
          }
          outs.push_back(THPVariable_Unpack(o.ptr()));
        }
      } else {
        throw py::type_error(std::string(m.who()) +
                             ": the function must return a tensor or a tuple of tensors, got " +
                             std::string(py::str(py::type::of(out))));
      }
      return outs;
    } catch (py::error_already_set& e) {
      std::string what = e.what();
      e.restore();
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      throw_python_error(what, t, v, tb);
    } catch (const py::builtin_exception& e) {
      e.set_error();
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      throw_python_error(e.what(), t, v, tb);
    }
  };
  std::vector<AnyView> outputs;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    try {
      outputs = in_space(place, [&](auto space) {
        using M = typename decltype(space)::type;
        std::vector<const kvmap::DistView<M>*> pointers;
        pointers.reserve(arrays.size());
        for (const AnyView& a : arrays) pointers.push_back(&std::get<kvmap::DistView<M>>(a));
        std::vector<kvmap::DistView<M>> out =
            kvmap::Impl::vmap_core<M>(pointers.data(), pointers.size(), tensors, m.options,
                                      m.mapping, kvmap::Impl::ArgsCall(call));
        return std::vector<AnyView>(std::make_move_iterator(out.begin()),
                                    std::make_move_iterator(out.end()));
      });
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  return {std::move(outputs), std::move(comm)};
}

// A call on DistViews only (`args`): DistViews on their inputs' communicator.
py::tuple run_vmap(const PyMapped& m, PyObject* args, PyObject* kwargs) {
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  ArgViews views(nargs);
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    views[i] = &py::handle(PyTuple_GET_ITEM(args, i)).cast<const PyDistView&>();
  }
  VmapResults r = run_vmap_views(m, views.data(), nargs, kwargs);
  py::tuple result(r.views.size());
  for (std::size_t k = 0; k < r.views.size(); ++k) {
    PyDistView out(std::move(r.views[k]));
    out.comm = r.comm;
    result[k] = py::cast(std::move(out));
  }
  return result;
}

// ---- Heat DNDarrays as arguments and results of kvmap.vmap / kvmap.map_batches ----------
// The drop-in's path costs what the DistView path costs (perf/instructions.py --python): no
// Python code runs between the call and the core, a DNDarray's adoption on one rank is kept
// on it while its storage, shape, split and communicator are unchanged (and needs no
// agreement of its own: the call's plan checks every argument's shard against its layout),
// and the results are built from what kvmap knows.

// Heat's objects, looked up once Heat is imported (a DNDarray exists only then); kept for
// the life of the process.
struct HeatObjects {
  PyObject* dndarray = nullptr;        // heat.DNDarray
  PyObject* communication = nullptr;   // heat.core.communication.Communication
  PyObject* cpu = nullptr;             // heat.cpu
  PyObject* gpu = nullptr;             // heat.gpu, where Heat has one
  PyObject* canonical_type = nullptr;  // heat.core.types.canonical_heat_type
  PyObject* from_heat = nullptr;       // kvmap.from_heat (unbalanced DNDarrays)
  py::dict types;                      // torch dtype -> Heat type
  // What Heat's constructor leaves in a DNDarray's __dict__, learned from the first result it
  // built (see new_dndarray); usable only when checked.
  py::dict instance_template;
  bool template_checked = false, template_usable = false;
};

HeatObjects* heat_objects() {
  static HeatObjects* objects = nullptr;
  if (objects) return objects;
  py::object heat = py::reinterpret_steal<py::object>(PyImport_GetModule(py::str("heat").ptr()));
  if (!heat || heat.is_none()) {
    PyErr_Clear();
    return nullptr;
  }
  auto* o = new HeatObjects();  // never freed: Heat stays imported
  auto keep = [](py::object v) { return v.release().ptr(); };
  o->dndarray = keep(heat.attr("DNDarray"));
  o->communication = keep(heat.attr("core").attr("communication").attr("Communication"));
  o->cpu = keep(heat.attr("cpu"));
  o->gpu = py::hasattr(heat, "gpu") ? keep(heat.attr("gpu")) : nullptr;
  o->canonical_type = keep(heat.attr("core").attr("types").attr("canonical_heat_type"));
  o->from_heat = keep(py::module_::import("kvmap").attr("from_heat"));
  objects = o;
  return objects;
}

bool is_dndarray(const HeatObjects* h, PyObject* o) {
  return h && PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(h->dndarray));
}

// An interned string, kept (interned strings live as long as the interpreter).
PyObject* interned(const char* s) {
  PyObject* n = PyUnicode_InternFromString(s);
  if (!n) throw py::error_already_set();
  return n;
}

// The fields of Heat's DNDarray (Heat 1.9): its constructor's arguments, each stored under a
// private name that the property of the same meaning returns.
enum DndField { kArray, kGshape, kDtype, kSplit, kDevice, kComm, kBalanced, kDndFields };
PyObject* dnd_field_name(int f) {
  static PyObject* const names[kDndFields] = {
      interned("_DNDarray__array"),   interned("_DNDarray__gshape"), interned("_DNDarray__dtype"),
      interned("_DNDarray__split"),   interned("_DNDarray__device"), interned("_DNDarray__comm"),
      interned("_DNDarray__balanced")};
  return names[f];
}
PyObject* dnd_property_name(int f) {
  static PyObject* const names[kDndFields] = {
      interned("larray"), interned("gshape"), interned("dtype"),   interned("split"),
      interned("device"), interned("comm"),   interned("balanced")};
  return names[f];
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

// Whether the DistView `view` still adopts `t` as it did: the same memory, shape and strides.
bool adopts(const PyDistView& view, const at::Tensor& t) {
  return view.visit([&](const auto& v) {
    const kvmap::Impl::LocalBlock& b = kvmap::Detail::DistViewAccess::block(v);
    return b.data == t.data_ptr() && t.sizes().equals(b.extents) && t.strides().equals(b.strides);
  });
}

// The DistView kvmap.vmap maps for the DNDarray x: a balanced or replicated one adopted
// with one fixed-size agreement, on one rank without communication and kept on x (its
// __dict__, "_kvmap_adopted", with the larray, split, gshape and comm it was made from)
// while those are unchanged and the larray still has the same memory, shape and strides; an
// unbalanced one through kvmap.from_heat (its per-rank counts are gathered, every time).
py::object adopt_dndarray(const HeatObjects& h, PyObject* x) {
  static PyObject* const kept_name = interned("_kvmap_adopted");
  const py::object dict = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(x, nullptr));
  if (!dict) throw py::error_already_set();
  const py::object larray = dnd_field(x, dict.ptr(), kArray);
  const py::object split = dnd_field(x, dict.ptr(), kSplit);
  const py::object gshape = dnd_field(x, dict.ptr(), kGshape);
  const py::object comm = dnd_field(x, dict.ptr(), kComm);
  if (!THPVariable_Check(larray.ptr())) {
    throw py::type_error("kvmap: the DNDarray's larray is not a torch.Tensor");
  }
  const at::Tensor& t = THPVariable_Unpack(larray.ptr());
  PyObject* kept = PyDict_GetItemWithError(dict.ptr(), kept_name);  // borrowed
  if (!kept && PyErr_Occurred()) throw py::error_already_set();
  if (kept && PyTuple_Check(kept) && PyTuple_GET_SIZE(kept) == 5 &&
      PyTuple_GET_ITEM(kept, 0) == larray.ptr() && PyTuple_GET_ITEM(kept, 3) == comm.ptr()) {
    const int same_split = PyObject_RichCompareBool(PyTuple_GET_ITEM(kept, 1), split.ptr(), Py_EQ);
    const int same_gshape =
        PyObject_RichCompareBool(PyTuple_GET_ITEM(kept, 2), gshape.ptr(), Py_EQ);
    if (same_split < 0 || same_gshape < 0) throw py::error_already_set();
    const py::handle view = PyTuple_GET_ITEM(kept, 4);
    if (same_split && same_gshape && adopts(view.cast<const PyDistView&>(), t)) {
      return py::reinterpret_borrow<py::object>(view);
    }
  }
  const int balanced =
      split.is_none() ? 1 : PyObject_IsTrue(dnd_field(x, dict.ptr(), kBalanced).ptr());
  if (balanced < 0) throw py::error_already_set();
  if (!balanced) {  // unknown or unbalanced: the per-rank counts are gathered
    PyObject* view = PyObject_CallOneArg(h.from_heat, x);
    if (!view) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(view);
  }
  const std::optional<int> s = to_split(split);
  const kvmap::Shape gs = gshape.cast<kvmap::Shape>();
  const kvmap::Comm c = to_comm(comm.attr("handle"));
  kvmap::Layout layout =
      s ? kvmap::Layout::balanced(gs, s, c.size()) : kvmap::Layout::replicated(gs, c.size());
  // On several ranks the adoption is agreed (one fixed-size agreement, as kvmap.from_heat's):
  // Heat's `balanced` can differ between ranks (its larray setter clears it on the ranks
  // whose shard changed shape), and a rank that gathers counts while the others went on to
  // the call's agreement would wait forever. On one rank nothing can diverge.
  const bool alone = c.size() == 1;
  PyDistView adopted(in_space(place_of(t), [&](auto space) -> AnyView {
    using M = typename decltype(space)::type;
    if (!alone) {
      py::gil_scoped_release release;  // a collective: other Python threads run meanwhile
      return kvmap::DistView<M>::from_local(t, layout, c);
    }
    return kvmap::Detail::adopt_without_agreement<M>(t, std::move(layout), c);
  }));
  adopted.comm = comm;  // Heat's communication: the results' (to_heat)
  py::object view = py::cast(std::move(adopted));
  if (alone) {
    const py::tuple entry = py::make_tuple(larray, split, gshape, comm, view);
    if (PyDict_SetItem(dict.ptr(), kept_name, entry.ptr()) < 0) throw py::error_already_set();
  }
  return view;
}

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

// The DNDarray sharing the memory of a result on the Python communicator `comm`: built
// directly where kvmap knows all Heat needs (a balanced or replicated result on Heat's
// communication), else by DistView.to_heat.
py::object result_dndarray(HeatObjects& h, AnyView view, const py::object& comm) {
  const bool balanced =
      std::visit([](const auto& v) { return !v.split() || v.is_balanced(); }, view);
  const Place place = view.index() == 0 ? Place::Host : Place::Device;
  PyObject* device = place == Place::Host ? h.cpu : h.gpu;
  if (!balanced || !device ||
      !PyObject_TypeCheck(comm.ptr(), reinterpret_cast<PyTypeObject*>(h.communication))) {
    PyDistView out(std::move(view));
    out.comm = comm;
    return py::cast(std::move(out)).attr("to_heat")();
  }
  at::Tensor local = std::visit([](const auto& v) { return v.local(); }, view);
  const std::optional<int> split = std::visit([](const auto& v) { return v.split(); }, view);
  auto* torch_dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(local.scalar_type()));
  PyObject* heat_type = PyDict_GetItemWithError(h.types.ptr(), torch_dtype);  // borrowed
  if (!heat_type) {
    if (PyErr_Occurred()) throw py::error_already_set();
    const py::object t =
        py::reinterpret_steal<py::object>(PyObject_CallOneArg(h.canonical_type, torch_dtype));
    if (!t || PyDict_SetItem(h.types.ptr(), torch_dtype, t.ptr()) < 0) {
      throw py::error_already_set();
    }
    heat_type = t.ptr();  // the dict holds it
  }
  const py::tuple gshape = to_tuple(std::visit([](const auto& v) { return v.gshape(); }, view));
  py::tuple args(static_cast<std::size_t>(kDndFields));
  PyTuple_SET_ITEM(args.ptr(), kArray, THPVariable_Wrap(std::move(local)));
  PyTuple_SET_ITEM(args.ptr(), kGshape, gshape.inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kDtype, py::handle(heat_type).inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kSplit,
                   split ? PyLong_FromLong(*split) : py::none().inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kDevice, py::handle(device).inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kComm, comm.inc_ref().ptr());
  PyTuple_SET_ITEM(args.ptr(), kBalanced, py::handle(Py_True).inc_ref().ptr());
  return new_dndarray(h, args);
}

// Positional arguments: DistViews, or Heat's DNDarrays, which are adopted as DistViews (zero
// copy) and make the results DNDarrays sharing the results' memory.
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
      adopted.push_back(adopt_dndarray(*h, a));
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

PyObject* mapped_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  try {
    const PyMapped& m = py::handle(self).cast<const PyMapped&>();
    const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      if (!py::isinstance<PyDistView>(PyTuple_GET_ITEM(args, i))) {
        return run_with_dndarrays(m, args, kwargs, i).release().ptr();
      }
    }
    return run_vmap(m, args, kwargs).release().ptr();
  } catch (...) {
    set_python_error(std::current_exception());
  }
  return nullptr;
}

// TypeError unless x and y live in one memory space.
void same_space(const char* who, const PyDistView& x, const PyDistView& y) {
  if (x.place() != y.place()) {
    throw py::type_error(std::string(who) + ": the DistViews must live in one memory space, got " +
                         place_name(x.place()) + " and " + place_name(y.place()));
  }
}

}  // namespace

namespace {

// Exceptions, MPI and Kokkos start and end, versions, statistics.
void bind_runtime(py::module_& m) {
  static py::exception<kvmap::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<kvmap::RemoteError> remote(m, "RemoteError", error.ptr());
  error_type = error.ptr();
  remote_type = remote.ptr();
  {
    const py::module_ torch = py::module_::import("torch");
    py::object oom = py::hasattr(torch, "OutOfMemoryError")
                         ? torch.attr("OutOfMemoryError")
                         : py::module_::import("torch.cuda").attr("OutOfMemoryError");
    torch_oom_type = oom.release().ptr();  // kept for the life of the process
  }
  // pybind11's translator type takes the exception_ptr by value.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr p) {
    if (p && !set_python_error(p, /*only_kvmap=*/true)) std::rethrow_exception(p);
  });

  m.def("_initialize", [] {
    if (!kvmap::Detail::mpi_initialized())
      throw kvmap::Error("kvmap: MPI is not initialized (import mpi4py.MPI first)");
    if (Kokkos::is_initialized()) {
      kvmap::Detail::decide_gpu_aware_mpi_on_every_rank();
      return;
    }
    // `import kvmap` prints nothing: Kokkos' warnings (e.g. OpenMP's about OMP_PROC_BIND)
    // are off unless the user asked for them through KOKKOS_DISABLE_WARNINGS (or, in the
    // application, through Kokkos' own command line).
    std::vector<std::string> args{"kvmap"};
    if (!std::getenv("KOKKOS_DISABLE_WARNINGS")) args.emplace_back("--kokkos-disable-warnings");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int argc = static_cast<int>(args.size());
    char** argv_data = argv.data();
    kvmap::Detail::initialize_kokkos(argc, argv_data);
  });
  // The MPI library kvmap was linked with, as the running MPI names itself: compared with
  // mpi4py's at import (two MPI libraries in one process cannot share a communicator).
  m.def("_mpi_library_version", [] { return kvmap::Detail::mpi_library_version(); });
  m.def("_finalize", [] {
    kvmap::Detail::release_cached_comms();
    // Python may still hold DistViews (or tensors on their memory) at exit: module globals,
    // tracebacks. Freeing Kokkos memory after Kokkos::finalize aborts, so Kokkos is
    // finalized only when no kvmap allocation is alive; otherwise the process exits with
    // Kokkos up and the operating system takes the memory back.
    if (Kokkos::is_initialized() && kvmap::Detail::live_allocations() == 0) Kokkos::finalize();
  });
  m.def("version", [] { return std::string(kvmap::version()); });
  m.def("build_info", [] { return std::string(kvmap::build_info()); });

  m.def("_stats", [] {
    const auto s = kvmap::stats();
    py::dict d;
    d["bytes_copied"] = s.bytes_copied;
    d["vmap_calls"] = s.vmap_calls;
    d["chunks_run"] = s.chunks_run;
    d["collectives"] = s.collectives;
    d["bytes_received"] = s.bytes_received;
    d["plans_built"] = s.plans_built;
    d["chunk_retries"] = s.chunk_retries;
    d["auto_chunk_size"] = s.auto_chunk_size;
    d["auto_bytes_per_sample"] = s.auto_bytes_per_sample;
    d["bytes_allocated"] = s.bytes_allocated;
    d["bytes_live"] = s.bytes_live;
    d["gpu_aware_mpi"] = s.gpu_aware_mpi;
    return d;
  });
  m.def("_reset_stats", [] { kvmap::reset_stats(); });
}

// The DistView class: shape, placement, local data, redistribution.
void bind_dist_view(py::module_& m) {
  py::class_<PyDistView>(m, "DistView")
      .def_property_readonly(
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
      .def("is_balanced",
           [](const PyDistView& d) {
             return d.visit([](const auto& v) { return v.is_balanced(); });
           })
      // The source is copied and the result assigned with the GIL held: another Python
      // thread never sees the DistView half replaced. Both return the array itself, as
      // Heat's in-place methods do (`x.resplit_(None).larray`).
      .def("balance_",
           [](py::object self) {
             PyDistView& d = self.cast<PyDistView&>();
             const AnyView source = *d.view;
             std::optional<AnyView> result;
             {
               py::gil_scoped_release release;
               result.emplace(
                   std::visit([](const auto& v) { return AnyView(v.balance()); }, source));
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
      .def("_local_address",
           [](const PyDistView& d) {
             return d.visit(
                 [](const auto& v) { return reinterpret_cast<std::uintptr_t>(v.local_data()); });
           })
      .def("__repr__", [](const PyDistView& d) {
        return d.visit([&](const auto& v) {
          return "kvmap.DistView(gshape=" + kvmap::to_string(v.gshape()) +
                 ", split=" + (v.split() ? std::to_string(*v.split()) : std::string("None")) +
                 ", dtype=" + kvmap::name(v.dtype()) + ", device=" + place_name(d.place()) + ", " +
                 v.layout().str() + ")";
        });
      });
}

// Factories of DistViews (from tensors, values, random streams) and linear algebra on them.
// A DistView made from a tensor lives where the tensor does; the other factories take
// device "cpu" or "gpu".
void bind_factories(py::module_& m) {
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

// kvmap.check_close: results against a reference under a rounding-error bound
// (kvmap/tolerance.hpp), the check kvmap's own tests, examples and benchmarks use.
void bind_tolerance(py::module_& m) {
  py::class_<kvmap::Closeness>(m, "Closeness")
      .def_readonly("ok", &kvmap::Closeness::ok)
      .def_readonly("form", &kvmap::Closeness::form)
      .def_readonly("mismatch", &kvmap::Closeness::mismatch)
      .def_readonly("elements", &kvmap::Closeness::elements)
      .def_property_readonly("position",
                             [](const kvmap::Closeness& c) { return to_tuple(c.position); })
      .def_readonly("actual", &kvmap::Closeness::actual)
      .def_readonly("reference", &kvmap::Closeness::reference)
      .def_readonly("error", &kvmap::Closeness::error)
      .def_readonly("bound", &kvmap::Closeness::bound)
      .def_readonly("ratio", &kvmap::Closeness::ratio)
      .def_readonly("roundings", &kvmap::Closeness::roundings)
      .def("describe", &kvmap::Closeness::describe)
      .def("__bool__", [](const kvmap::Closeness& c) { return c.ok; })
      .def("__repr__",
           [](const kvmap::Closeness& c) { return "kvmap.Closeness(" + c.describe() + ")"; });
  m.def(
      "check_close",
      [](const at::Tensor& actual, const at::Tensor& reference, std::int64_t roundings,
         const py::object& magnitudes) {
        kvmap::ErrorBound bound{roundings, {}};
        if (py::isinstance<py::float_>(magnitudes) || py::isinstance<py::int_>(magnitudes)) {
          bound.magnitudes = at::full({}, magnitudes.cast<double>(), at::kDouble);
        } else if (!magnitudes.is_none()) {
          bound.magnitudes = magnitudes.cast<at::Tensor>();
        }
        return kvmap::check_close(actual, reference, bound);
      },
      py::arg("actual"), py::arg("reference"), py::kw_only(), py::arg("roundings") = 1,
      py::arg("magnitudes") = py::none(),
      "Whether `actual` is within the rounding-error bound of `reference`:\n"
      "|actual - reference| <= roundings * (u(actual) + u(reference)) * m, elementwise, with u\n"
      "the dtypes' unit roundoff and m the per-element sum of the terms' magnitudes\n"
      "(`magnitudes`, float64) or, without them, max |reference| (norm-wise). `roundings`\n"
      "counts the roundings along the longest chain making one element: k for a k-term sum or\n"
      "dot product, 1 per arithmetic operation, 4 per elementary function. Returns a Closeness\n"
      "(true when within; repr names the worst element, both values and the bound).");
}

// kvmap.vmap and kvmap.map_batches: the C++ callable they return.
void bind_vmap(py::module_& m) {
  py::class_<PyMapped>(m, "Mapped", py::dynamic_attr(),
                       py::custom_type_setup([](PyHeapTypeObject* heap_type) {
                         heap_type->ht_type.tp_call = mapped_call;
                       }))
      .def_property_readonly("__wrapped__", [](const PyMapped& self) { return self.func; })
      .def_property_readonly("_who", [](const PyMapped& self) { return self.who(); });
  // The checks of the arguments' types are Python's (kvmap/_vmap.py); values are C++'s.
  m.def("_mapped", [](py::object func, const std::vector<std::int64_t>& out_dims, bool per_output,
                      const std::string& randomness, const py::object& chunk_size,
                      const py::object& memory_budget, bool pad_to_chunk, bool batches) {
    PyMapped mapped;
    mapped.func = std::move(func);
    if (per_output) {
      mapped.options.out_dims_per_output(out_dims);
    } else {
      mapped.options.out_dims(out_dims);
    }
    mapped.options.randomness(to_randomness(randomness));
    if (py::isinstance<py::str>(chunk_size)) {  // "auto" (kvmap._vmap checks the spelling)
      mapped.options.chunk_size(kvmap::auto_chunk);
    } else if (!chunk_size.is_none()) {
      mapped.options.chunk_size(chunk_size.cast<std::int64_t>());
    }
    if (!memory_budget.is_none()) mapped.options.memory_budget(memory_budget.cast<std::int64_t>());
    mapped.options.pad_to_chunk(pad_to_chunk);
    mapped.mapping = batches ? kvmap::Impl::Mapping::Batches : kvmap::Impl::Mapping::Samples;
    return mapped;
  });
  m.def("chunk_rows", &kvmap::chunk_rows,
        "Inside a function run by kvmap.vmap or kvmap.map_batches: the real rows of the chunk "
        "(with pad_to_chunk the others are padding); 0 outside.");
}

}  // namespace

PYBIND11_MODULE(_kvmap, m) {
  m.doc() = "kvmap: per-sample torch functions over arrays distributed with MPI (C++ core)";
  bind_runtime(m);
  bind_dist_view(m);
  bind_factories(m);
  bind_tolerance(m);
  bind_vmap(m);
}
