// The only PYBIND11_MODULE of fluxmpi_py. Python never sees MPI handles: it sees integers,
// tensors and Work objects. Every blocking call releases the GIL.
#include "bindings.h"

#include <torch/version.h>

#include <optional>

#include "ops/collectives.h"
#include "ops/consensus.h"
#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/user_call.h"

#ifdef FLUXMPI_WITH_CUDA
#include "backend/nccl_backend.h"
#endif

namespace py = pybind11;

namespace fluxmpi {

void bind_runtime(py::module_& m) {
  m.def("init", &init, py::arg("comm_handle") = 0, py::call_guard<py::gil_scoped_release>());
  m.def("initialized", &initialized);
  m.def("shutdown", &shutdown, py::call_guard<py::gil_scoped_release>());
  m.def("abort", [](const std::string& why, int code) { abort_job(why, code); },
        py::arg("why"), py::arg("code") = 1);
  m.def("meet_before_abort", &meet_before_abort, py::arg("timeout_s"),
        py::call_guard<py::gil_scoped_release>());
  m.def("enter_user_call", &enter_user_call, py::arg("name"));
  m.def("leave_user_call", &leave_user_call, py::arg("entered"));
  m.def("rank", [] { return env().rank; });
  m.def("size", [] { return env().size; });
  m.def("node_rank", [] { return env().node_rank; });
  m.def("node_size", [] { return env().node_size; });
  m.def("thread_level", [] { return env().thread_level; });
  m.def("mpi_library_version", &mpi_library_version);
  m.def("mpi_standard_version", [] {
    int v = 0, sv = 0;
    MPI_Get_version(&v, &sv);
    return std::to_string(v) + "." + std::to_string(sv);
  });
  m.def("compiled_with_cuda", [] {
#ifdef FLUXMPI_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("nccl_version", []() -> std::string {
#ifdef FLUXMPI_WITH_CUDA
    return nccl_version_string();
#else
    return "";
#endif
  });
  m.attr("compiled_torch_version") = TORCH_VERSION;
  m.def("barrier", [] {
    UserCall named("barrier()");
    Engine::get().run_inline([] {
      Signature s;
      s.kind = CallKind::Barrier;
      agree(s, "barrier()", "");
      mpi_backend().barrier();
    });
  }, py::call_guard<py::gil_scoped_release>());
}

void bind_collectives(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", &Work::wait, py::call_guard<py::gil_scoped_release>())
      .def("test", &Work::test)
      .def_property_readonly("what", &Work::what);

  // The tensor may be None: the Python wrapper passes None and a `local_error` for a
  // non-tensor argument, so that every rank raises, not only the one that got it wrong.
  using MaybeTensor = std::optional<at::Tensor>;
  m.def("allreduce_", [](const MaybeTensor& t, const std::string& op, const std::string& err) {
    env();
    UserCall named("allreduce_()");
    at::Tensor x = t.value_or(at::Tensor());
    Engine::get().run_inline([&] { allreduce_checked(x, op, err); });
  }, py::arg("tensor"), py::arg("op"), py::arg("local_error") = "",
     py::call_guard<py::gil_scoped_release>());
  m.def("bcast_", [](const MaybeTensor& t, std::int64_t root, const std::string& err) {
    env();
    UserCall named("bcast_()");
    at::Tensor x = t.value_or(at::Tensor());
    Engine::get().run_inline([&] { broadcast_checked(x, root, err); });
  }, py::arg("tensor"), py::arg("root_rank"), py::arg("local_error") = "",
     py::call_guard<py::gil_scoped_release>());
  m.def("reduce_", [](const MaybeTensor& t, const std::string& op, std::int64_t root,
                      const std::string& err) {
    env();
    UserCall named("reduce_()");
    at::Tensor x = t.value_or(at::Tensor());
    Engine::get().run_inline([&] { reduce_checked(x, op, root, err); });
  }, py::arg("tensor"), py::arg("op"), py::arg("root_rank"), py::arg("local_error") = "",
     py::call_guard<py::gil_scoped_release>());
  m.def("iallreduce_", [](const MaybeTensor& t, const std::string& op, const std::string& err) {
    env();
    UserCall named("Iallreduce()");
    at::Tensor x = t.value_or(at::Tensor());
    return Engine::get().submit("Iallreduce", [x, op, err] { allreduce_checked(x, op, err); });
  }, py::arg("tensor"), py::arg("op"), py::arg("local_error") = "",
     py::call_guard<py::gil_scoped_release>());  // a synchronous engine runs it right here
  m.def("ibcast_", [](const MaybeTensor& t, std::int64_t root, const std::string& err) {
    env();
    UserCall named("Ibcast()");
    at::Tensor x = t.value_or(at::Tensor());
    return Engine::get().submit("Ibcast", [x, root, err] { broadcast_checked(x, root, err); });
  }, py::arg("tensor"), py::arg("root_rank"), py::arg("local_error") = "",
     py::call_guard<py::gil_scoped_release>());
}

}  // namespace fluxmpi

PYBIND11_MODULE(_C, m) {
  m.doc() = "fluxmpi_py's compiled core; use the fluxmpi_py package, not this module";
  // Our c10 errors become ValueError / TypeError / RuntimeError without C++ backtraces.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const fluxmpi::RaisedOnEveryRank& e) {
      // The same error on every rank: marked, so that one rank reports it for all.
      PyObject* type = e.error_class() == fluxmpi::ErrorClass::Value  ? PyExc_ValueError
                       : e.error_class() == fluxmpi::ErrorClass::Type ? PyExc_TypeError
                                                                      : PyExc_RuntimeError;
      py::object exc = py::reinterpret_steal<py::object>(PyObject_CallFunction(type, "s", e.what()));
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
  fluxmpi::bind_gradients(m);
  fluxmpi::bind_sync(m);
  fluxmpi::bind_shard(m);
}
