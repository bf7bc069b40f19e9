// Each component registers its Python functions on the one extension module, fluxmpi_py._C.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace fluxmpi {

void bind_runtime(pybind11::module_& m);      // bindings.cpp: Init, ranks, build info
void bind_collectives(pybind11::module_& m);  // bindings.cpp: allreduce_, bcast_, reduce_, async
void bind_gradients(pybind11::module_& m);    // ops/gradient_bindings.cpp: DistributedOptimizer
void bind_sync(pybind11::module_& m);         // ops/sync_bindings.cpp: synchronize_
void bind_shard(pybind11::module_& m);        // ops/shard_bindings.cpp: DistributedDataContainer

}  // namespace fluxmpi
