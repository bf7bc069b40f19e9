#include "ops/stream_order.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include "backend/select.h"

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

CommStreamScope::CommStreamScope(c10::Device device) {
  if (auto s = comm_stream_of(device)) guard_.emplace(*s);
}

StreamHandOff::StreamHandOff(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
  for (const auto& t : tensors_) {
    if (t.defined() && !t.is_cpu() && !t.is_meta()) {
      device_ = t.device();
      produced_ = stream_mark_for(device_);
      done_ = stream_mark_for(device_);
      produced_->record_on_current_stream();
      return;
    }
  }
}

void StreamHandOff::run(const std::function<void()>& work) const {
  if (!produced_) return work();
  CommStreamScope on_comm(device_);
  produced_->make_current_stream_wait();
  work();
  done_->record_on_current_stream();
  const c10::Stream here = current_stream(device_);
  for (const auto& t : tensors_) {
    if (t.defined() && t.device() == device_) t.record_stream(here);
  }
}

void StreamHandOff::consume() const {
  if (done_) done_->make_current_stream_wait();
}

}  // namespace fluxmpi
