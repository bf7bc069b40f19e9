// Python face of the row collectives and grouped forms (ops/gather_collectives.h) and of the
// object collectives' bytes (ops/object_collectives.h). Every tensor call returns a
// PendingTensors: finished already when `async_op` is false, else running on the engine.
#include <memory>
#include <optional>

#include <torch/csrc/autograd/python_variable.h>

#include "ops/consensus.h"
#include "ops/gather_collectives.h"
#include "ops/object_collectives.h"
#include "ops/stream_order.h"
#include "python/bindings.h"
#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/user_call.h"

namespace py = pybind11;

namespace fluxmpi {

namespace {

// The handle of one call: its Work and, once done, its result tensors and (alltoall,
// allgather) the row counts received from each rank, per tensor.
struct PendingTensors {
  std::shared_ptr<Work> work;
  std::shared_ptr<std::vector<at::Tensor>> tensors = std::make_shared<std::vector<at::Tensor>>();
  std::shared_ptr<Splits> received = std::make_shared<Splits>();
  // The grouped calls' input list, released with the handle (under the GIL), not by the
  // engine thread when an async call's job ends: each tensor would take the GIL back there.
  std::shared_ptr<const std::vector<at::Tensor>> inputs;
};

using Body = std::function<void(std::vector<at::Tensor>&, Splits&)>;
using Tensors = std::vector<at::Tensor>;

// The tensors of a Python list or tuple, checked at C speed (a Python isinstance loop costs
// about 60 ns a tensor, a grouped call of 1000 tensors 60 us): an item that is not a tensor
// becomes `err`, which the agreement raises on every rank, and the list comes back empty.
// Needs the GIL.
Tensors tensor_list(const py::handle& seq, std::string& err) {
  Tensors out;
  auto type_name = [](const py::handle& o) {
    return py::type::handle_of(o).attr("__name__").cast<std::string>();
  };
  if (!PyList_Check(seq.ptr()) && !PyTuple_Check(seq.ptr())) {
    err = "tensors must be a list of torch.Tensor, got " + type_name(seq);
    return out;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  out.reserve(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPVariable_Check(items[i])) {
      err = "tensors[" + std::to_string(i) + "] must be a torch.Tensor, got " +
            type_name(py::handle(items[i]));
      out.clear();
      return out;
    }
    out.push_back(THPVariable_Unpack(items[i]));
  }
  return out;
}

// The caller's error text and this binding's, joined.
std::string joined(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + "; " + b;
}

// How a rank's description in a disagreement names the differentiable form (static: the
// hot single-tensor calls pass it too, at no cost).
const std::string& grad_text(bool grad) {
  static const std::string yes = kRequiringGradText;
  static const std::string no = kNotRequiringGradText;
  return grad ? yes : no;
}

// One tensor in, one tensor out, blocking: the hot single-tensor calls skip the handle, the
// Work and the list conversions of start() (a few microseconds a call).
template <typename Fn>
at::Tensor now(const char* call, Fn fn) {
  env();
  UserCall named(call);
  at::Tensor out;
  Engine::get().run_inline([&] { out = fn(); });
  return out;
}

// Run `body` under the user call's name: inline (blocking), or queued on the engine. Queued
// with device `inputs`, it is ordered against the caller's streams as Iallreduce is
// (ops/stream_order.h): the engine's stream waits for the caller's current stream at the
// call, and wait() makes the waiter's stream wait for the end and marks the results as used
// there.
PendingTensors start(const std::string& call, bool async_op, const Tensors& inputs, Body body) {
  env();
  const char* name = intern_call_name(call);
  UserCall named(name);
  PendingTensors p;
  auto out = p.tensors;
  auto rec = p.received;
  if (async_op) {
    p.work = submit_ordered(call, inputs, [out, rec, body] { body(*out, *rec); }, out);
    return p;
  }
  Engine::get().run_inline([&] { body(*out, *rec); });
  p.work = std::make_shared<Work>(call);
  p.work->finish(nullptr);
  return p;
}

}  // namespace

void bind_gather_collectives(py::module_& m) {
  py::class_<PendingTensors>(m, "PendingTensors")
      .def(
          "wait",
          [](const PendingTensors& p) {
            {
              py::gil_scoped_release no_gil;
              p.work->wait();
            }
            return *p.tensors;
          },
          "Block until done; the result tensors")
      .def("test", [](const PendingTensors& p) { return p.work->test(); })
      .def_property_readonly("received_splits", [](const PendingTensors& p) { return *p.received; })
      .def_property_readonly("what", [](const PendingTensors& p) { return p.work->what(); });

  const auto release = py::call_guard<py::gil_scoped_release>();
  // `grad` (allgather, gather, scatter, reduce_scatter, alltoall): the differentiable form
  // (fluxmpi_py.differentiable), whose backward is a collective too: the ranks agree on it
  // with the rest, so that a rank whose input does not require grad raises with the others
  // here, not hangs them in backward.
  m.def(
      "allgather",
      [](Tensors ts, const std::string& call, bool async_op, const std::string& err, bool grad) {
        return start(call, async_op, ts, [ts, err, grad](Tensors& out, Splits& rows) {
          out = allgather_checked(ts, err, &rows, grad ? 1 : 0, grad_text(grad));
        });
      },
      py::arg("tensors"), py::arg("call"), py::arg("async_op"), py::arg("local_error") = "",
      py::arg("grad") = false, release);
  m.def(
      "gather",
      [](Tensors ts, std::int64_t root, const std::string& call, bool async_op,
         const std::string& err, bool grad) {
        return start(call, async_op, ts, [ts, root, err, grad](Tensors& out, Splits& rows) {
          out = gather_checked(ts, root, err, &rows, grad ? 1 : 0, grad_text(grad));
        });
      },
      py::arg("tensors"), py::arg("root_rank"), py::arg("call"), py::arg("async_op"),
      py::arg("local_error") = "", py::arg("grad") = false, release);
  m.def(
      "scatter",
      [](Tensors ts, Splits splits, std::int64_t root, const std::string& call, bool async_op,
         const std::string& err, bool grad) {
        return start(call, async_op, ts, [ts, splits, root, err, grad](Tensors& out, Splits&) {
          out = scatter_checked(ts, splits, root, err, grad ? 1 : 0, grad_text(grad));
        });
      },
      py::arg("tensors"), py::arg("splits"), py::arg("root_rank"), py::arg("call"),
      py::arg("async_op"), py::arg("local_error") = "", py::arg("grad") = false, release);
  m.def(
      "reduce_scatter",
      [](Tensors ts, const std::string& op, Splits splits, const std::string& call, bool async_op,
         const std::string& err, bool grad) {
        return start(call, async_op, ts, [ts, op, splits, err, grad](Tensors& out, Splits&) {
          out = reduce_scatter_checked(ts, op, splits, err, grad ? 1 : 0, grad_text(grad));
        });
      },
      py::arg("tensors"), py::arg("op"), py::arg("splits"), py::arg("call"), py::arg("async_op"),
      py::arg("local_error") = "", py::arg("grad") = false, release);
  m.def(
      "alltoall",
      [](Tensors ts, Splits splits, const std::string& call, bool async_op, const std::string& err,
         bool grad) {
        return start(call, async_op, ts, [ts, splits, err, grad](Tensors& out, Splits& received) {
          out = alltoall_checked(ts, splits, &received, err, grad ? 1 : 0, grad_text(grad));
        });
      },
      py::arg("tensors"), py::arg("splits"), py::arg("call"), py::arg("async_op"),
      py::arg("local_error") = "", py::arg("grad") = false, release);
  // In place: the result is the caller's own list, so the handle returns no tensors (turning
  // a thousand tensors back into Python objects would cost more than the checks).
  m.def(
      "grouped_allreduce_",
      [](const py::object& tensors, const std::string& op, const std::string& call, bool async_op,
         const std::string& local_error) {
        std::string err;
        // Held here too, so that a blocking call drops its references with the GIL held (below
        // no_gil): dropping a Python tensor's reference without it takes the GIL for each one.
        auto ts = std::make_shared<const Tensors>(tensor_list(tensors, err));
        err = joined(local_error, err);
        py::gil_scoped_release no_gil;
        auto p = start(call, async_op, *ts, [ts, op, err](Tensors&, Splits&) {
          grouped_allreduce_checked(*ts, op, err);
        });
        p.inputs = ts;
        return p;
      },
      py::arg("tensors"), py::arg("op"), py::arg("call"), py::arg("async_op"),
      py::arg("local_error") = "");
  m.def(
      "grouped_bcast_",
      [](const py::object& tensors, std::int64_t root, const std::string& call, bool async_op,
         const std::string& local_error) {
        std::string err;
        auto ts = std::make_shared<const Tensors>(tensor_list(tensors, err));  // as above
        err = joined(local_error, err);
        py::gil_scoped_release no_gil;
        auto p = start(call, async_op, *ts, [ts, root, err](Tensors&, Splits&) {
          grouped_broadcast_checked(*ts, root, err);
        });
        p.inputs = ts;
        return p;
      },
      py::arg("tensors"), py::arg("root_rank"), py::arg("call"), py::arg("async_op"),
      py::arg("local_error") = "");
  // The blocking single-tensor forms with equal splits (fluxmpi_py/collectives/rows.py
  // takes them when no group, autograd or async is involved).
  m.def(
      "allgather_tensor",
      [](const at::Tensor& t) {
        return now("allgather()",
                   [&] { return allgather_checked({t}, {}, nullptr, 0, grad_text(false))[0]; });
      },
      py::arg("tensor"), release);
  m.def(
      "reduce_scatter_tensor",
      [](const at::Tensor& t, const std::string& op) {
        return now("reduce_scatter()",
                   [&] { return reduce_scatter_checked({t}, op, {}, {}, 0, grad_text(false))[0]; });
      },
      py::arg("tensor"), py::arg("op"), release);
  m.def(
      "alltoall_tensor",
      [](const at::Tensor& t) {
        return now("alltoall()",
                   [&] { return alltoall_checked({t}, {}, nullptr, {}, 0, grad_text(false))[0]; });
      },
      py::arg("tensor"), release);

  // The root passes its pickle and gets None back; the other ranks pass None and get the
  // root's bytes.
  m.def(
      "broadcast_object_bytes",
      [](std::optional<std::string> data, std::int64_t root,
         const std::string& err) -> std::optional<py::bytes> {
        std::string out;
        bool is_root = false;
        {
          py::gil_scoped_release no_gil;
          env();
          UserCall named("broadcast_object()");
          is_root = current_group().rank() == root;
          const std::string& mine = data ? *data : std::string();
          Engine::get().run_inline([&] { out = broadcast_object_bytes(mine, root, err); });
        }
        if (is_root) return std::nullopt;
        return py::bytes(out);
      },
      py::arg("data"), py::arg("root_rank"), py::arg("local_error") = "");
  m.def(
      "allgather_object_bytes",
      [](const std::string& data, const std::string& err) {
        std::vector<std::string> out;
        {
          py::gil_scoped_release no_gil;
          env();
          UserCall named("allgather_object()");
          Engine::get().run_inline([&] { out = allgather_object_bytes(data, err); });
        }
        py::list result;
        for (const auto& s : out) result.append(py::bytes(s));
        return result;
      },
      py::arg("data"), py::arg("local_error") = "");
}

}  // namespace fluxmpi
