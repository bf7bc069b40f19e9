#include "ops/stream_order.h"

#include <c10/core/impl/VirtualGuardImpl.h>

namespace fluxmpi {

namespace {

c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace

StreamMark::StreamMark(c10::Device device) : device_(device), event_(device.type()) {}

void StreamMark::record_on_current_stream() { event_.record(current_stream(device_)); }

void StreamMark::make_current_stream_wait() const { event_.block(current_stream(device_)); }

std::shared_ptr<StreamMark> stream_mark_for(c10::Device device) {
  if (device.is_cpu()) return nullptr;
  return std::make_shared<StreamMark>(device);
}

}  // namespace fluxmpi
