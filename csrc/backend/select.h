// Which backend moves a tensor: MPI for host memory, NCCL for CUDA memory when compiled in.
#pragma once

#include <ATen/core/Tensor.h>

#include "backend/backend.h"

namespace fluxmpi {

Backend& backend_for(const at::Tensor& t);

// True when this build can move tensors of this device type.
bool device_supported(const at::Tensor& t);

}  // namespace fluxmpi
