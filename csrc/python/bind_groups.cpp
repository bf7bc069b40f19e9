// Python face of sub-groups (runtime/group.h): new_group, the Group handle, and the thread's
// current group that the Python wrappers set around a call with group=.
#include "ops/new_group.h"
#include "python/bindings.h"
#include "runtime/group.h"

namespace py = pybind11;

namespace fluxmpi {

void bind_groups(py::module_& m) {
  py::class_<Group, std::shared_ptr<Group>>(m, "GroupHandle")
      .def_property_readonly("ranks", [](const Group& g) { return g.world_ranks(); })
      .def_property_readonly("rank", [](const Group& g) { return g.rank(); })
      .def_property_readonly("size", [](const Group& g) { return g.size(); })
      .def_property_readonly("index", &Group::index)
      .def("describe", &Group::describe)
      .def("check_member", &Group::check_member, py::arg("call"));
  m.def(
      "new_group",
      [](std::vector<int> ranks, bool sort) {
        return std::const_pointer_cast<Group>(make_group(std::move(ranks), sort));
      },
      py::arg("ranks"), py::arg("sort") = true, py::call_guard<py::gil_scoped_release>());
  m.def(
      "new_local_group",
      [](std::vector<int> ranks, bool sort, double timeout_s) {
        return std::const_pointer_cast<Group>(make_local_group(std::move(ranks), sort, timeout_s));
      },
      py::arg("ranks"), py::arg("sort"), py::arg("timeout_s"),
      py::call_guard<py::gil_scoped_release>());
  m.def("current_group", [] { return std::const_pointer_cast<Group>(current_group_ptr()); });
  m.def("world_group", [] { return std::const_pointer_cast<Group>(world_group()); });
  m.def(
      "set_current_group",
      [](std::shared_ptr<Group> g) {
        return std::const_pointer_cast<Group>(exchange_current_group(std::move(g)));
      },
      py::arg("group").none(true));
}

}  // namespace fluxmpi
