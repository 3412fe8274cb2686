// The exception bridge (errors.hpp).
#include "errors.hpp"

#include <new>

namespace kvmap::python {

namespace {
// torch.OutOfMemoryError (torch.cuda.OutOfMemoryError before torch 2.5), set at import.
PyObject* torch_oom_type = nullptr;
PyObject* error_type = nullptr;   // kvmap.Error
PyObject* remote_type = nullptr;  // kvmap.RemoteError
}  // namespace

// The fetched Python error (new references, taken over) as the C++ exception that carries it.
[[noreturn]] void throw_python_error(const std::string& what, PyObject* t, PyObject* v,
                                     PyObject* tb) {
  if (PyErr_GivenExceptionMatches(t, PyExc_MemoryError) ||
      (torch_oom_type != nullptr && PyErr_GivenExceptionMatches(t, torch_oom_type))) {
    throw PythonOutOfMemory(what, t, v, tb);
  }
  throw PythonCallError(what, t, v, tb);
}

// The one mapping of C++ exceptions to Python errors, for pybind11's exception translator
// (kvmap's own exceptions) and for the slots pybind11 does not wrap (everything): a Python
// error raised by func on this rank as itself (type, message, traceback), RemoteError with
// failed_ranks, ValueError, TypeError, kvmap.Error; then pybind11's own, MemoryError and
// RuntimeError. Returns false, setting nothing, for an exception that is not kvmap's when
// `only_kvmap`.
bool set_python_error(const std::exception_ptr& p, bool only_kvmap) {
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

void bind_errors(py::module_& m) {
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
}

}  // namespace kvmap::python
