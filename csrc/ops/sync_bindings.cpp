// Placeholder until the component that owns this file lands; it registers nothing yet.
#include "bindings.h"

namespace fluxmpi {
void bind_sync(pybind11::module_& m) {}
}  // namespace fluxmpi
