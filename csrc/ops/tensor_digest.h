// Content digests of tensors for check_consistency: one 63-bit hash per tensor of its dtype,
// shape and bytes, so that ranks holding bit-identical tensors get equal digests and any
// differing bit (almost surely) changes the digest. No MPI: the comparison is the caller's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fluxmpi {

// The digest of each tensor, in order. CPU tensors are read in place when contiguous (else
// through a contiguous copy); tensors on other devices are copied to the host first.
std::vector<std::int64_t> tensor_digests(const std::vector<at::Tensor>& tensors);

}  // namespace fluxmpi
