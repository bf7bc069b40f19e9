// Python face of the MPI backend's node-aware allreduce options (backend/mpi_hierarchical.h).
#include "backend/mpi_hierarchical.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace fluxmpi {

void bind_hierarchical(py::module_& m) {
  const HierarchicalOptions d;
  py::class_<HierarchicalOptions> cls(
      m, "HierarchicalOptions",
      "How the MPI backend's allreduce runs in jobs spanning hosts with more than one rank on "
      "a host: when the node-aware path runs (bytes), and whether the ring may. Every rank "
      "must use the same values.");
  cls.def(py::init([](bool enabled, std::int64_t min_bytes, std::int64_t max_bytes,
                      bool ring_across_hosts) {
            HierarchicalOptions o;
            o.enabled = enabled;
            o.min_bytes = min_bytes;
            o.max_bytes = max_bytes;
            o.ring_across_hosts = ring_across_hosts;
            return o;
          }),
          py::kw_only(), py::arg("enabled") = d.enabled, py::arg("min_bytes") = d.min_bytes,
          py::arg("max_bytes") = d.max_bytes, py::arg("ring_across_hosts") = d.ring_across_hosts)
      .def_readwrite("enabled", &HierarchicalOptions::enabled, "False: never node-aware")
      .def_readwrite("min_bytes", &HierarchicalOptions::min_bytes,
                     "allreduces of at least this many bytes take the node-aware path")
      .def_readwrite("max_bytes", &HierarchicalOptions::max_bytes,
                     "and of fewer than this many bytes")
      .def_readwrite("ring_across_hosts", &HierarchicalOptions::ring_across_hosts,
                     "whether fluxmpi's ring may run in jobs spanning hosts");
  def_fields(cls, {"enabled", "min_bytes", "max_bytes", "ring_across_hosts"});
  m.def("hierarchical_options", &hierarchical_options,
        "This process's HierarchicalOptions (the defaults, with FLUXMPI_HIERARCHICAL=0 applied)");
  m.def("set_hierarchical_options", &set_hierarchical_options, py::arg("options"),
        "Replace the HierarchicalOptions. Not a collective: call it with the same values on "
        "every rank, between collectives");
  m.def("hierarchical_calls", &hierarchical_calls,
        "How many allreduces this process has sent through the node-aware path (for tests)");
}

}  // namespace fluxmpi
