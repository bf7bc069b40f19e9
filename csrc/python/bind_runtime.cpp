// Python face of the runtime: Init, ranks, build information, barrier.
#include <torch/version.h>

#include "backend/mpi_cuda_support.h"
#include "backend/select.h"
#include "backend/staged_backend.h"
#include "ops/collectives.h"
#include "ops/stream_order.h"
#include "python/bindings.h"
#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/exit_report.h"
#include "runtime/fake_streams.h"
#include "runtime/fault_tolerance.h"
#include "runtime/flight.h"
#include "runtime/launcher_notice.h"
#include "runtime/stall_watch.h"
#include "runtime/stop_request.h"
#include "runtime/user_call.h"
#include "runtime/wait_policy.h"

namespace py = pybind11;

namespace fluxmpi {

void bind_runtime(py::module_& m) {
  m.def("init", &init, py::arg("comm_handle") = 0, py::call_guard<py::gil_scoped_release>());
  m.def("initialized", &initialized);
  m.def("shutdown", &shutdown, py::call_guard<py::gil_scoped_release>());
  m.def(
      "abort", [](const std::string& why, int code) { abort_job(why, code); }, py::arg("why"),
      py::arg("code") = 1);
  m.def("meet_before_abort", &meet_before_abort, py::arg("timeout_s"),
        py::call_guard<py::gil_scoped_release>());
  m.def("set_stall_settings", &set_stall_settings, py::arg("warning_s"), py::arg("timeout_s"));
  m.def("set_job_label", &set_job_label, py::arg("label"));
  m.def("report_exit_status_to", &report_exit_status_to, py::arg("fd"));
  m.def("watch_launcher_line", &watch_launcher_line, py::arg("fd"), py::arg("prefix"));
  m.def("stall_settings", [] { return py::make_tuple(stall_warning_s(), stall_timeout_s()); });
  m.def("wait_stack_request", &wait_stack_request, py::call_guard<py::gil_scoped_release>());
  m.def("post_stack", &post_stack, py::arg("stack"), py::arg("site"));
  m.def("set_flight_capacity", &set_flight_capacity, py::arg("slots"));
  m.def("flight_capacity", &flight_capacity);
  m.def(
      "set_flight_dir", [](const std::string& dir) { set_flight_dir(dir, env().rank, env().size); },
      py::arg("dir"));
  m.def("flight_dir", &flight_dir);
  m.def("flight_dump", &flight_dump, py::arg("reason"), py::arg("why") = "");
  m.def("flight_records", [] {
    py::list out;
    for (const FlightRecord& r : flight_records()) {
      py::object end = r.end_us != 0 ? py::object(py::int_(r.end_us)) : py::object(py::none());
      out.append(py::make_tuple(r.seq, r.group, r.number, r.kind, r.call, r.bytes, r.enter_us,
                                r.start_us, end));
    }
    return out;
  });
  // An agreed stop (runtime/stop_request.h): marked on a rank by a signal or request_stop(),
  // agreed by the next world agreement.
  m.def("request_stop", &request_stop);
  m.def("stop_requested_here", &stop_requested_here);
  m.def("stop_agreed", &stop_agreed);
  m.def("stop_agreed_at", &stop_agreed_at);
  m.def("install_stop_signals", &install_stop_signals, py::arg("signals"));
  m.def("arm_stop_signals", &arm_stop_signals, py::arg("armed"));
  m.def("stop_signals_armed", &stop_signals_armed);
  m.def("clear_stop", &clear_stop);
  m.def("enter_user_call", &enter_user_call, py::arg("name"), py::arg("checked") = false);
  m.def("leave_user_call", &leave_user_call, py::arg("entered"));
  // The shrink mode (runtime/fault_tolerance.h).
  py::register_local_exception<RanksLost>(m, "RanksLostError", PyExc_RuntimeError);
  m.def("shrink_mode_unavailable", &shrink_mode_unavailable);
  m.def("set_shrink_mode", &set_shrink_mode, py::arg("on"));
  m.def("shrink_mode", &shrink_mode);
  m.def("agree_on_world", &agree_on_world, py::arg("ok"), py::call_guard<py::gil_scoped_release>());
  m.def("recoveries", &recoveries);
  m.def("shrink_world", [] {
    Recovery r;
    {
      py::gil_scoped_release release;
      r = shrink_world();
    }
    py::dict d;
    d["lost"] = r.lost;
    d["old_rank"] = r.old_rank;
    d["old_size"] = r.old_size;
    d["rank"] = r.rank;
    d["size"] = r.size;
    d["attempts"] = r.attempts;
    d["seconds"] = r.seconds;
    d["refused"] = r.refused;
    return d;
  });
  m.def("quorum_refusal", &quorum_refusal, py::arg("old_size"), py::arg("lost"));
  m.def("rank", [] { return env().rank; });
  m.def("size", [] { return env().size; });
  m.def("node_rank", [] { return env().node_rank; });
  m.def("node_size", [] { return env().node_size; });
  m.def("thread_level", [] { return env().thread_level; });
  m.def("mpi_library_version", &mpi_library_version);
  m.def("wait_policy", [] { return wait_policy(); });
  m.def("mpi_standard_version", &mpi_standard_version);
  m.def("compiled_with_cuda", &compiled_with_cuda);
  m.def("nccl_version", &nccl_version);
  m.def("cuda_schedule", &cuda_schedule, py::arg("mode") = std::string(),
        py::call_guard<py::gil_scoped_release>());
  m.def("_abort_nccl_comms_for_test", &abort_nccl_comms_for_test);
  m.def("mpi_cuda_support", &mpi_cuda_support);
  m.def("set_cuda_refusal", &set_cuda_refusal, py::arg("why"));
  m.def("cuda_refusal", &cuda_refusal);
  m.def("set_cuda_mpi_allowed", &set_cuda_mpi_allowed, py::arg("on"));
  m.def("cuda_mpi_allowed", &cuda_mpi_allowed);
  m.def("set_cuda_over_mpi", &set_cuda_over_mpi, py::arg("on"));
  m.def("cuda_over_mpi", &cuda_over_mpi);
  m.def("set_nccl_comm_stream", &set_nccl_comm_stream, py::arg("on"));
  m.def("nccl_comm_stream", &nccl_comm_stream);
  m.def("set_nccl_host_wait", &set_nccl_host_wait, py::arg("on"));
  m.def("nccl_host_wait", &nccl_host_wait);
  m.def("set_stream_waits", &set_stream_waits, py::arg("on"));
  m.def("stream_waits", &stream_waits);
  m.def("set_nccl_groups", &set_nccl_groups, py::arg("on"));
  m.def("nccl_groups", &nccl_groups);
  m.def("set_stage_host", &set_stage_host, py::arg("on"));
  m.def("staged_host_bytes", &staged_host_bytes);
  m.def("stream_order_probe", &stream_order_probe, py::arg("producer_wait"),
        py::arg("consumer_wait"), py::arg("timeout_s") = 30.0,
        py::call_guard<py::gil_scoped_release>(),
        "runtime/comm_stream_order.h's ordering over a fake asynchronous device: what the consumer "
        "read (14 when ordered; for tests)");
  m.attr("compiled_torch_version") = TORCH_VERSION;
  m.def(
      "barrier",
      [] {
        UserCall named("barrier()");
        Engine::get().run_inline(barrier_checked);
      },
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace fluxmpi
