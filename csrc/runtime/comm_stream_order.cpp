#include "runtime/comm_stream_order.h"

#include <atomic>

namespace fluxmpi {
namespace {

std::atomic<bool> g_stream_waits{true};

}  // namespace

void set_stream_waits(bool on) { g_stream_waits = on; }

bool stream_waits() { return g_stream_waits; }

}  // namespace fluxmpi
