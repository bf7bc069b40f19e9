// The compiled half of synchronize_ (fluxmpi_py/sync.py does the object traversal):
//   sync_fast_path     agree on the call, compare every rank's structure hash; when all are
//                      equal and no rank needs the root's non-tensor values, broadcast the
//                      tensors right away (no skeleton travels).
//   broadcast_bytes    the root's pickled skeleton: agree, then the length, then the bytes.
//   coalesced_broadcast  agree (folding in each rank's mismatch error), then the tensors.
//   sync_plan          the pure broadcast plan, for tests.
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "backend/backend.h"
#include "bindings.h"
#include "ops/coalesced_broadcast.h"
#include "ops/flat_storage.h"
#include "runtime/engine.h"
#include "runtime/environment.h"

namespace py = pybind11;

namespace fluxmpi {

namespace {

constexpr const char* kWhat = "synchronize_()";

// Stages of synchronize_ that agree under kind ObjectBroadcast, told apart by `detail`, so a
// rank that is one stage ahead of another is reported instead of mismatching buffers.
enum Stage : std::int64_t { kBegin = 1, kSkeleton = 2 };

ErrorClass error_class(int code) {
  TORCH_CHECK_VALUE(code >= 0 && code <= 3, "fluxmpi_py: bad error class ", code);
  return static_cast<ErrorClass>(code);
}

CoalescedOptions options(std::int64_t bucket_bytes, std::int64_t direct_bytes,
                         bool relocate = false) {
  CoalescedOptions o;
  o.bucket_bytes = bucket_bytes;
  o.direct_bytes = direct_bytes;
  o.relocate = relocate;
  return o;
}

// Signature of one ObjectBroadcast stage, with the root checked and the local error folded in.
Signature object_signature(Stage stage, std::int64_t root, ErrorClass err, std::string& msg) {
  Signature s;
  s.kind = CallKind::ObjectBroadcast;
  s.root = root;
  s.detail = stage;
  s.error = err;
  int size = env().size;
  if (s.error == ErrorClass::None && (root < 0 || root >= size)) {
    s.error = ErrorClass::Value;
    msg = "root_rank " + std::to_string(root) + " is out of range; expected 0 <= root_rank < " +
          std::to_string(size);
  }
  return s;
}

// A plan kept with a TensorList, valid for the hash it was made for (shapes, dtypes, options).
struct PlanCache {
  std::int64_t key = 0;
  bool valid = false;
  std::vector<BroadcastStep> plan;    // large CPU tensors alone
  std::vector<BroadcastStep> packed;  // every CPU tensor packed (options.pack_cpu)
  bool has_packed = false;            // packed differs from plan
  std::vector<Probe> probes;  // this call's, kept only to reuse the allocation
};

std::size_t direct_steps(const std::vector<BroadcastStep>& plan) {
  return static_cast<std::size_t>(
      std::count_if(plan.begin(), plan.end(), [](const BroadcastStep& s) { return s.direct; }));
}

bool fast_path(const std::vector<at::Tensor>& tensors, std::int64_t root,
               std::int64_t structure_hash, bool needs_skeleton, ErrorClass err,
               const std::string& err_text, const CoalescedOptions& opts, PlanCache& cache) {
  std::string msg = err_text;
  Signature s = object_signature(kBegin, root, err, msg);
  if (s.error == ErrorClass::None && (opts.bucket_bytes <= 0 || opts.direct_bytes <= 0)) {
    s.error = ErrorClass::Value;
    msg = "bucket_bytes and direct_bytes must be positive, got " +
          std::to_string(opts.bucket_bytes) + " and " + std::to_string(opts.direct_bytes);
  }
  if (s.error == ErrorClass::None) msg = std::to_string(tensors.size()) + " tensors";
  // Shapes, dtypes, device types, paths and options in one number, compared in the same
  // allreduce as the call itself: equal everywhere means every rank's tensors line up with the
  // root's, so the data can move without a skeleton.
  std::int64_t o[2] = {opts.bucket_bytes, opts.direct_bytes};
  const bool moves = env().size > 1;  // a world of one moves no data: no probes
  try {
    s.soft = tensors_hash(tensors, hash_bytes(o, sizeof(o), structure_hash),
                          moves ? &cache.probes : nullptr);
  } catch (const std::exception& e) {
    // A tensor whose metadata cannot be read (a subclass, say): raised on every rank by the
    // agreement below, never on this rank alone, which would leave the others waiting.
    if (s.error == ErrorClass::None) {
      s.error = ErrorClass::Type;
      msg = std::string("reading the tensors failed: ") + e.what();
    }
  }
  s.soft_flag = needs_skeleton ? 1 : 0;
  if (s.error == ErrorClass::None && (!cache.valid || cache.key != s.soft)) {
    cache.plan = plan_broadcast(tensors, opts);
    CoalescedOptions packed_opts = opts;
    packed_opts.pack_cpu = true;
    cache.packed = plan_broadcast(tensors, packed_opts);
    cache.has_packed = direct_steps(cache.packed) != direct_steps(cache.plan);
    cache.key = s.soft;
    cache.valid = true;
  }
  // With relocation, large CPU tensors may travel packed too, once relocated in place: fewer
  // broadcasts. Only if every rank holds every packed step in place (or can relocate it now);
  // a rank that cannot (someone holds one of its parameters' storage, say) vetoes, and all
  // take the plan that sends large tensors alone. Both plans come from the agreed shapes.
  // `relocate` is each rank's own argument, not part of the agreed hash: a rank that does not
  // pack (relocate=False) vetoes too, so that no rank takes the packed plan without it.
  const bool packing = opts.relocate && moves && s.error == ErrorClass::None;
  if (!packing || (cache.has_packed && !steps_in_place(tensors, cache.packed, cache.probes))) {
    s.veto = 1;
  }
  bool vetoed = false;
  if (!agree(s, kWhat, msg, &vetoed)) return false;
  const bool packed = cache.has_packed && !vetoed;  // !vetoed: every rank is packing
  coalesced_broadcast_data(tensors, static_cast<int>(root), opts,
                           packed ? &cache.packed : &cache.plan, &cache.probes);
  return true;
}

std::string broadcast_bytes(const char* data, std::int64_t len, std::int64_t root,
                            ErrorClass err, const std::string& err_text) {
  std::string msg = err_text;
  Signature s = object_signature(kSkeleton, root, err, msg);
  agree(s, kWhat, msg);
  const auto& e = env();
  std::string out;
  if (e.size == 1) return out;  // the root's own bytes are the answer
  mpi_backend().broadcast(&len, 1, at::kLong, static_cast<int>(root));
  if (len == 0) return out;
  if (e.rank == root) {
    // The backend's signature is not const: it writes on receivers only.
    mpi_backend().broadcast(const_cast<char*>(data), len, at::kByte, static_cast<int>(root));
    return out;  // the caller keeps its own bytes
  }
  out.resize(static_cast<std::size_t>(len));
  mpi_backend().broadcast(out.data(), len, at::kByte, static_cast<int>(root));
  return out;
}

// CPython before 3.12 gives every dict a version tag (PEP 509): a new value of a global
// counter on every modification, so an equal tag means an unmodified dict. 3.12 deprecates
// the field; there, and in any later version, -1: no tag, compare the entries.
long long dict_version(PyObject* d) {
#if PY_VERSION_HEX < 0x030C0000
  // Plain dicts only: a subclass (OrderedDict) can reorder without touching the dict itself.
  if (!PyDict_CheckExact(d)) return -1;
  return static_cast<long long>(reinterpret_cast<PyDictObject*>(d)->ma_version_tag &
                                0x7fffffffffffffffull);
#else
  (void)d;
  return -1;
#endif
}

}  // namespace

// The tensors of synchronize_'s fast path, converted from Python once: a cached module walk
// keeps its TensorList, so a call on an unchanged model skips converting a thousand tensors
// (~0.1 us each) and reuses the broadcast plan.
struct TensorList {
  std::vector<at::Tensor> items;
  PlanCache plan;
};

void bind_sync(py::module_& m) {
  py::class_<TensorList>(m, "TensorList")
      .def(py::init([](std::vector<at::Tensor> ts) { return TensorList{std::move(ts)}; }))
      .def("__len__", [](const TensorList& l) { return l.items.size(); });

  // A cached module walk is still valid when every dict of its snapshot holds the same key
  // and value objects, in order. `snapshot` is a list of (dict, [keys], [values], version)
  // tuples. A dict whose version tag is the one recorded was not modified since: one
  // comparison, against one per entry otherwise (~25 us for a thousand entries on a cold
  // cache, where the whole call's budget is ~100 us). Without a tag (version -1), or when it
  // moved, the entries are compared by identity.
  m.def("dict_version", [](py::handle d) {
    TORCH_CHECK_TYPE(PyDict_Check(d.ptr()), "dict_version takes a dict");
    return dict_version(d.ptr());
  });
  m.def("dicts_unchanged", [](py::handle snapshot) {
    PyObject* snap = snapshot.ptr();
    TORCH_CHECK_TYPE(PyList_Check(snap), "dicts_unchanged takes a list");
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(snap); ++i) {
      PyObject* t = PyList_GET_ITEM(snap, i);
      TORCH_CHECK_TYPE(PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 4, "bad snapshot entry");
      PyObject* d = PyTuple_GET_ITEM(t, 0);
      PyObject* keys = PyTuple_GET_ITEM(t, 1);
      PyObject* values = PyTuple_GET_ITEM(t, 2);
      TORCH_CHECK_TYPE(PyDict_Check(d) && PyList_Check(keys) && PyList_Check(values) &&
                           PyList_GET_SIZE(keys) == PyList_GET_SIZE(values) &&
                           PyLong_Check(PyTuple_GET_ITEM(t, 3)),
                       "bad snapshot entry");
      const long long version = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
      if (version >= 0 && version == dict_version(d)) continue;
      if (PyDict_GET_SIZE(d) != PyList_GET_SIZE(keys)) return false;
      Py_ssize_t pos = 0, k = 0;
      PyObject *key = nullptr, *value = nullptr;
      while (PyDict_Next(d, &pos, &key, &value)) {
        if (k >= PyList_GET_SIZE(keys) || key != PyList_GET_ITEM(keys, k) ||
            value != PyList_GET_ITEM(values, k)) {
          return false;
        }
        ++k;
      }
    }
    return true;
  });

  m.def("sync_fast_path",
        [](TensorList& tensors, std::int64_t root, std::int64_t structure_hash,
           bool needs_skeleton, int err, const std::string& err_text, std::int64_t bucket_bytes,
           std::int64_t direct_bytes, bool relocate) {
          env();
          bool done = false;
          Engine::get().run_inline([&] {
            done = fast_path(tensors.items, root, structure_hash, needs_skeleton,
                             error_class(err), err_text,
                             options(bucket_bytes, direct_bytes, relocate), tensors.plan);
          });
          return done;
        },
        py::arg("tensors"), py::arg("root_rank"), py::arg("structure_hash"),
        py::arg("needs_skeleton"), py::arg("error_class"), py::arg("error_text"),
        py::arg("bucket_bytes"), py::arg("direct_bytes"), py::arg("relocate") = false,
        py::call_guard<py::gil_scoped_release>());
  // The root passes its pickle and gets it back (same object); other ranks pass None.
  m.def("broadcast_bytes",
        [](py::object data, std::int64_t root, int err, const std::string& err_text) -> py::object {
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
            is_root = initialized() && env().rank == root;
            Engine::get().run_inline([&] {
              out = broadcast_bytes(ptr, len, root, error_class(err), err_text);
            });
          }
          if (is_root) return data;  // no copy of the root's pickle
          return py::bytes(out);
        },
        py::arg("data"), py::arg("root_rank"), py::arg("error_class") = 0,
        py::arg("error_text") = "");

  m.def("coalesced_broadcast",
        [](const std::vector<at::Tensor>& tensors, std::int64_t root, int err,
           const std::string& err_text, std::int64_t bucket_bytes, std::int64_t direct_bytes,
           bool relocate) {
          env();
          Engine::get().run_inline([&] {
            coalesced_broadcast_checked(tensors, root, error_class(err), err_text,
                                        options(bucket_bytes, direct_bytes, relocate));
          });
        },
        py::arg("tensors"), py::arg("root_rank"), py::arg("error_class"), py::arg("error_text"),
        py::arg("bucket_bytes"), py::arg("direct_bytes"), py::arg("relocate") = false,
        py::call_guard<py::gil_scoped_release>());

  m.def("sync_copy_counters", [] {
    auto c = copy_counters();
    return py::make_tuple(c.copied, c.in_place);
  });

  m.def("sync_plan",
        [](const std::vector<at::Tensor>& tensors, std::int64_t bucket_bytes,
           std::int64_t direct_bytes, bool pack_cpu) {
          CoalescedOptions o = options(bucket_bytes, direct_bytes);
          o.pack_cpu = pack_cpu;
          py::list out;
          for (const auto& s : plan_broadcast(tensors, o)) {
            out.append(py::make_tuple(s.direct, s.members, s.bytes));
          }
          return out;
        },
        py::arg("tensors"), py::arg("bucket_bytes"), py::arg("direct_bytes"),
        py::arg("pack_cpu") = false);
}

}  // namespace fluxmpi
