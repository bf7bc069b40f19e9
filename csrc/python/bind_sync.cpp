// Python face of synchronize_'s compiled half (fluxmpi_py/sync/synchronize.py does the object
// traversal):
//   sync_fast_path       ops/sync_fast_path.h: one agreement; the tensors move when it allows
//   broadcast_bytes      ops/bytes_broadcast.h: the root's bytes (a pickled skeleton, ...)
//   coalesced_broadcast  ops/coalesced_broadcast.h: agree, then the tensors
//   plan_broadcast       fusion/broadcast_plan.h: the pure plan, for tests (needs no Init)
//   dict_version, dicts_unchanged  python/dict_snapshot.h: the cached module walk's check
#include <ATen/ATen.h>

#include <vector>

#include "fusion/broadcast_plan.h"
#include "ops/bytes_broadcast.h"
#include "ops/coalesced_broadcast.h"
#include "ops/sync_fast_path.h"
#include "python/bindings.h"
#include "python/dict_snapshot.h"
#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/group.h"

namespace py = pybind11;

namespace fluxmpi {

namespace {

// The tensors of synchronize_'s fast path, converted from Python once: a cached module walk
// keeps its TensorList, so a call on an unchanged model skips converting a thousand tensors
// (~0.1 us each) and reuses the broadcast plan.
struct TensorList {
  std::vector<at::Tensor> items;
  SyncPlanCache plan;
};

void bind_options(py::module_& m) {
  py::enum_<ErrorClass>(m, "ErrorClass", "The exception a rank's local error becomes on every rank")
      .value("NONE", ErrorClass::None, "no error")
      .value("VALUE", ErrorClass::Value, "ValueError")
      .value("TYPE", ErrorClass::Type, "TypeError")
      .value("RUNTIME", ErrorClass::Runtime, "RuntimeError");

  const BroadcastPlanOptions dp;
  py::class_<BroadcastPlanOptions> plan(m, "BroadcastPlanOptions",
                                        "The broadcast planner's limits (bytes)");
  plan.def(py::init([](std::int64_t bucket_bytes, std::int64_t direct_bytes, bool pack_cpu) {
             BroadcastPlanOptions o;
             o.bucket_bytes = bucket_bytes;
             o.direct_bytes = direct_bytes;
             o.pack_cpu = pack_cpu;
             return o;
           }),
           py::kw_only(), py::arg("bucket_bytes") = dp.bucket_bytes,
           py::arg("direct_bytes") = dp.direct_bytes, py::arg("pack_cpu") = dp.pack_cpu)
      .def_readwrite("bucket_bytes", &BroadcastPlanOptions::bucket_bytes,
                     "a packed buffer holds at most this many bytes")
      .def_readwrite("direct_bytes", &BroadcastPlanOptions::direct_bytes,
                     "tensors at least this large are broadcast alone, in place")
      .def_readwrite("pack_cpu", &BroadcastPlanOptions::pack_cpu,
                     "pack CPU tensors of any size up to bucket_bytes");
  def_fields(plan, {"bucket_bytes", "direct_bytes", "pack_cpu"});

  const CoalescedOptions dc;
  py::class_<CoalescedOptions> coalesced(m, "CoalescedOptions",
                                         "How synchronize_'s tensors travel");
  coalesced
      .def(py::init([](const BroadcastPlanOptions& plan, bool relocate) {
             CoalescedOptions o;
             o.plan = plan;
             o.relocate = relocate;
             return o;
           }),
           py::kw_only(), py::arg("plan") = dc.plan, py::arg("relocate") = dc.relocate)
      .def_readwrite("plan", &CoalescedOptions::plan)
      .def_readwrite("relocate", &CoalescedOptions::relocate,
                     "move parameters into flat storage, so later calls broadcast in place");
  def_fields(coalesced, {"plan", "relocate"});
}

}  // namespace

void bind_sync(py::module_& m) {
  bind_options(m);

  py::class_<TensorList>(m, "TensorList")
      .def(py::init([](std::vector<at::Tensor> ts) { return TensorList{std::move(ts), {}}; }),
           py::arg("tensors"))
      .def("__len__", [](const TensorList& l) { return l.items.size(); });

  m.def(
      "dict_version",
      [](py::handle d) {
        TORCH_CHECK_TYPE(PyDict_Check(d.ptr()), "dict_version takes a dict");
        return dict_version(d.ptr());
      },
      py::arg("d"));
  m.def(
      "dicts_unchanged", [](py::handle snapshot) { return dicts_unchanged(snapshot.ptr()); },
      py::arg("snapshot"));

  m.def(
      "sync_fast_path",
      [](TensorList& tensors, std::int64_t root, std::int64_t structure_hash,
         const CoalescedOptions& options, bool needs_skeleton, ErrorClass err,
         const std::string& err_text) {
        env();
        bool done = false;
        Engine::get().run_inline([&] {
          done = sync_fast_path(tensors.items, root, structure_hash, needs_skeleton, err, err_text,
                                options, tensors.plan);
        });
        return done;
      },
      py::arg("tensors"), py::arg("root_rank"), py::arg("structure_hash"), py::arg("options"),
      py::kw_only(), py::arg("needs_skeleton") = false, py::arg("error_class") = ErrorClass::None,
      py::arg("error_text") = "", py::call_guard<py::gil_scoped_release>());

  // The root passes its pickle and gets it back (same object); other ranks pass None.
  m.def(
      "broadcast_bytes",
      [](py::object data, std::int64_t root, ErrorClass err,
         const std::string& err_text) -> py::object {
        env();
        const char* ptr = nullptr;
        Py_ssize_t len = 0;
        if (!data.is_none()) {
          TORCH_CHECK_TYPE(PyBytes_Check(data.ptr()), "fluxmpi_py: broadcast_bytes takes bytes");
          ptr = PyBytes_AS_STRING(data.ptr());
          len = PyBytes_GET_SIZE(data.ptr());
        }
        std::string out;
        bool is_root = false;
        {
          py::gil_scoped_release no_gil;
          is_root = initialized() && current_group().rank() == root;
          Engine::get().run_inline([&] { out = broadcast_bytes(ptr, len, root, err, err_text); });
        }
        if (is_root) return data;  // no copy of the root's pickle
        return py::bytes(out);
      },
      py::arg("data"), py::arg("root_rank"), py::kw_only(),
      py::arg("error_class") = ErrorClass::None, py::arg("error_text") = "");

  m.def(
      "coalesced_broadcast",
      [](const std::vector<at::Tensor>& tensors, std::int64_t root, const CoalescedOptions& options,
         ErrorClass err, const std::string& err_text) {
        env();
        Engine::get().run_inline(
            [&] { coalesced_broadcast_checked(tensors, root, err, err_text, options); });
      },
      py::arg("tensors"), py::arg("root_rank"), py::arg("options"), py::kw_only(),
      py::arg("error_class") = ErrorClass::None, py::arg("error_text") = "",
      py::call_guard<py::gil_scoped_release>());

  m.def("sync_copy_counters", [] {
    auto c = copy_counters();
    return py::make_tuple(c.copied, c.in_place);
  });

  m.def(
      "plan_broadcast",
      [](const std::vector<at::Tensor>& tensors, const BroadcastPlanOptions& options) {
        py::list out;
        for (const auto& s : plan_broadcast(tensors, options)) {
          out.append(py::make_tuple(s.direct, s.members, s.bytes));
        }
        return out;
      },
      py::arg("tensors"), py::arg("options"),
      "The broadcasts for tensors: a list of (direct, members, bytes). Pure: needs no Init");
}

}  // namespace fluxmpi
