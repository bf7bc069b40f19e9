// The Python face of the C++ core: each component registers its names on the one extension
// module, fluxmpi_py._C (python/module.cpp). Files here only convert arguments, results and
// errors; the logic they call lives in ops/, fusion/, backend/ and runtime/.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

namespace fluxmpi {

void bind_runtime(pybind11::module_& m);      // bind_runtime.cpp: Init, ranks, build info, barrier
void bind_collectives(pybind11::module_& m);  // bind_collectives.cpp: allreduce_, bcast_, reduce_,
                                              // async forms, ring options
void bind_gradients(pybind11::module_& m);    // bind_gradients.cpp: reducer and bucket planner
void bind_sync(pybind11::module_& m);         // bind_sync.cpp: synchronize_, broadcast planner
void bind_shard(pybind11::module_& m);        // bind_shard.cpp: DistributedDataContainer
void bind_consistency(pybind11::module_& m);  // bind_consistency.cpp: tensor content digests

// bind_gather_collectives.cpp: allgather .. alltoall, grouped forms, objects
void bind_gather_collectives(pybind11::module_& m);
void bind_groups(pybind11::module_& m);  // bind_groups.cpp: new_group, current group
void bind_pack(pybind11::module_& m);    // bind_pack.cpp: pack plan, pack, unpack
void bind_hierarchical(
    pybind11::module_& m);             // bind_hierarchical.cpp: node-aware allreduce options
void bind_c10d(pybind11::module_& m);  // bind_c10d.cpp: the torch.distributed backend

// Gives a bound options struct the rest of a keyword class: a __repr__ that shows `fields`
// (Python attribute names, in order) as "Name(a=1, b=True)", and __eq__ over the same fields.
template <typename Class>
void def_fields(Class& cls, std::vector<const char*> fields) {
  namespace py = pybind11;
  cls.def("__repr__", [fields](const py::object& self) {
    std::string out = py::str(py::type::handle_of(self).attr("__name__")).cast<std::string>();
    out += "(";
    for (std::size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) out += ", ";
      out += fields[i];
      out += "=";
      out += py::repr(self.attr(fields[i])).cast<std::string>();
    }
    return out + ")";
  });
  cls.def("__eq__", [fields](const py::object& self, const py::object& other) -> py::object {
    if (!py::type::handle_of(self).is(py::type::handle_of(other))) {
      return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    }
    for (const char* f : fields) {
      if (!self.attr(f).equal(other.attr(f))) return py::bool_(false);
    }
    return py::bool_(true);
  });
}

}  // namespace fluxmpi
