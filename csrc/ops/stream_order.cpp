#include "ops/stream_order.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include "backend/select.h"
#include "runtime/engine.h"

namespace fluxmpi {

namespace {

c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace

StreamMark::StreamMark(c10::Device device) : device_(device), event_(device.type()) {}

void StreamMark::record_on_current_stream() { event_.record(current_stream(device_)); }

void StreamMark::make_current_stream_wait() const {
  if (stream_waits()) event_.block(current_stream(device_));
}

std::shared_ptr<StreamMark> stream_mark_for(c10::Device device) {
  if (device.is_cpu()) return nullptr;
  return std::make_shared<StreamMark>(device);
}

CommStreamScope::CommStreamScope(c10::Device device) {
  if (auto s = comm_stream_of(device)) guard_.emplace(*s);
}

namespace {

const at::Tensor* first_on_device(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined() && !t.is_cpu() && !t.is_meta()) return &t;
  }
  return nullptr;
}

}  // namespace

bool StreamHandOff::needed(const std::vector<at::Tensor>& tensors) {
  return first_on_device(tensors) != nullptr;
}

StreamHandOff::StreamHandOff(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
  if (const at::Tensor* t = first_on_device(tensors_)) {
    device_ = t->device();
    produced_ = stream_mark_for(device_);
    done_ = stream_mark_for(device_);
    produced_->record_on_current_stream();
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

void StreamHandOff::consume(const std::vector<at::Tensor>& outputs) const {
  if (!done_) return;
  done_->make_current_stream_wait();
  const c10::Stream here = current_stream(device_);
  for (const auto& t : outputs) {
    if (t.defined() && t.device() == device_) t.record_stream(here);
  }
}

std::shared_ptr<Work> submit_ordered(std::string what, const std::vector<at::Tensor>& inputs,
                                     std::function<void()> fn,
                                     std::shared_ptr<const std::vector<at::Tensor>> outputs) {
  if (!StreamHandOff::needed(inputs)) return Engine::get().submit(std::move(what), std::move(fn));
  auto order = std::make_shared<StreamHandOff>(inputs);
  auto work =
      Engine::get().submit(std::move(what), [order, fn = std::move(fn)] { order->run(fn); });
  work->set_after_wait([order, outputs = std::move(outputs)] {
    if (outputs) {
      order->consume(*outputs);
    } else {
      order->consume();
    }
  });
  return work;
}

}  // namespace fluxmpi
