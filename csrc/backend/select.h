// Which backend moves a tensor: MPI for host memory, NCCL for CUDA memory when compiled in.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "backend/backend.h"

namespace fluxmpi {

Backend& backend_for(const at::Tensor& t);

// True when this build can move tensors of this device type.
bool device_supported(const at::Tensor& t);

// Whether this build has the NCCL backend (compiled with FLUXMPI_WITH_CUDA).
bool compiled_with_cuda();

// Version of the NCCL library loaded at run time, "major.minor.patch"; "" without CUDA.
std::string nccl_version();

}  // namespace fluxmpi
