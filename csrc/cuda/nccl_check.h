// Turn ncclResult_t and cudaError_t into c10::Error (RuntimeError in Python) whose message
// names the call, this rank and the library's own explanation.
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "runtime/environment.h"

namespace fluxmpi::nccl {

inline int rank_for_message() { return initialized() ? env().rank : -1; }

inline void check_nccl(ncclResult_t rc, const char* what, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  std::string detail;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  // The last error is the specific reason (which peer, which transport); it may also stem
  // from earlier asynchronous work, so it is shown as context only.
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') detail = std::string(" (") + last + ")";
#endif
  TORCH_CHECK(false, "fluxmpi_py: ", what, " failed on rank ", rank_for_message(), ": ",
              ncclGetErrorString(rc), detail);
}

inline void check_cuda(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  cudaGetLastError();  // reset a non-sticky error so that the next CUDA call does not report it
  TORCH_CHECK(false, "fluxmpi_py: ", what, " failed on rank ", rank_for_message(), ": ",
              cudaGetErrorName(rc), ": ", cudaGetErrorString(rc));
}

}  // namespace fluxmpi::nccl

// The expression's text becomes part of the message: "ncclAllReduce(...) failed on rank 3".
#define FLUXMPI_NCCL_CHECK(expr, comm) ::fluxmpi::nccl::check_nccl((expr), #expr, (comm))
#define FLUXMPI_CUDA_CHECK(expr) ::fluxmpi::nccl::check_cuda((expr), #expr)
