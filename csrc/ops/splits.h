// The row counts of a row collective (ops/gather_collectives.h), shared with its helpers.
#pragma once

#include <cstdint>
#include <vector>

namespace fluxmpi {

// Row counts per rank for each tensor of a call: splits[i][r] rows of tensor i belong to rank
// r (their sum is dim 0). An empty list, or an empty entry, means equal parts: dim 0 must
// then divide by the world size.
using Splits = std::vector<std::vector<std::int64_t>>;

}  // namespace fluxmpi
