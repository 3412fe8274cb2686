// The Python front-end of the vmap core (vmap_frontend.hpp).
#include "vmap_frontend.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <exception>
#include <iterator>
#include <string>
#include <utility>

#include "errors.hpp"
#include "heat_adapter.hpp"

namespace kvmap::python {

namespace {

kvmap::Randomness to_randomness(const std::string& r) {
  if (r == "error") return kvmap::Randomness::Error;
  if (r == "same") return kvmap::Randomness::Same;
  if (r == "different") return kvmap::Randomness::Different;
  throw py::value_error("kvmap.vmap: randomness must be 'error', 'same' or 'different', got '" + r +
                        "'");
}

// The arguments of one call as the core takes them: copies of the DistViews (their memory
// stays alive for the whole call, even when Python code on another thread rebinds or
// rebalances the arguments while the GIL is released), all in one memory space (f's tensors
// live there: the first's), and the Python communicator the results take (the inputs').
struct CallArrays {
  std::vector<AnyView> arrays;
  py::object comm = py::none();
  Place place = Place::Host;
};

CallArrays call_arrays(const PyMapped& m, const PyDistView* const* views, Py_ssize_t nargs) {
  CallArrays c;
  c.arrays.reserve(static_cast<std::size_t>(nargs));
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    const PyDistView& d = *views[i];
    if (i == 0) c.place = d.place();
    if (d.place() != c.place) {
      throw py::type_error(std::string(m.who()) +
                           ": the DistViews must live in one memory space: argument 0 is on " +
                           place_name(c.place) + ", argument " + std::to_string(i) + " on " +
                           place_name(d.place()) + " (DistView.to(device) moves one)");
    }
    c.arrays.push_back(*d.view);
    if (c.comm.is_none()) c.comm = d.comm;
  }
  return c;
}

// The keyword arguments that are tensors: passed whole, never shared by an output.
std::vector<at::Tensor> keyword_tensors(PyObject* kwargs) {
  std::vector<at::Tensor> tensors;
  if (!kwargs) return tensors;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(kwargs, &pos, &key, &value)) {
    if (THPVariable_Check(value)) tensors.push_back(THPVariable_Unpack(value));
  }
  return tensors;
}

// f's result as tensors: a tensor, or a tuple or list of them (TypeError otherwise).
std::vector<at::Tensor> result_tensors(const PyMapped& m, const py::object& out) {
  std::vector<at::Tensor> outs;
  if (THPVariable_Check(out.ptr())) {
    outs.push_back(THPVariable_Unpack(out.ptr()));
    return outs;
  }
  if (!py::isinstance<py::tuple>(out) && !py::isinstance<py::list>(out)) {
    throw py::type_error(std::string(m.who()) +
                         ": the function must return a tensor or a tuple of tensors, got " +
                         std::string(py::str(py::type::of(out))));
  }
  for (auto o : out) {
    if (!THPVariable_Check(o.ptr())) {
      throw py::type_error(std::string(m.who()) + ": the function must return tensors, got a " +
                           std::string(py::str(py::type::of(o))) + " in its result");
    }
    outs.push_back(THPVariable_Unpack(o.ptr()));
  }
  return outs;
}

// The user's function as the core calls it, on any thread: with the GIL, its Python errors
// carried through the core as C++ exceptions (errors.hpp).
struct PythonFunction {
  const PyMapped& m;
  Py_ssize_t nargs;
  PyObject* kwargs;
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& per_array) const {
    py::gil_scoped_acquire gil;
    try {
      py::tuple pargs(nargs);
      for (Py_ssize_t i = 0; i < nargs; ++i)
        PyTuple_SET_ITEM(pargs.ptr(), i, THPVariable_Wrap(per_array[static_cast<std::size_t>(i)]));
      PyObject* raw = PyObject_Call(m.func.ptr(), pargs.ptr(), kwargs);
      if (!raw) throw py::error_already_set();
      return result_tensors(m, py::reinterpret_steal<py::object>(raw));
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
  }
};

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

}  // namespace

VmapResults run_vmap_views(const PyMapped& m, const PyDistView* const* views, Py_ssize_t nargs,
                           PyObject* kwargs) {
  CallArrays c = call_arrays(m, views, nargs);
  const std::vector<at::Tensor> tensors = keyword_tensors(kwargs);
  PythonFunction f{m, nargs, kwargs};
  std::vector<AnyView> outputs;
  std::exception_ptr failure;
  {
    py::gil_scoped_release release;
    try {
      outputs = in_space(c.place, [&](auto space) {
        using M = typename decltype(space)::type;
        std::vector<const kvmap::DistView<M>*> pointers;
        pointers.reserve(c.arrays.size());
        for (const AnyView& a : c.arrays) pointers.push_back(&std::get<kvmap::DistView<M>>(a));
        std::vector<kvmap::DistView<M>> out =
            m.overlap ? kvmap::Impl::map_overlap_core<M>(pointers.data(), pointers.size(), tensors,
                                                         *m.overlap, kvmap::Impl::ArgsCall(f))
                      : kvmap::Impl::vmap_core<M>(pointers.data(), pointers.size(), tensors,
                                                  m.options, m.mapping, kvmap::Impl::ArgsCall(f));
        return std::vector<AnyView>(std::make_move_iterator(out.begin()),
                                    std::make_move_iterator(out.end()));
      });
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  return {std::move(outputs), std::move(c.comm)};
}

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
  // kvmap.map_overlap's callable (kvmap/_vmap.py checks the types; the core the values).
  m.def("_mapped_overlap", [](py::object func, std::int64_t before, std::int64_t after,
                              const std::string& boundary, double constant, bool trim) {
    PyMapped mapped;
    mapped.func = std::move(func);
    mapped.overlap = kvmap::OverlapOptions()
                         .depth(before, after)
                         .boundary(to_boundary("kvmap.map_overlap", boundary), constant)
                         .trim(trim);
    return mapped;
  });
  m.def("chunk_rows", &kvmap::chunk_rows,
        "Inside a function run by kvmap.vmap or kvmap.map_batches: the real rows of the chunk "
        "(with pad_to_chunk the others are padding); 0 outside.");
}

}  // namespace kvmap::python
