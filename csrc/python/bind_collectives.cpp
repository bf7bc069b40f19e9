// Python face of the tensor collectives (ops/collectives.h) and of the MPI ring's options
// (backend/mpi_ring.h).
#include <optional>
#include <tuple>

#include "backend/mpi_direct_slots.h"
#include "backend/mpi_ring.h"
#include "backend/mpi_shared_pieces.h"
#include "ops/agreement_count.h"
#include "ops/carried.h"
#include "ops/collectives.h"
#include "ops/gather_collectives.h"
#include "ops/join.h"
#include "ops/stream_order.h"
#include "python/bindings.h"
#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/user_call.h"

namespace py = pybind11;

namespace fluxmpi {

namespace {

void bind_ring_options(py::module_& m) {
  const RingOptions d;
  py::class_<RingOptions> cls(m, "RingOptions",
                              "When the MPI backend's ring allreduce runs and how it cuts its "
                              "messages (bytes). Every rank must use the same values.");
  cls.def(py::init([](bool enabled, std::int64_t sum_min_bytes, std::int64_t average_min_bytes,
                      std::int64_t min_segment_bytes, std::int64_t max_segment_bytes,
                      std::int64_t list_min_bytes, bool list_shared_memory) {
            RingOptions o;
            o.enabled = enabled;
            o.sum_min_bytes = sum_min_bytes;
            o.average_min_bytes = average_min_bytes;
            o.min_segment_bytes = min_segment_bytes;
            o.max_segment_bytes = max_segment_bytes;
            o.list_min_bytes = list_min_bytes;
            o.list_shared_memory = list_shared_memory;
            return o;
          }),
          py::kw_only(), py::arg("enabled") = d.enabled, py::arg("sum_min_bytes") = d.sum_min_bytes,
          py::arg("average_min_bytes") = d.average_min_bytes,
          py::arg("min_segment_bytes") = d.min_segment_bytes,
          py::arg("max_segment_bytes") = d.max_segment_bytes,
          py::arg("list_min_bytes") = d.list_min_bytes,
          py::arg("list_shared_memory") = d.list_shared_memory)
      .def_readwrite("enabled", &RingOptions::enabled, "False: MPI_Allreduce always")
      .def_readwrite("sum_min_bytes", &RingOptions::sum_min_bytes,
                     "float/double sums of at least this many bytes take the ring")
      .def_readwrite("average_min_bytes", &RingOptions::average_min_bytes,
                     "averages of at least this many bytes (or sum_min_bytes) take the ring")
      .def_readwrite("min_segment_bytes", &RingOptions::min_segment_bytes,
                     "a chunk moves in segments of a quarter chunk, at least this large")
      .def_readwrite("max_segment_bytes", &RingOptions::max_segment_bytes, "and at most this large")
      .def_readwrite("list_min_bytes", &RingOptions::list_min_bytes,
                     "grouped allreduces whose tensors of one dtype total at least this many "
                     "bytes reduce them where they lie (no pack, no unpack)")
      .def_readwrite("list_shared_memory", &RingOptions::list_shared_memory,
                     "such lists, and reduce-scatters of 128 KiB and more, move through shared "
                     "memory when every rank is on one host; False: through the ring over MPI "
                     "datatypes, and MPI_Reduce_scatter");
  def_fields(cls, {"enabled", "sum_min_bytes", "average_min_bytes", "min_segment_bytes",
                   "max_segment_bytes", "list_min_bytes", "list_shared_memory"});
  m.def("ring_options", &ring_options,
        "This process's RingOptions (the defaults, with FLUXMPI_RING_MIN_BYTES applied)");
  m.def("set_ring_options", &set_ring_options, py::arg("options"),
        "Replace the RingOptions. Not a collective: call it with the same values on every rank, "
        "between collectives (ranks that disagree wait for each other forever)");
  m.def("ring_calls", &ring_calls,
        "How many allreduces this process has sent through the ring, flat or over a grouped "
        "call's tensors (for tests)");
  m.def(
      "set_sum_order", [](const std::string& order) { set_sum_order(parse_sum_order(order)); },
      py::arg("order"),
      "'fastest' or 'gloo' (ValueError otherwise): the order of float sums over 3 or more ranks "
      "in allreduce_ and torch.distributed.all_reduce (backend/mpi_ring.h). Not a collective");
  m.def(
      "sum_order", [] { return std::string(sum_order_name(sum_order())); },
      "This process's sum order: FLUXMPI_SUM_ORDER on first use, until set_sum_order");
  m.def("gloo_order_calls", &gloo_order_calls,
        "How many sums this process has added in gloo's order (for tests)");
  m.def("shared_reduce_scatter_calls", &shared_reduce_scatter_calls,
        "How many reduce-scatters this process has sent through shared memory (for tests)");
  m.def("shared_owner_parts_calls", &shared_owner_parts_calls,
        "How many owner reductions (the deterministic optimizer's buckets) this process has "
        "sent through shared memory (for tests)");
  m.def("carried_calls", &carried_calls,
        "How many calls this process sent with their data in their agreement's message, one "
        "round trip in all (ops/carried.h) (for tests)");
  m.def("direct_agreements", &direct_agreements,
        "How many agreements this process made point to point, a small group's way "
        "(backend/direct.h) (for tests)");
  m.def("direct_slot_writes", &direct_slot_writes,
        "How many payloads of point-to-point agreements this process wrote into shared-memory "
        "slots instead of messages (backend/mpi_direct_slots.h) (for tests)");
  m.def("alltoall_block_calls", &alltoall_block_calls,
        "How many alltoalls this process has sent as MPI_Alltoall, every part one length "
        "(for tests)");
}

}  // namespace

void bind_collectives(py::module_& m) {
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", &Work::wait, py::call_guard<py::gil_scoped_release>())
      .def("test", &Work::test)
      .def_property_readonly("what", &Work::what);

  // The tensor may be None: the Python wrapper passes None and a `local_error` for a
  // non-tensor argument, so that every rank raises, not only the one that got it wrong.
  using MaybeTensor = std::optional<at::Tensor>;
  m.def(
      "allreduce_",
      [](const MaybeTensor& t, const std::string& op, const std::string& err) {
        env();
        UserCall named("allreduce_()");
        at::Tensor x = t.value_or(at::Tensor());
        Engine::get().run_inline([&] { allreduce_checked(x, op, err); });
      },
      py::arg("tensor"), py::arg("op"), py::arg("local_error") = "",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "bcast_",
      [](const MaybeTensor& t, std::int64_t root, const std::string& err) {
        env();
        UserCall named("bcast_()");
        at::Tensor x = t.value_or(at::Tensor());
        Engine::get().run_inline([&] { broadcast_checked(x, root, err); });
      },
      py::arg("tensor"), py::arg("root_rank"), py::arg("local_error") = "",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "reduce_",
      [](const MaybeTensor& t, const std::string& op, std::int64_t root, const std::string& err) {
        env();
        UserCall named("reduce_()");
        at::Tensor x = t.value_or(at::Tensor());
        Engine::get().run_inline([&] { reduce_checked(x, op, root, err); });
      },
      py::arg("tensor"), py::arg("op"), py::arg("root_rank"), py::arg("local_error") = "",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "iallreduce_",
      [](const MaybeTensor& t, const std::string& op, const std::string& err) {
        env();
        UserCall named("Iallreduce()");
        at::Tensor x = t.value_or(at::Tensor());
        return submit_ordered("Iallreduce", {x}, [x, op, err] { allreduce_checked(x, op, err); });
      },
      py::arg("tensor"), py::arg("op"), py::arg("local_error") = "",
      py::call_guard<py::gil_scoped_release>());  // a synchronous engine runs it right here
  m.def(
      "ibcast_",
      [](const MaybeTensor& t, std::int64_t root, const std::string& err) {
        env();
        UserCall named("Ibcast()");
        at::Tensor x = t.value_or(at::Tensor());
        return submit_ordered("Ibcast", {x}, [x, root, err] { broadcast_checked(x, root, err); });
      },
      py::arg("tensor"), py::arg("root_rank"), py::arg("local_error") = "",
      py::call_guard<py::gil_scoped_release>());

  m.def(
      "join_round",
      [](std::int64_t index) {
        env();
        JoinRound r;
        Engine::get().run_inline([&] { r = join_round(index); });
        return std::make_tuple(r.count, r.same_index);  // converted once the GIL is back
      },
      py::arg("index"), py::call_guard<py::gil_scoped_release>(),
      "An active rank's join round before a step of optimizer `index` (ops/join.h): "
      "(active ranks, whether every active rank gave the same index)");
  m.def(
      "join_wait",
      [](bool rigid, bool first, bool beside) {
        env();
        JoinEvent ev;
        if (!beside) {
          Engine::get().run_inline([&] { ev = join_wait(rigid, first); });
        } else {
          // hvd.join() waits on the world and on each of its process sets at once, one thread
          // and communicator each (MPI_THREAD_MULTIPLE). None of them may hold the engine
          // while it waits, or the optimizer steps shadowed on another thread could not run;
          // earlier work still goes first.
          TORCH_CHECK(env().thread_level >= MPI_THREAD_MULTIPLE,
                      "hvd.join(): waiting on process sets needs MPI_THREAD_MULTIPLE; this MPI "
                      "runs at thread level ",
                      env().thread_level);
          Engine::get().run_inline([] {});
          ev = join_wait(rigid, first);
        }
        return std::make_tuple(ev.count, ev.index, ev.same_index, ev.last_rank);
      },
      py::arg("rigid"), py::arg("first"), py::arg("beside") = false,
      py::call_guard<py::gil_scoped_release>(),
      "A joined rank's wait on the current group (ops/join.h): (active ranks in the round that "
      "ended it, or 0 when every member has joined; the round's optimizer index; whether the "
      "active ranks agreed on it; the last rank to join, when all have, on the world). "
      "`beside`: other waits of the same join run on other threads (the engine is not held)");
  m.def("world_agreements", &world_agreements,
        "How many world agreements (the check every collective starts with) this process took "
        "part in: the same on every rank at the same point of the program (for tests)");
  m.def("thread_agreements", &thread_agreements,
        "How many agreements (on any group) this thread took part in: a public call that "
        "raises before the count moved has not met the other ranks yet");
  bind_ring_options(m);
}

}  // namespace fluxmpi
