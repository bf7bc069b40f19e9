// Orders work between two streams of one device without blocking the host: an event recorded
// on one thread's current stream, which another thread's current stream then waits on. The
// gradient reducer uses it twice per bucket on a GPU: the engine's stream waits for backward's
// (the gradients and their pack) before the collective, and step()'s stream waits for the
// engine's (the collective and its unpack) before the optimizer reads the gradients.
// Device-generic (c10::Event): CUDA here; host tensors need no ordering, so none is made.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/comm_stream_order.h"

namespace fluxmpi {

// set_stream_waits / stream_waits (runtime/comm_stream_order.h): the GPU checks' negative
// control; off, every make_current_stream_wait below does nothing.

class StreamMark {
 public:
  explicit StreamMark(c10::Device device);
  // Records the event on this thread's current stream of the device.
  void record_on_current_stream();
  // This thread's current stream of the device waits for the last record (the host does not).
  void make_current_stream_wait() const;

 private:
  c10::Device device_;
  c10::Event event_;
};

// A mark for `device`, or null for a device without streams (the CPU).
std::shared_ptr<StreamMark> stream_mark_for(c10::Device device);

// On the engine thread, around CUDA work: the device's communication stream made current
// while it lives, when there is one (backend/select.h, comm_stream_of); otherwise nothing, and
// the work runs on the thread's current stream. The marks above then order the collective on
// the stream it runs on.
class CommStreamScope {
 public:
  explicit CommStreamScope(c10::Device device);

 private:
  std::optional<c10::StreamGuard> guard_;
};

// The ordering of device tensors handed to the engine thread (Iallreduce, Ibcast, the async
// row collectives, the c10d backend's calls), as ProcessGroupNCCL keeps it: made on the submitting
// thread, it records that thread's current stream (the producer's) for the first non-host tensor's
// device; run() on the engine makes the stream the work runs on wait for it, runs the work, records
// the end and marks every tensor as used on that stream (recordStream, so the caching allocator
// does not hand its memory out while the collective may still touch it); consume(), on the thread
// that waited for the work, makes its current stream wait for that end. Host tensors: no-ops.
class StreamHandOff {
 public:
  explicit StreamHandOff(std::vector<at::Tensor> tensors);
  // Whether `tensors` hold one on a device with streams: else a hand-off would do nothing,
  // and a caller on a hot host path can skip making one (and copying the list).
  static bool needed(const std::vector<at::Tensor>& tensors);
  void run(const std::function<void()>& work) const;
  void consume() const;
  // consume(), and marks `outputs` (tensors the work made on the engine's stream, such as a
  // row collective's results) as used on the waiter's current stream, so that the caching
  // allocator does not hand their memory to later engine work while the waiter reads them.
  void consume(const std::vector<at::Tensor>& outputs) const;

 private:
  std::vector<at::Tensor> tensors_;
  c10::Device device_{c10::kCPU};
  std::shared_ptr<StreamMark> produced_;
  std::shared_ptr<StreamMark> done_;
};

class Work;

// Queue `fn` on the engine, ordered against the caller's streams when `inputs` hold a device
// tensor (the StreamHandOff above): the engine's stream waits for the caller's current stream
// now, and the Work's wait() makes the waiter's current stream wait for the end and marks
// `*outputs` (filled by `fn`, when given) as used on it. Host tensors: a plain submit.
std::shared_ptr<Work> submit_ordered(std::string what, const std::vector<at::Tensor>& inputs,
                                     std::function<void()> fn,
                                     std::shared_ptr<const std::vector<at::Tensor>> outputs = {});

}  // namespace fluxmpi
