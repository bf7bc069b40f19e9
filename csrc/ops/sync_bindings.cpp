// The compiled half of synchronize_ (fluxmpi_py/sync.py does the object traversal):
//   sync_fast_path     agree on the call, compare every rank's structure hash; when all are
//                      equal and no rank needs the root's non-tensor values, broadcast the
//                      tensors right away (no skeleton travels).
//   broadcast_bytes    the root's pickled skeleton: agree, then the length, then the bytes.
//   coalesced_broadcast  agree (folding in each rank's mismatch error), then the tensors.
//   sync_plan          the pure broadcast plan, for tests.
#include <ATen/ATen.h>

#include <vector>

#include "backend/backend.h"
#include "bindings.h"
#include "ops/coalesced_broadcast.h"
#include "runtime/engine.h"
#include "runtime/environment.h"

namespace py = pybind11;

namespace fluxmpi {

namespace {

constexpr const char* kWhat = "fluxmpi_py.synchronize_";

// Stages of synchronize_ that agree under kind ObjectBroadcast, told apart by `detail`, so a
// rank that is one stage ahead of another is reported instead of mismatching buffers.
enum Stage : std::int64_t { kBegin = 1, kSkeleton = 2 };

ErrorClass error_class(int code) {
  TORCH_CHECK_VALUE(code >= 0 && code <= 3, "fluxmpi_py: bad error class ", code);
  return static_cast<ErrorClass>(code);
}

CoalescedOptions options(std::int64_t bucket_bytes, std::int64_t direct_bytes) {
  CoalescedOptions o;
  o.bucket_bytes = bucket_bytes;
  o.direct_bytes = direct_bytes;
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

bool fast_path(const std::vector<at::Tensor>& tensors, std::int64_t root,
               std::int64_t structure_hash, bool needs_skeleton, ErrorClass err,
               const std::string& err_text, const CoalescedOptions& opts) {
  std::string msg = err_text;
  Signature s = object_signature(kBegin, root, err, msg);
  if (s.error == ErrorClass::None && (opts.bucket_bytes <= 0 || opts.direct_bytes <= 0)) {
    s.error = ErrorClass::Value;
    msg = "bucket_bytes and direct_bytes must be positive, got " +
          std::to_string(opts.bucket_bytes) + " and " + std::to_string(opts.direct_bytes);
  }
  if (s.error == ErrorClass::None) msg = std::to_string(tensors.size()) + " tensors";
  agree(s, kWhat, msg);
  // Shapes, dtypes, device types, paths and options in one number: equal everywhere means
  // every rank's tensors line up with the root's, so the data can move without a skeleton.
  std::int64_t o[2] = {opts.bucket_bytes, opts.direct_bytes};
  std::int64_t h = tensors_hash(tensors, hash_bytes(o, sizeof(o), structure_hash));
  std::int64_t v[3] = {h, -h, needs_skeleton ? 1 : 0};
  if (env().size > 1) mpi_backend().allreduce(v, 3, at::kLong, ReduceOp::Max);
  if (v[0] != -v[1] || v[2] != 0) return false;
  coalesced_broadcast_data(tensors, static_cast<int>(root), opts);
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

}  // namespace

void bind_sync(py::module_& m) {
  m.def("sync_fast_path",
        [](const std::vector<at::Tensor>& tensors, std::int64_t root, std::int64_t structure_hash,
           bool needs_skeleton, int err, const std::string& err_text, std::int64_t bucket_bytes,
           std::int64_t direct_bytes) {
          env();
          bool done = false;
          Engine::get().run_inline([&] {
            done = fast_path(tensors, root, structure_hash, needs_skeleton, error_class(err),
                             err_text, options(bucket_bytes, direct_bytes));
          });
          return done;
        },
        py::arg("tensors"), py::arg("root_rank"), py::arg("structure_hash"),
        py::arg("needs_skeleton"), py::arg("error_class"), py::arg("error_text"),
        py::arg("bucket_bytes"), py::arg("direct_bytes"), py::call_guard<py::gil_scoped_release>());

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
           const std::string& err_text, std::int64_t bucket_bytes, std::int64_t direct_bytes) {
          env();
          Engine::get().run_inline([&] {
            coalesced_broadcast_checked(tensors, root, error_class(err), err_text,
                                        options(bucket_bytes, direct_bytes));
          });
        },
        py::arg("tensors"), py::arg("root_rank"), py::arg("error_class"), py::arg("error_text"),
        py::arg("bucket_bytes"), py::arg("direct_bytes"), py::call_guard<py::gil_scoped_release>());

  m.def("sync_plan",
        [](const std::vector<at::Tensor>& tensors, std::int64_t bucket_bytes,
           std::int64_t direct_bytes) {
          py::list out;
          for (const auto& s : plan_broadcast(tensors, options(bucket_bytes, direct_bytes))) {
            out.append(py::make_tuple(s.direct, s.members, s.bytes));
          }
          return out;
        },
        py::arg("tensors"), py::arg("bucket_bytes"), py::arg("direct_bytes"));
}

}  // namespace fluxmpi
