// The only PYBIND11_MODULE of fluxmpi_py. Python never sees MPI handles: it sees integers,
// tensors, options objects and Work objects. Every blocking call releases the GIL.
#include <c10/util/Exception.h>

#include "ops/consensus.h"
#include "python/bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "fluxmpi_py's compiled core; use the fluxmpi_py package, not this module";
  // Our c10 errors become ValueError / TypeError / IndexError / RuntimeError without C++
  // backtraces.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const fluxmpi::RaisedOnEveryRank& e) {
      // The same error on every rank: marked, so that one rank reports it for all.
      PyObject* type = e.error_class() == fluxmpi::ErrorClass::Value  ? PyExc_ValueError
                       : e.error_class() == fluxmpi::ErrorClass::Type ? PyExc_TypeError
                                                                      : PyExc_RuntimeError;
      py::object exc =
          py::reinterpret_steal<py::object>(PyObject_CallFunction(type, "s", e.what()));
      if (!exc || PyObject_SetAttrString(exc.ptr(), "raised_on_every_rank", Py_True) != 0) {
        PyErr_SetString(type, e.what());
        return;
      }
      PyErr_SetObject(type, exc.ptr());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  fluxmpi::bind_runtime(m);
  fluxmpi::bind_collectives(m);
  fluxmpi::bind_gather_collectives(m);
  fluxmpi::bind_gradients(m);
  fluxmpi::bind_sync(m);
  fluxmpi::bind_shard(m);
  fluxmpi::bind_consistency(m);
  fluxmpi::bind_pack(m);
  fluxmpi::bind_hierarchical(m);
  fluxmpi::bind_c10d(m);
  fluxmpi::bind_groups(m);
}
