// Python face of the gradient reducer: fluxmpi_py._C.GradientReducer.
#include <pybind11/stl.h>

#include "bindings.h"
#include "ops/gradient_reducer.h"

namespace py = pybind11;

namespace fluxmpi {

void bind_gradients(py::module_& m) {
  py::class_<GradientReducer, std::shared_ptr<GradientReducer>>(m, "GradientReducer")
      .def(py::init([](std::vector<at::Tensor> params, std::int64_t cap_bytes,
                       std::int64_t direct_min_bytes, const std::string& op,
                       const std::string& compression, std::int64_t plan_hash) {
             ReducerOptions o;
             o.plan.cap_bytes = cap_bytes;
             o.plan.direct_min_bytes = direct_min_bytes;
             o.op = parse_op(op);
             if (compression == "fp16" || compression == "float16") {
               o.compression = c10::kHalf;
             } else if (compression == "bf16" || compression == "bfloat16") {
               o.compression = c10::kBFloat16;
             } else {
               TORCH_CHECK_VALUE(compression.empty() || compression == "none",
                                 "compression must be None, 'fp16' or 'bf16', got '",
                                 compression, "'");
             }
             o.plan_hash = plan_hash;
             return std::make_shared<GradientReducer>(std::move(params), o);
           }),
           py::arg("params"), py::arg("cap_bytes"), py::arg("direct_min_bytes"),
           py::arg("op"), py::arg("compression"), py::arg("plan_hash"))
      .def("mark_ready", &GradientReducer::mark_ready, py::arg("index"))
      .def("finalize", &GradientReducer::finalize, py::arg("flag") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("watch_requires_grad", &GradientReducer::watch_requires_grad, py::arg("tensors"))
      .def("requires_grad_changed", &GradientReducer::requires_grad_changed)
      .def_property_readonly("launched_early", &GradientReducer::launched_early)
      .def("plan", [](const GradientReducer& r) {
        py::list out;
        for (const auto& b : r.plan()) {
          py::dict d;
          d["members"] = b.members;
          d["direct"] = b.direct;
          d["numel"] = b.numel;
          d["dtype"] = std::string(c10::toString(b.dtype));
          d["device"] = b.device.str();
          out.append(d);
        }
        return out;
      });
}

}  // namespace fluxmpi
