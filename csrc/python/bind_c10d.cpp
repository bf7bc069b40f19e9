// Python face of the torch.distributed backend (c10d/process_group.h): the constructor that
// fluxmpi_py/c10d.py hands to torch.distributed.Backend.register_backend.
#include "c10d/process_group.h"
#include "python/bindings.h"
#include "runtime/group.h"

namespace py = pybind11;

namespace fluxmpi {

void bind_c10d(py::module_& m) {
  m.def(
      "c10d_backend",
      [](int rank, int size, std::shared_ptr<Group> group) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<C10dBackend>(rank, size, std::move(group));
      },
      py::arg("rank"), py::arg("size"), py::arg("group").none(true) = py::none(),
      py::call_guard<py::gil_scoped_release>(),
      "A torch.distributed Backend over a fluxmpi group (None: the world; Init must have run); "
      "rank and size must be this process's rank in the group and its size");
}

}  // namespace fluxmpi
