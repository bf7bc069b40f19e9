// How many agreements (ops/consensus.h, on any group) this thread took part in. A public call
// that raises on this rank before the count moved never met the other ranks: they wait in the
// call's first agreement, which this rank then enters with the error as its verdict
// (fluxmpi_py/runtime/entry.py). Its own header: consensus.h is included everywhere.
#pragma once

#include <cstdint>

namespace fluxmpi {

std::int64_t thread_agreements();

}  // namespace fluxmpi
