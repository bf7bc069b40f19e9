// Python face of the pack plan (fusion/pack_plan.h) and of pack/unpack (ops/bucket_pack.h),
// which tests call without Init to check every dtype, scale and cast against torch.
#include <pybind11/stl.h>

#include "fusion/pack_plan.h"
#include "ops/bucket_pack.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace fluxmpi {

void bind_pack(py::module_& m) {
  py::class_<PackPlan>(m, "PackPlan",
                       "Where each tensor goes in a flat buffer, with what scale and cast")
      .def_readonly("wire", &PackPlan::wire, "the flat buffer's dtype")
      .def_readonly("numel", &PackPlan::numel, "the flat buffer's length (elements)")
      .def_property_readonly(
          "entries",
          [](const PackPlan& p) {
            py::list out;
            for (const auto& e : p.entries) {
              py::dict d;
              d["member"] = e.member;
              d["offset"] = e.offset;
              d["numel"] = e.numel;
              d["dtype"] = e.dtype;
              d["scale"] = e.scale;
              d["unscale"] = e.unscale;
              out.append(d);
            }
            return out;
          },
          "one dict per packed tensor (member, offset, numel, dtype, scale, unscale)")
      .def("__repr__", [](const PackPlan& p) {
        return "PackPlan(wire=" + std::string(dtype_short_name(p.wire)) +
               ", numel=" + std::to_string(p.numel) + ")\n" + describe(p);
      });

  m.def(
      "plan_pack",
      [](const std::vector<at::Tensor>& tensors, at::ScalarType wire,
         const std::optional<std::vector<double>>& scales, std::int64_t align, double unscale) {
        TORCH_CHECK_VALUE(!scales || scales->size() == tensors.size(),
                          "plan_pack: ", scales ? scales->size() : 0, " scales for ",
                          tensors.size(), " tensors");
        std::vector<PackSource> sources;
        sources.reserve(tensors.size());
        for (std::size_t i = 0; i < tensors.size(); ++i) {
          sources.push_back(
              {tensors[i].scalar_type(), tensors[i].numel(), scales ? (*scales)[i] : 1.0});
        }
        return plan_pack(sources, wire, align, unscale);
      },
      py::arg("tensors"), py::arg("wire"), py::arg("scales") = py::none(), py::arg("align") = 1,
      py::arg("unscale") = 1.0,
      "The pack plan for tensors' dtypes and sizes into a `wire` buffer. Pure: needs no Init");
  m.def("pack", &pack, py::arg("plan"), py::arg("tensors"), py::arg("flat"),
        "Pack tensors into flat (scaled, cast to plan.wire) as the plan says. Needs no Init");
  m.def("unpack", &unpack, py::arg("plan"), py::arg("flat"), py::arg("tensors"),
        "Unpack flat into tensors (cast back, times unscale) as the plan says. Needs no Init");
}

}  // namespace fluxmpi
