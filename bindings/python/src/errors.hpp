#pragma once
// The exception bridge: a Python error raised by the user's function travels through kvmap's
// scheduler as a C++ exception and comes back as itself; kvmap's C++ exceptions become Python's
// (ValueError, TypeError, kvmap.Error, kvmap.RemoteError with failed_ranks). One mapping,
// used by pybind11's translator and by the slots pybind11 does not wrap.
#include <torch/csrc/utils/pybind.h>

#include <exception>
#include <memory>
#include <string>

#include "kvmap/error.hpp"

namespace kvmap::python {

namespace py = pybind11;

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

// The fetched Python error (new references, taken over) as the C++ exception that carries it:
// PythonOutOfMemory for MemoryError and torch.OutOfMemoryError (the scheduler then runs the
// chunk again in halves), PythonCallError otherwise.
[[noreturn]] void throw_python_error(const std::string& what, PyObject* t, PyObject* v,
                                     PyObject* tb);

// Sets the Python error for the C++ exception `p` (see errors.cpp). Returns false, setting
// nothing, for an exception that is not kvmap's when `only_kvmap`.
bool set_python_error(const std::exception_ptr& p, bool only_kvmap = false);

// kvmap.Error, kvmap.RemoteError and the translator; torch's out-of-memory type.
void bind_errors(py::module_& m);

}  // namespace kvmap::python
