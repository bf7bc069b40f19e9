// check_consistency's compiled half: the content digest of each tensor (ops/tensor_digest).
#include "ops/tensor_digest.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace fluxmpi {

void bind_consistency(py::module_& m) {
  m.def("tensor_digests", &tensor_digests, py::arg("tensors"),
        py::call_guard<py::gil_scoped_release>(),
        "A 63-bit hash of each tensor's dtype, shape and bytes, in order (equal on every rank "
        "for bit-identical tensors)");
}

}  // namespace fluxmpi
